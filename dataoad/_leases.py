"""Leases and fencing, the runner's side: taking over, renewing, and what a zombie keeps.

The ledger judges expiry by its own clock and applies every change of owner
as one conditional write (``_ledger_rules``). Here the runner decides what a
new owner may do with a claim it took over:

* no attempt started: nothing can have happened, so it invokes as the new
  owner, like any first caller;
* an attempt started: the effect may have happened, so only read-only
  evidence settles it (the verifier's, bound to the provider reference), and
  a new attempt follows only when the policy and retry-safe evidence allow
  it, exactly as after a normal attempt. Without a verifier it is UNKNOWN.

A worker whose claim was taken over (a zombie) can no longer write it; what
it observed is merged into the receipt as evidence, never over it.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import os
import secrets
import socket
from collections.abc import Awaitable, Callable
from typing import Any, Final

from dataoad._clock import Clock, SystemClock
from dataoad._errors import ActionNotFoundError, DataoadError
from dataoad._events import EventKind, EventSink
from dataoad._evidence import aggregate_attempts, attempt_evidence, settle
from dataoad._observing import (
    VerifyFn,
    caller_metadata,
    observe,
    protocol_metadata,
    with_observation,
)
from dataoad._policy import RetryPolicy
from dataoad._proven import ProvenLedger
from dataoad._receipt import ActionReceipt, AttemptRecord, bound_text, utc_now
from dataoad._records import ObservationSource, VerificationObservation
from dataoad._result import ActionResult
from dataoad._settling import MAX_MERGE_ROUNDS, merge_observation
from dataoad._status import ActionStatus, ClaimState

__all__ = [
    "DEFAULT_LEASE",
    "RENEWAL_TASK_NAME",
    "Tenure",
    "default_owner",
    "keep_lease",
    "merge_zombie_evidence",
    "rebased_over_evidence",
    "start_rebased_over_evidence",
    "recover_stale",
    "settle_started",
    "take_over",
]

#: Seconds a claim stays owned without renewal, unless the runner says otherwise.
DEFAULT_LEASE: Final = 30.0
#: The name of the task that renews a lease while an attempt runs.
RENEWAL_TASK_NAME: Final = "dataoad-lease-renewal"
#: Renewals per lease: a lease survives two lost renewals in a row.
RENEWALS_PER_LEASE: Final = 3

_TAKE_OVER: Final = "take_over"


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


async def settle_started(
    store: ProvenLedger,
    taken: ActionReceipt,
    verify: VerifyFn | None,
    policy: RetryPolicy,
    events: EventSink,
) -> ActionResult[Any] | ActionReceipt:
    """Settle a taken-over claim whose attempt started, read-only.

    Returns the completed result, or, when the verifier's bound evidence is
    retry-safe absence and the policy allows another attempt, the receipt to
    run that attempt from (its stranded attempt finished as verified absent,
    not yet written).
    """
    source = ObservationSource.RECOVER
    if verify is None:
        return await merge_observation(
            store, taken, None, source, events, replayed=False, method=_TAKE_OVER, taken_over=True
        )
    observation = await observe(verify, taken, source, taken.attempts, events)
    if observation.status is ActionStatus.FAILED:
        records = list(taken.attempt_records)
        stranded = records[-1]
        records[-1] = dataclasses.replace(
            stranded,
            # The execution was never seen; the verifier proved it absent.
            execution_status=stranded.execution_status or ActionStatus.UNKNOWN,
            verification_status=ActionStatus.FAILED,
            retry_decision="retry",
            finished_at=stranded.finished_at or utc_now(),
        )
        status = aggregate_attempts(
            [attempt_evidence(r.execution_status, r.verification_status) for r in records]
        )
        if status is not None and policy.should_retry(status, taken.attempts, True):
            observations = with_observation(records, taken.observations, observation.record)
            return taken.evolve(
                attempt_records=tuple(records),
                metadata=protocol_metadata(caller_metadata(taken), observations, None),
            )
    return await merge_observation(
        store,
        taken,
        observation,
        source,
        events,
        replayed=False,
        method=_TAKE_OVER,
        taken_over=True,
    )


def _zombie_merged(
    current: ActionReceipt,
    finished: AttemptRecord,
    observation: VerificationObservation | None,
) -> ActionReceipt | None:
    """``current`` with a fenced worker's facts about its attempt merged in; None if nothing new."""
    if not 1 <= finished.number <= len(current.attempt_records):
        return None  # attempts are counted before invocation, so this cannot be ours
    records = list(current.attempt_records)
    stored = records[finished.number - 1]
    execution = stored.execution_status
    seen = finished.execution_status
    # What the zombie saw directly outranks "never seen" and "ambiguous"; a
    # success it saw is evidence that the effect happened, whatever else says.
    if seen is not None and (
        execution in (None, ActionStatus.UNKNOWN) or seen is ActionStatus.CONFIRMED
    ):
        execution = seen
    records[finished.number - 1] = dataclasses.replace(
        stored,
        execution_status=execution,
        verification_status=stored.verification_status or finished.verification_status,
        error=stored.error or finished.error,
        provider_request_id=stored.provider_request_id or finished.provider_request_id,
        finished_at=stored.finished_at or finished.finished_at,
    )
    observations = current.observations
    if observation is not None and all(
        dataclasses.replace(o, number=None) != dataclasses.replace(observation, number=None)
        for o in observations
    ):
        observations = with_observation(records, observations, observation)
    if tuple(records) == current.attempt_records and observations == current.observations:
        return None
    changes: dict[str, Any] = {}
    settlement = None
    if current.claim_state is ClaimState.COMPLETED:
        settlement = settle(records, observations)
        changes = {
            "execution_status": settlement.execution_status,
            "verification_status": settlement.verification_status,
            "final_status": settlement.final_status,
            "provider_request_id": settlement.provider_request_id,
        }
    return current.evolve(
        attempt_records=tuple(records),
        # caller_metadata keeps the recovery record: only observation keys are rederived.
        metadata=protocol_metadata(caller_metadata(current), observations, settlement),
        version=current.version + 1,
        updated_at=utc_now(),
        **changes,
    )


