"""Read-only recovery: reconcile, recover, release, settle a takeover, sweep stale claims.

None of these ever invokes the operation. What a verifier observed, and what
a fenced worker saw, is merged into whatever the ledger holds now, through
one loop (:func:`_merge_until_written`): losing a race with another writer
means re-reading and merging again, never overwriting what the other wrote.
The receipts merged are built by ``_settled``.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Awaitable, Callable
from typing import Any, Final

from dataoad._errors import (
    ActionNotFoundError,
    AuditNotRecordedError,
    ClaimFencedError,
    DataoadError,
    NothingInvokedError,
    RecoveryRefusedError,
)
from dataoad._events import EventKind, EventSink
from dataoad._evidence import Settlement, aggregate_attempts, attempt_evidence
from dataoad._leases import DEFAULT_LEASE, Tenure, take_over
from dataoad._observing import (
    Observation,
    VerifyFn,
    caller_metadata,
    observe,
    protocol_metadata,
    with_observation,
)
from dataoad._policy import RetryPolicy
from dataoad._proven import ProvenLedger, fenced
from dataoad._receipt import ActionReceipt, AttemptRecord, bound_text, utc_now
from dataoad._records import ObservationSource, VerificationObservation
from dataoad._result import ActionResult
from dataoad._settled import exposed_value, observation_merged, zombie_merged
from dataoad._status import ActionStatus, ClaimState
from dataoad._verification import MISSING

__all__ = [
    "MAX_MERGE_ROUNDS",
    "merge_observation",
    "merge_zombie_evidence",
    "observe_and_merge",
    "reconcile",
    "recover_pending",
    "recover_stale",
    "release",
    "settle_started",
]

#: How often a merge re-reads and re-merges after losing a race.
MAX_MERGE_ROUNDS: Final = 32

_TAKE_OVER: Final = "take_over"


async def _merge_until_written(
    store: ProvenLedger,
    current: ActionReceipt,
    propose: Callable[[ActionReceipt], ActionReceipt | None],
    *,
    best_effort: bool = False,
) -> tuple[ActionReceipt | None, ActionReceipt]:
    """Write ``propose(current)`` over ``current``; after a lost race, over what won it.

    Returns what was written (None: ``propose`` had nothing new, or
    MAX_MERGE_ROUNDS races in a row were lost) and the receipt last read.
    ``propose`` may raise to refuse what it was shown. With ``best_effort``
    a ledger error ends the merge, written None, instead of raising.
    """
    for _ in range(MAX_MERGE_ROUNDS):
        proposed = propose(current)
        if proposed is None:
            return None, current
        try:
            newer = await store.merge(proposed, current)
        except Exception:
            if not best_effort:
                raise
            return None, current
        if newer is None:
            return proposed, current
        current = newer  # lost a race with another writer: merge into what it wrote
    return None, current


async def reconcile(
    store: ProvenLedger, action_id: str, verify: VerifyFn, events: EventSink
) -> ActionResult[Any]:
    """Settle a completed UNKNOWN receipt; refuse a PENDING one."""
    receipt = await store.read(action_id)
    if receipt.claim_state is ClaimState.PENDING:
        raise RecoveryRefusedError(
            f"action {action_id} is still PENDING and may be in flight; make sure its "
            "worker has stopped, then use recover_pending",
            receipt=receipt,
        )
    if receipt.final_status is not ActionStatus.UNKNOWN:
        return ActionResult(receipt, replayed=True)  # settled already: the verifier is not asked
    return await observe_and_merge(
        store, receipt, verify, ObservationSource.RECONCILE, events, replayed=False
    )


async def recover_pending(
    store: ProvenLedger, action_id: str, verify: VerifyFn, events: EventSink
) -> ActionResult[Any]:
    """Complete a stranded PENDING claim with attempts from read-only evidence."""
    receipt = await store.read(action_id)
    if receipt.claim_state is ClaimState.COMPLETED:
        if receipt.final_status is not ActionStatus.UNKNOWN:
            return ActionResult(receipt, replayed=True)  # settled already: nothing to verify
        source = ObservationSource.RECONCILE
    elif receipt.attempts == 0:
        raise RecoveryRefusedError(
            f"action {action_id} never started an attempt; nothing can have happened, "
            "so use release_unstarted instead",
            receipt=receipt,
        )
    else:
        source = ObservationSource.RECOVER
    return await observe_and_merge(store, receipt, verify, source, events, replayed=False)


async def release(store: ProvenLedger, action_id: str, events: EventSink) -> None:
    """Remove a PENDING claim that never started an attempt; refuse anything else."""
    receipt = await store.read(action_id)
    if receipt.claim_state is not ClaimState.PENDING or receipt.attempts != 0:
        raise RecoveryRefusedError(
            f"action {action_id} has started {receipt.attempts} attempt(s) or is completed; "
            "only a claim that never invoked its operation can be released",
            receipt=receipt,
        )
    await store.release(receipt, events)


async def observe_and_merge(
    store: ProvenLedger,
    receipt: ActionReceipt,
    verify: VerifyFn,
    source: ObservationSource,
    events: EventSink,
    *,
    replayed: bool,
) -> ActionResult[Any]:
    """Ask the verifier once, then merge its observation into the stored receipt.

    A verifier that gives no usable answer (it raised, timed out, returned
    something else) proves nothing: a completed receipt is left as it is
    (the VERIFICATION_FAILED event says why); a PENDING claim is still
    settled, as UNKNOWN.
    """
    observation = await observe(verify, receipt, source, receipt.attempts, events)
    if observation.result is None and receipt.claim_state is ClaimState.COMPLETED:
        return ActionResult(receipt, replayed=replayed)
    return await merge_observation(store, receipt, observation, source, events, replayed=replayed)


async def merge_observation(
    store: ProvenLedger,
    receipt: ActionReceipt,
    observation: Observation | None,
    source: ObservationSource,
    events: EventSink,
    *,
    replayed: bool,
    method: str = "recover_pending",
    taken_over: bool = False,
) -> ActionResult[Any]:
    """Complete ``receipt`` with ``observation`` (None: with the facts it has) merged in.

    ``method`` names the verb in the recovery record of a PENDING claim.
    """
    record = None if observation is None else observation.record
    settled: list[Settlement] = []

    def propose(current: ActionReceipt) -> ActionReceipt:
        if taken_over and fenced(current, receipt):
            # Taken over again while verifying: the claim is another's now.
            raise ClaimFencedError(
                f"action {receipt.action_id} was taken over by {current.owner!r} while this "
                "runner verified it; nothing was invoked",
                receipt=current,
                operation_invoked=False,
            )
        if current.attempts != receipt.attempts:
            raise RecoveryRefusedError(
                f"action {receipt.action_id} started another attempt during recovery; "
                "its worker is still active, so this observation is out of date",
                receipt=current,
            )
        proposed, settlement = observation_merged(current, record, source, method)
        settled.append(settlement)
        return proposed

    written, current = await _merge_until_written(store, receipt, propose)
    if written is None:
        raise NothingInvokedError(
            f"the verification of action {receipt.action_id} lost {MAX_MERGE_ROUNDS} races "
            "in a row; nothing was invoked",
            receipt=current,
            operation_invoked=False,
        )
    events.emit(
        EventKind.RECOVERED if source is ObservationSource.RECOVER else EventKind.RECONCILED,
        written,
    )
    # A replay never exposes a value, even a freshly recovered one: callers
    # must be able to rely on "replayed" meaning "no value". Nothing of the
    # operation's own is here, so only a correlated recovered value can show.
    value = MISSING if replayed else exposed_value(settled[-1], MISSING, observation)
    return ActionResult(written, replayed=replayed, value=value, taken_over=taken_over)


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
    written, current = await _merge_until_written(
        store,
        stored,
        lambda current: zombie_merged(current, finished, observation),
        best_effort=True,
    )
    if written is None:
        return current
    events.emit(EventKind.ZOMBIE_EVIDENCE_MERGED, written, attempt=finished.number)
    return written


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
    Records it could not append are reported once the sweep is done
    (``AuditNotRecordedError`` carrying the results).
    """
    stale_claims = await store.stale_claims(limit)  # this runner's namespace only
    sweeper = dataclasses.replace(tenure, lease=tenure.lease or DEFAULT_LEASE)
    results: list[ActionResult[Any]] = []
    unrecorded: list[AuditNotRecordedError] = []

    async def noted(action_id: str, outcome: str) -> None:
        # A record that could not be appended stops neither the sweep nor
        # the report of what it settled: the caller hears of both at the end.
        if note is not None:
            try:
                await note(action_id, outcome)
            except AuditNotRecordedError as exc:
                unrecorded.append(exc)

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
            await noted(taken.action_id, "released (never started)")
            continue
        assert isinstance(settled, ActionResult)
        results.append(settled)
        await noted(settled.receipt.action_id, settled.status.value)
    if unrecorded:
        first = unrecorded[0]
        raise AuditNotRecordedError(
            f"recover_stale settled or released what it found, but {len(unrecorded)} "
            f"operator record(s) could not be appended to the audit; the first: {first}",
            record=first.record,
            result=results,
        ) from first
    return results
