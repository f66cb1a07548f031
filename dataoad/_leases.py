"""Leases, the runner's side: holding a claim (renewing it) and taking one over.

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
from typing import Final

from dataoad._clock import Clock, SystemClock
from dataoad._events import EventKind, EventSink
from dataoad._proven import ProvenLedger
from dataoad._receipt import ActionReceipt, bound_text, utc_now

__all__ = [
    "DEFAULT_LEASE",
    "RENEWAL_TASK_NAME",
    "Tenure",
    "default_owner",
    "keep_lease",
    "take_over",
]

#: Seconds a claim stays owned without renewal, unless the runner says otherwise.
DEFAULT_LEASE: Final = 30.0
#: The name of the task that renews a lease while an attempt runs.
RENEWAL_TASK_NAME: Final = "dataoad-lease-renewal"
#: Renewals per lease: a lease survives two lost renewals in a row.
RENEWALS_PER_LEASE: Final = 3


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


class keep_lease:
    """Renew ``held``'s lease in the background while the block runs (the attempt).

    On the system clock a timer starts the renewals once a third of the
    lease has passed, so the many attempts that end sooner cost no task; a
    clock of a test's own drives a renewal task from the start (its sleeps
    are how the state machines step renewals). A class, not a generator:
    every attempt enters it, and the generator-based context manager cost
    a few microseconds of each.
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
        self._timer: asyncio.TimerHandle | None = None

    async def __aenter__(self) -> None:
        lease = self._tenure.lease
        if lease is None:
            return
        interval = lease / RENEWALS_PER_LEASE
        if type(self._tenure.clock) is SystemClock:
            self._timer = asyncio.get_running_loop().call_later(interval, self._start, False)
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
            self._timer.cancel()
        for task in self._tasks:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task


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
