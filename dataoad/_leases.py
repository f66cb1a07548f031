"""Leases, the runner's side: holding a claim (renewing it, and proving an
attempt that begins late still holds it) and taking one over.

The ledger judges expiry by its own clock and applies every change of owner
as one conditional write (``_ledger_rules``). Here a runner keeps its lease
alive while an attempt runs and takes over a claim whose lease ran out,
under the next fence. What the new owner may then do is decided elsewhere:

* no attempt started: nothing can have happened, so it invokes as the new
  owner, like any first caller (``_attempts``);
* an attempt started: the effect may have happened, so only read-only
  evidence settles it, and a new attempt follows only when the policy and
  retry-safe evidence allow it (``_recovery.settle_started``).

A worker whose claim was taken over (a zombie) can no longer write it; what
it observed is merged into the receipt as evidence (``_recovery``).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import os
import secrets
import socket
import threading
from typing import Final

from dataoad._clock import Clock, SystemClock
from dataoad._errors import (
    ActionNotFoundError,
    ActionPersistenceError,
    ClaimFencedError,
    NothingInvokedError,
)
from dataoad._events import EventKind, EventSink
from dataoad._proven import ProvenLedger
from dataoad._receipt import ActionReceipt, bound_text, utc_now

__all__ = [
    "DEFAULT_LEASE",
    "RENEWAL_TASK_NAME",
    "Tenure",
    "default_owner",
    "keep_lease",
    "refused_if_late",
    "renewed_for_the_call",
    "take_over",
    "young_enough",
]

#: Seconds a claim stays owned without renewal, unless the runner says otherwise.
DEFAULT_LEASE: Final = 30.0
#: The name of the task that renews a lease while an attempt runs.
RENEWAL_TASK_NAME: Final = "dataoad-lease-renewal"
#: Renewals per lease: a lease survives two lost renewals in a row.
RENEWALS_PER_LEASE: Final = 3
#: How early the shared timer may start a first renewal: asyncio runs a timer
#: up to its clock's resolution early, and a renewal a millisecond early is
#: harmless where one missed is not.
_EARLY: Final = 0.001


@dataclasses.dataclass(frozen=True, slots=True)
class Tenure:
    """How a runner holds its claims: under which name, for how long, on which clock."""

    owner: str
    #: Seconds without renewal before a claim may be taken over; None: no lease.
    lease: float | None
    clock: Clock


def default_owner() -> str:
    """``host:pid:random``, unique per runner, readable in receipts."""
    host = socket.gethostname()[:64] or "host"
    return bound_text(f"{host}:{os.getpid()}:{secrets.token_hex(4)}")


class _FirstRenewals:
    """One timer, per event loop and renewal interval, for every attempt's first renewal.

    Attempts of one interval fall due in the order they began, so the
    first one waiting is always the earliest: a timer armed for it, and
    re-armed for the next when it fires, serves them all. An attempt that
    ends only leaves the dict (the timer armed for it fires once for
    nothing). Per attempt that is a dict entry in and out, not a timer
    handle made, pushed onto the loop's heap and cancelled.
    """

    __slots__ = ("_armed", "_due", "_interval", "_loop")

    def __init__(self, loop: asyncio.AbstractEventLoop, interval: float) -> None:
        self._loop = loop
        self._interval = interval
        self._due: dict[keep_lease, float] = {}
        self._armed = False

    def add(self, keeper: keep_lease) -> None:
        """Start ``keeper``'s renewals one interval from now, unless it leaves first."""
        due = self._loop.time() + self._interval
        self._due[keeper] = due
        if not self._armed:
            self._armed = True
            self._loop.call_at(due, self._fire)

    def discard(self, keeper: keep_lease) -> None:
        """``keeper``'s attempt ended: no renewal is due for it any more."""
        self._due.pop(keeper, None)

    def _fire(self) -> None:
        self._armed = False
        now = self._loop.time() + _EARLY
        due: list[keep_lease] = []
        for keeper, when in self._due.items():
            if when > now:
                self._armed = True
                self._loop.call_at(when, self._fire)
                break
            due.append(keeper)
        for keeper in due:
            del self._due[keeper]
            keeper._start(False)