def rebased_over_evidence(
    final: ActionReceipt, durable: ActionReceipt, stored: ActionReceipt
) -> ActionReceipt | None:
    """The owner's ``final`` (written over ``durable``) rebuilt over ``stored``.

    Only when ``stored`` is ``durable`` with nothing but a fenced worker's
    evidence merged in (its attempt records and observations, a later
    version): the claim is still the owner's, under the same fence, with
    the same attempts. That evidence is folded into the owner's outcome as
    ``merge_zombie_evidence`` would fold it into a stored receipt, the
    settlement re-derived from all of it, at the version after ``stored``.
    None when ``stored`` changed in any other way (the owner's write is then
    refused as before).
    """
    # Everything but the evidence must be ``durable``'s to the letter: the
    # last comparison holds the holder, the fence, the attempts, the claim's
    # state and the retirement to that (equality covers every such field).
    if (
        stored.version <= durable.version
        or len(stored.attempt_records) != len(durable.attempt_records)
        or caller_metadata(stored) != caller_metadata(durable)
        or stored.evolve(
            attempt_records=durable.attempt_records,
            metadata=durable.metadata,
            version=durable.version,
            updated_at=durable.updated_at,
        )
        != durable
    ):
        return None
    rebased = final
    seen = {dataclasses.replace(o, number=None) for o in durable.observations}
    added = [o for o in stored.observations if dataclasses.replace(o, number=None) not in seen]
    for old, new in zip(durable.attempt_records, stored.attempt_records, strict=True):
        if old != new:
            rebased = _zombie_merged(rebased, new, None) or rebased
    for observation in added:
        record = stored.attempt_records[min(observation.attempt, len(stored.attempt_records)) - 1]
        rebased = _zombie_merged(rebased, record, observation) or rebased
    return rebased.evolve(version=stored.version + 1, updated_at=utc_now())


