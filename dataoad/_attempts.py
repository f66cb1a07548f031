"""Claiming a key and running its attempts: steps 2 to 7 of the protocol.

1. Claim the key with one atomic conditional insert that already counts
   attempt 1 (the fused claim): the attempt is durable *before* the
   operation is invoked, in the same commit as the claim. The ledger looks
   the key up first and writes nothing when it is held, so a replay is one
   read: a completed claim replays, a pending one is in progress, a
   different request or provider reference is a conflict.
2. Invoke once. Classify by evidence: DefinitiveFailure is FAILED, any other
   exception is UNKNOWN, a plain return is CONFIRMED without a verifier and
   UNKNOWN pending read-back with one.
3. Retry only when the policy and trustworthy evidence allow it; a retry
   durably counts its attempt before invoking (proven write).
4. Record the outcome with one proven write (``_completing``); if it cannot
   be proven, raise OutcomeNotRecordedError: the claim stays as a barrier
   against repeats.
"""

from __future__ import annotations

import asyncio
import logging
import warnings
from collections.abc import Callable, Mapping, Sequence
from typing import Any, NamedTuple

from dataoad._action_ids import new_action_id
from dataoad._completing import (
    complete,
    earlier_attempts_ran,
    fenced_after_running,
    record_cancelled,
)
from dataoad._current import running_attempt
from dataoad._errors import (
    ActionInProgressError,
    ActionPersistenceError,
    ClaimFencedError,
    IdempotencyConflictError,
)
from dataoad._events import EventKind, EventSink
from dataoad._evidence import (
    aggregate_attempts,
    attempt_evidence,
    settle,
)
from dataoad._invoking import Acting, invoke
from dataoad._leases import Tenure, keep_lease, refused_if_late, take_over, young_enough
from dataoad._observing import (
    VerifyFn,
    observe,
    protocol_metadata,
    with_observation,
)
from dataoad._policy import UNKNOWN_RETRY_WARNING, RetryPolicy
from dataoad._proven import ProvenLedger
from dataoad._receipt import ActionReceipt, AttemptRecord, build_receipt, utc_now
from dataoad._records import ObservationSource, VerificationObservation
from dataoad._recovery import observe_and_merge, settle_started
from dataoad._result import ActionResult
from dataoad._retiring import expire_if_due
from dataoad._settled import start_rebased_over_evidence
from dataoad._status import ActionStatus, ClaimState

__all__ = ["Call", "execute_once", "run_attempts"]


class Call(NamedTuple):
    """One ``execute`` call's validated arguments.

    A named tuple, not a frozen dataclass: just as immutable, and built in
    half a microsecond instead of one and a half (a frozen dataclass sets
    each field through ``object.__setattr__``), once per call.
    """

    action_name: str
    operation: Callable[[], Any]
    idempotency_key: str
    digest: str
    provider_reference: str | None
    verify: VerifyFn | None
    risk: str | None
    metadata: Mapping[str, Any]
    policy: RetryPolicy
    #: Seconds after which a definitive receipt of the key no longer replays.
    expires_after: float | None = None


async def execute_once(
    store: ProvenLedger, call: Call, events: EventSink, tenure: Tenure
) -> ActionResult[Any]:
    """One pass of ``execute``: replay, refuse, take over, or claim and run."""
    sent = _sent_at(tenure)
    claimed, created = await store.claim(_fused_claim(store, call, tenure), tenure.lease)
    if not created and call.expires_after is not None:
        current = await expire_if_due(store, claimed, call.expires_after, events)
        if current is None:
            # The key is free now. A receipt made meanwhile by another caller
            # is newer than this call, so it is answered, never expired again.
            sent = _sent_at(tenure)
            claimed, created = await store.claim(_fused_claim(store, call, tenure), tenure.lease)
        else:
            claimed = current
    if not created:
        return await _answer_existing(store, claimed, call, events, tenure)
    events.emit(EventKind.CLAIMED, claimed)
    events.emit(EventKind.ATTEMPT_STARTED, claimed)
    return await run_attempts(
        store, claimed, call.operation, call.verify, call.policy, events, tenure, started=sent
    )


def _sent_at(tenure: Tenure) -> float:
    """When, by the runner's clock, a write that grants a lease is sent (0 without leases)."""
    return 0.0 if tenure.lease is None else tenure.clock.monotonic()