class _Timers(threading.local):
    """This thread's running loop and its shared first-renewal timers, by interval."""

    def __init__(self) -> None:
        self.loop: asyncio.AbstractEventLoop | None = None
        self.by_interval: dict[float, _FirstRenewals] = {}


_TIMERS: Final = _Timers()


def _first_renewals(loop: asyncio.AbstractEventLoop, interval: float) -> _FirstRenewals:
    timers = _TIMERS
    if timers.loop is not loop:
        # Another loop in this thread (asyncio.run again): the old one's
        # timers stay with the attempts that hold them.
        timers.loop = loop
        timers.by_interval = {}
    shared = timers.by_interval.get(interval)
    if shared is None:
        shared = timers.by_interval[interval] = _FirstRenewals(loop, interval)
    return shared


class keep_lease:
    """Renew ``held``'s lease in the background while the block runs (the attempt).

    On the system clock the renewals start once a third of the lease has
    passed, on a timer the loop's attempts share (``_FirstRenewals``), so
    the many attempts that end sooner cost neither a task nor a timer of
    their own; a clock of a test's own drives a renewal task from the start
    (its sleeps are how the state machines step renewals). A class, not a
    generator: every attempt enters it, and the generator-based context
    manager cost a few microseconds of each.
    """

    __slots__ = ("_events", "_held", "_store", "_tasks", "_tenure", "_timer")

    def __init__(
        self, store: ProvenLedger, held: ActionReceipt, tenure: Tenure, events: EventSink
    ) -> None:
        self._store = store
        self._held = held
        self._tenure = tenure
        self._events = events
        self._tasks: list[asyncio.Task[None]] = []
        self._timer: _FirstRenewals | None = None

    async def __aenter__(self) -> None:
        lease = self._tenure.lease
        if lease is None:
            return
        interval = lease / RENEWALS_PER_LEASE
        if type(self._tenure.clock) is SystemClock:
            self._timer = _first_renewals(asyncio.get_running_loop(), interval)
            self._timer.add(self)
        else:
            self._start(True)

    def _start(self, wait_first: bool) -> None:
        name = f"{RENEWAL_TASK_NAME}:{self._held.action_id}"
        self._tasks.append(asyncio.create_task(self._renewing(wait_first), name=name))

    async def _renewing(self, wait_first: bool) -> None:
        lease = self._tenure.lease
        assert lease is not None
        interval = lease / RENEWALS_PER_LEASE
        while True:
            if wait_first:
                await self._tenure.clock.sleep(interval)
            wait_first = True
            kept = await self._store.renew(self._held, lease)
            if kept is None:
                continue  # one lost renewal is within the lease's margin
            if not kept:
                # Taken over or completed: the outcome write will say which.
                self._events.emit(EventKind.FENCED, self._held, level=logging.WARNING)
                return

    async def __aexit__(self, *exc_info: object) -> None:
        if self._timer is not None:
            self._timer.discard(self)
        if not self._tasks:
            return
        for task in self._tasks:
            task.cancel()
        # ``asyncio.wait``, not ``await task``: a cancellation of the caller
        # arriving while the renewals end is the caller's, and must reach it
        # (awaiting a cancelled task, the two look alike and one would be
        # swallowed: the call would go on, even to another attempt).
        await asyncio.wait(self._tasks)
        for task in self._tasks:
            if not task.cancelled():
                task.exception()  # a renewal's failure is not the attempt's