def start_rebased_over_evidence(
    proposed: ActionReceipt, durable: ActionReceipt, stored: ActionReceipt
) -> ActionReceipt | None:
    """An attempt start rebuilt over a fenced worker's evidence, as ``rebased_over_evidence``.

    None also when that evidence takes away what allowed the retry: once
    the earlier attempts no longer all prove FAILED (the fenced worker saw
    its call succeed, say), the ledger holds evidence that the effect may
    have happened, and no new attempt may start over it. The start is then
    refused, nothing is invoked, and the claim settles read-only.
    """
    rebased = rebased_over_evidence(proposed, durable, stored)
    if rebased is None:
        return None
    earlier = [
        attempt_evidence(r.execution_status, r.verification_status)
        for r in rebased.attempt_records[:-1]
    ]
    if aggregate_attempts(earlier) is not ActionStatus.FAILED:
        return None
    return rebased


async def merge_zombie_evidence(
    store: ProvenLedger,
    stored: ActionReceipt,
    finished: AttemptRecord,
    observation: VerificationObservation | None,
    events: EventSink,
) -> ActionReceipt:
    """Merge a fenced worker's attempt into the receipt as it is now; returns what is stored.

    Best effort against concurrent writers (re-read and re-merge); a ledger
    error leaves the evidence in the ClaimFencedError the caller raises.
    """
    current = stored
    for _ in range(MAX_MERGE_ROUNDS):
        proposed = _zombie_merged(current, finished, observation)
        if proposed is None:
            return current
        try:
            newer = await store.merge(proposed, current)
        except Exception:
            return current
        if newer is None:
            events.emit(EventKind.ZOMBIE_EVIDENCE_MERGED, proposed, attempt=finished.number)
            return proposed
        current = newer
    return current


async def _take_over_stale(
    store: ProvenLedger, stale: ActionReceipt, tenure: Tenure, events: EventSink
) -> ActionReceipt | None:
    """Take ``stale`` over; after a refusal, again from what is stored when only evidence
    was merged into it meanwhile (a fenced zombie's outcome: a new version, the same
    holder, the same lease), so a claim stale when the sweep began is not left behind."""
    current = stale
    for _ in range(MAX_MERGE_ROUNDS):
        taken = await take_over(store, current, tenure, events)
        if taken is not None:
            return taken
        try:
            stored = await store.read(current.action_id)
        except ActionNotFoundError:
            return None  # released meanwhile
        if not (
            stored.is_pending
            and stored.version != current.version
            and stored.fencing_token == current.fencing_token
            and stored.lease_expires_at == current.lease_expires_at
        ):
            return None  # renewed, completed or taken over: not the sweep's any more
        current = stored
    return None


async def recover_stale(
    store: ProvenLedger,
    verify: VerifyFn | None,
    tenure: Tenure,
    events: EventSink,
    limit: int,
    note: Callable[[str, str], Awaitable[None]] | None = None,
) -> list[ActionResult[Any]]:
    """Settle up to ``limit`` claims whose lease ran out, never invoking anything.

    Each is first taken over (so a worker that renewed meanwhile keeps it);
    one that never started an attempt is then released, one that did is
    settled read-only like any takeover. Returns the settled results;
    ``note(action_id, outcome)`` hears of each released or settled claim.
    """
    stale_claims = await store.stale_claims(limit)  # this runner's namespace only
    sweeper = dataclasses.replace(tenure, lease=tenure.lease or DEFAULT_LEASE)
    results: list[ActionResult[Any]] = []
    for stale in stale_claims:
        try:
            taken = await _take_over_stale(store, stale, sweeper, events)
            if taken is None:
                continue  # renewed, completed, released or taken over meanwhile
            settled: Any = None
            if taken.attempts == 0:
                await store.release(taken, events)
            else:
                # The sweep has no operation to run, so its policy never retries.
                settled = await settle_started(store, taken, verify, RetryPolicy(), events)
        except DataoadError as exc:
            events.emit(
                EventKind.STALE_CLAIM_NOT_SETTLED,
                stale,
                level=logging.ERROR,
                error=exc,
                reason=bound_text(str(exc)),
            )
            continue
        # Outside the try: an audit that could not be appended is not a
        # claim that could not be settled.
        if settled is None:
            if note is not None:
                await note(taken.action_id, "released (never started)")
            continue
        assert isinstance(settled, ActionResult)
        results.append(settled)
        if note is not None:
            await note(settled.receipt.action_id, settled.status.value)
    return results