def _fused_claim(store: ProvenLedger, call: Call, tenure: Tenure) -> ActionReceipt:
    """A new claim with attempt 1 already counted: claim and attempt start in one write."""
    now = utc_now()
    return build_receipt(
        {
            "action_id": new_action_id(),
            "action_name": call.action_name,
            "idempotency_key": call.idempotency_key,
            "request_hash": call.digest,
            "provider_reference": call.provider_reference,
            "risk": call.risk,
            "claim_state": ClaimState.PENDING,
            "attempts": 1,
            "execution_status": None,
            "verification_status": None,
            "final_status": None,
            "provider_request_id": None,
            "error": None,
            "metadata": call.metadata,
            "attempt_records": (AttemptRecord(number=1, started_at=now),),
            "version": 1,
            "created_at": now,
            "updated_at": now,
            "owner": tenure.owner,
            "lease_expires_at": None,  # the ledger's to stamp
            "fencing_token": 1,
            "namespace": store.namespace,
            "retired_at": None,
            "stored_at": None,
            "operator_records": (),
        }
    )


async def _answer_existing(
    store: ProvenLedger, existing: ActionReceipt, call: Call, events: EventSink, tenure: Tenure
) -> ActionResult[Any]:
    same_request = existing.request_hash == call.digest
    same_reference = existing.provider_reference == call.provider_reference
    if not same_request or not same_reference:
        events.emit(EventKind.CONFLICT, existing, level=logging.WARNING)
    if not same_request:
        raise IdempotencyConflictError(
            f"idempotency key {existing.idempotency_key!r} of {existing.action_name!r} is "
            f"already claimed by action {existing.action_id} for a different request",
            receipt=existing,
        )
    if not same_reference:
        raise IdempotencyConflictError(
            f"idempotency key {existing.idempotency_key!r} of {existing.action_name!r} is "
            f"already claimed by action {existing.action_id} with provider reference "
            f"{existing.provider_reference!r}, not {call.provider_reference!r}",
            receipt=existing,
        )
    if existing.claim_state is ClaimState.PENDING:
        taken = await take_over(store, existing, tenure, events)
        if taken is not None:
            return await _run_taken_over(store, taken, call, events, tenure)
        events.emit(EventKind.IN_PROGRESS, existing)
        raise ActionInProgressError(
            f"action {existing.action_id} ({existing.action_name!r}, key "
            f"{existing.idempotency_key!r}) is still in progress; it was not invoked again",
            receipt=existing,
        )
    events.emit(EventKind.REPLAYED, existing)
    if existing.final_status is ActionStatus.UNKNOWN and call.verify is not None:
        return await observe_and_merge(
            store, existing, call.verify, ObservationSource.RECONCILE, events, replayed=True
        )
    return ActionResult(existing, replayed=True)


async def _run_taken_over(
    store: ProvenLedger, taken: ActionReceipt, call: Call, events: EventSink, tenure: Tenure
) -> ActionResult[Any]:
    """A claim this call took over: invoke if nothing started, else settle read-only."""
    if taken.attempts == 0:
        return await run_attempts(
            store, taken, call.operation, call.verify, call.policy, events, tenure, taken_over=True
        )
    settled = await settle_started(store, taken, call.verify, call.policy, events)
    if isinstance(settled, ActionResult):
        return settled
    return await run_attempts(
        store, settled, call.operation, call.verify, call.policy, events, tenure, taken_over=True
    )