def young_enough(tenure: Tenure, since: float) -> bool:
    """Whether an attempt whose counting write was sent at ``since`` may begin without renewing.

    ``since`` is read by the runner's clock before the write is sent, so
    before the ledger stamped its lease: the time since is never
    underestimated. Renewals start a third of a lease after an attempt
    begins; an attempt that begins later than that (its loop or process
    stalled: a blocking observer, a pause) may already have lost its claim
    to a takeover, and invoking then would run the operation beside the new
    owner's attempt. Such an attempt must first be ``renewed_for_the_call``.
    """
    lease = tenure.lease
    return lease is None or tenure.clock.monotonic() - since < lease / RENEWALS_PER_LEASE


async def renewed_for_the_call(
    store: ProvenLedger, held: ActionReceipt, tenure: Tenure, events: EventSink
) -> bool | None:
    """Renew a late attempt's lease under its fencing token before it is invoked.

    True if a renewal was kept and answered within a third of the lease
    (the claim is this runner's for a renewal interval at least); False if
    refused (the claim passed on or was settled); None if no renewal could
    be proven in time. Only True lets the operation run. A pause after this
    still acts late: only a provider that refuses a stale fencing token
    (``current_attempt``) closes that.
    """
    lease = tenure.lease
    assert lease is not None
    for _ in range(RENEWALS_PER_LEASE):
        since = tenure.clock.monotonic()
        kept = await store.renew(held, lease)
        if kept is False:
            events.emit(EventKind.FENCED, held, level=logging.WARNING)
            return False
        if kept and young_enough(tenure, since):
            return True
    return None


async def refused_if_late(
    store: ProvenLedger,
    durable: ActionReceipt,
    tenure: Tenure,
    events: EventSink,
    sent: float,
    number: int,
) -> ActionPersistenceError | None:
    """None if attempt ``number`` may be invoked now, else why not (nothing invoked).

    An attempt that begins a third of its lease after its counting write was
    sent renews first (``_leases.young_enough``): invoking on a lease that
    may have run out could run the operation beside a new owner's attempt.
    """
    if young_enough(tenure, sent):
        return None
    held = await renewed_for_the_call(store, durable, tenure, events)
    if held is True:
        return None
    late = (
        f"attempt {number} of action {durable.action_id} ({durable.action_name!r}) began a "
        "third of its lease or more after the write that counted it (the event loop or "
        "process stalled: a blocking observer, a pause), "
    )
    if held is None:
        return NothingInvokedError(
            late + "and its lease could not be renewed in time. It was NOT invoked; the claim "
            "stays PENDING with this attempt counted, to be settled read-only by a takeover "
            "or recover_pending",
            receipt=durable,
            operation_invoked=False,
        )
    current = None
    with contextlib.suppress(ActionPersistenceError, ActionNotFoundError):
        current = await store.read(durable.action_id)
    if current is None:
        where = "the claim could not be read back"
    elif current.is_pending:
        where = f"the claim passed to {current.owner!r} (fencing token {current.fencing_token})"
    else:
        status = "" if current.final_status is None else f" {current.final_status.value}"
        where = f"the claim was settled{status} by {current.owner!r}"
    return ClaimFencedError(
        late + f"and its lease renewal was refused: {where}. It was NOT invoked",
        receipt=durable if current is None else current,
        operation_invoked=False,
    )


async def take_over(
    store: ProvenLedger, existing: ActionReceipt, tenure: Tenure, events: EventSink
) -> ActionReceipt | None:
    """``existing``, now held by this runner under the next fence; None if its lease holds."""
    if tenure.lease is None or not existing.is_pending or existing.lease_expires_at is None:
        return None
    proposed = existing.evolve(
        owner=tenure.owner,
        fencing_token=existing.fencing_token + 1,
        version=existing.version + 1,
        updated_at=utc_now(),
    )
    if not await store.take_over(proposed, tenure.lease):
        return None
    events.emit(
        EventKind.TAKEN_OVER,
        proposed,
        level=logging.WARNING,
        previous_owner=existing.owner,
        attempts=existing.attempts,
    )
    return proposed