async def run_attempts(
    store: ProvenLedger,
    claimed: ActionReceipt,
    operation: Callable[[], Any],
    verify: VerifyFn | None,
    policy: RetryPolicy,
    events: EventSink,
    tenure: Tenure,
    *,
    taken_over: bool = False,
    started: float | None = None,
) -> ActionResult[Any]:
    """Run attempts of a claim this caller holds until the policy stops, then record.

    ``started``: the claim's last attempt was counted by this call's own
    write (the fused claim), sent at this time by the runner's clock, and
    has not run yet, so it runs without another start.
    """
    durable = claimed
    records = list(claimed.attempt_records)
    observations = claimed.observations
    base_metadata = claimed.metadata
    # The verifier's record of the last attempt that ran, for a fenced retry.
    last_observation: VerificationObservation | None = None
    # This call's first attempt: a failure to start it means nothing of this call ran.
    first_number = claimed.attempts if started is not None else claimed.attempts + 1
    while True:
        if started is not None:
            sent = started
            started = None  # attempt 1 was counted with the claim (the fused claim)
            number = durable.attempts
        else:
            number = durable.attempts + 1
            records.append(AttemptRecord(number=number, started_at=utc_now()))
            sent = _sent_at(tenure)
            durable = await _start(
                store,
                durable,
                records,
                observations,
                base_metadata,
                events,
                tenure,
                first=number == first_number,
                last_observation=last_observation,
            )
            # What was stored: a fenced worker's evidence may have been folded in.
            records[:] = durable.attempt_records
            observations = durable.observations
            events.emit(EventKind.ATTEMPT_STARTED, durable)

        # The check is a comparison; only a late attempt pays for a coroutine.
        late = (
            None
            if young_enough(tenure, sent)
            else await refused_if_late(store, durable, tenure, events, sent, number)
        )
        if late is not None:
            if number == first_number:
                raise late  # nothing of this call ran
            raise earlier_attempts_ran(
                late,
                durable.action_id,
                records[:-1],
                observations,
                base_metadata,
                why="it began too late in its lease and could not prove it held the claim",
            ) from late
        acting = Acting()
        try:
            async with keep_lease(store, durable, tenure, events):
                with running_attempt(durable):
                    execution = await invoke(
                        operation,
                        verifying=verify is not None,
                        store=store,
                        held=durable,
                        tenure=tenure,
                        events=events,
                        sent=sent,
                        acting=acting,
                    )
                acting.may_act = False  # the call ended: what it started is over
                observation = None
                if verify is not None and execution.status is ActionStatus.UNKNOWN:
                    observation = await observe(
                        verify, durable, ObservationSource.EXECUTE, number, events
                    )
        except asyncio.CancelledError:
            if acting.may_act:
                # Cancelled during the call: a thread or request it started
                # may still reach the provider after any read at this fence.
                # Completed now, a verifier could find the charge absent, the
                # receipt FAILED and the key free while the charge still
                # lands. The claim stays PENDING (attempt counted, never run
                # again), as a crashed worker's; once its lease runs out a
                # takeover settles it read-only under the next fencing
                # token, which a fencing provider holds a late request to.
                raise
            # The call had ended (a verifier or the lease was being awaited):
            # record UNKNOWN if we still can, then let the cancellation through.
            await record_cancelled(store, durable, records, observations, base_metadata)
            raise

        last_observation = None if observation is None else observation.record
        if observation is not None:
            observations = with_observation(records, observations, observation.record)
        verification_status = None if observation is None else observation.status
        confirmed_id = (
            observation.result.provider_request_id
            if observation is not None
            and observation.result is not None
            and observation.status is ActionStatus.CONFIRMED
            else None
        )
        evidence = [attempt_evidence(r.execution_status, r.verification_status) for r in records]
        evidence[-1] = attempt_evidence(execution.status, verification_status)
        status = aggregate_attempts(evidence)
        assert status is not None
        if execution.status is ActionStatus.FAILED:
            retryable = execution.retryable
        else:
            # FAILED through read-back is fenced, retry-safe absence by definition.
            retryable = verification_status is ActionStatus.FAILED
        retry = policy.should_retry(status, number, retryable)
        records[-1] = AttemptRecord(
            number=number,
            started_at=records[-1].started_at,
            execution_status=execution.status,
            verification_status=verification_status,
            error=execution.error,
            provider_request_id=confirmed_id,
            retry_decision="retry" if retry else "stop",
            finished_at=utc_now(),
        )
        if retry:
            if status is ActionStatus.UNKNOWN:
                # Point at the caller of execute (run_attempts < execute_once < the
                # runner's look < _waiting.until_the_holder_finishes < execute).
                warnings.warn(UNKNOWN_RETRY_WARNING, RuntimeWarning, stacklevel=6)
            events.emit(
                EventKind.RETRYING,
                durable,
                attempt_status=status.value,
                level=logging.WARNING if status is ActionStatus.UNKNOWN else logging.INFO,
            )
            continue
        return await complete(
            store,
            durable,
            records,
            observations,
            base_metadata,
            execution,
            observation,
            events,
            taken_over=taken_over,
        )


async def _start(
    store: ProvenLedger,
    durable: ActionReceipt,
    records: list[AttemptRecord],
    observations: Sequence[VerificationObservation],
    base_metadata: Mapping[str, Any],
    events: EventSink,
    tenure: Tenure,
    *,
    first: bool,
    last_observation: VerificationObservation | None,
) -> ActionReceipt:
    """Count the attempt ``records[-1]`` durably, or raise saying what of this call ran.

    ``first``: no attempt of this call ran before it.
    """
    try:
        return await store.start_attempt(
            durable.evolve(
                attempts=records[-1].number,
                attempt_records=tuple(records),
                metadata=protocol_metadata(base_metadata, observations, None),
                version=durable.version + 1,
                updated_at=records[-1].started_at,
            ),
            durable,
            events,
            tenure.lease,
            # A fenced worker's evidence merged under this holder is folded in,
            # unless it takes away what allowed this attempt.
            rebase=start_rebased_over_evidence,
        )
    except ActionPersistenceError as exc:
        if first:
            raise  # nothing of this call ran
        if isinstance(exc, ClaimFencedError) and exc.receipt is not None:
            ran = settle(records[:-1], observations)
            raise await fenced_after_running(
                store,
                exc,
                exc.receipt,
                records[-2],
                last_observation,
                events,
                observed_status=ran.final_status,
                observed_metadata=protocol_metadata(base_metadata, observations, ran),
            ) from exc
        raise earlier_attempts_ran(
            exc, durable.action_id, records[:-1], observations, base_metadata
        ) from (exc.__cause__ or exc)
