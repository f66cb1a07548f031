"""Read-only settlement: reconcile, recover and release, and merging observations.

None of these ever invokes the operation. A verifier's observation is merged
into whatever the ledger holds now: losing a race with another writer means
re-reading and merging again, never overwriting what the other wrote.
"""

from __future__ import annotations

from typing import Any, Final

from dataoad._errors import ClaimFencedError, NothingInvokedError, RecoveryRefusedError
from dataoad._events import EventKind, EventSink
from dataoad._evidence import Settlement, recovered_value_correlated, settle
from dataoad._observing import (
    Observation,
    VerifyFn,
    caller_metadata,
    observe,
    protocol_metadata,
    with_observation,
)
from dataoad._proven import ProvenLedger, fenced
from dataoad._receipt import ActionReceipt, utc_now
from dataoad._records import ObservationSource, RecoveryRecord, VerificationObservation
from dataoad._result import ActionResult
from dataoad._status import ActionStatus, ClaimState
from dataoad._verification import MISSING

__all__ = [
    "MAX_MERGE_ROUNDS",
    "merge_observation",
    "observe_and_merge",
    "reconcile",
    "recover_pending",
    "release",
]

#: How often a reconciliation re-reads and re-merges after losing a race.
MAX_MERGE_ROUNDS: Final = 32


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
        return ActionResult(receipt)
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
            return ActionResult(receipt)
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


def _merged(
    current: ActionReceipt,
    observation_record: VerificationObservation | None,
    source: ObservationSource,
    method: str,
) -> tuple[ActionReceipt, Settlement]:
    """``current`` completed with one more observation (if any) merged in."""
    observations = current.observations
    if observation_record is not None:
        observations = with_observation(current.attempt_records, observations, observation_record)
    settlement = settle(current.attempt_records, observations)
    recovery = None
    if source is ObservationSource.RECOVER and current.claim_state is ClaimState.PENDING:
        recovery = RecoveryRecord(method, utc_now(), current.attempts)
    merged = current.evolve(
        claim_state=ClaimState.COMPLETED,
        execution_status=settlement.execution_status,
        verification_status=settlement.verification_status,
        final_status=settlement.final_status,
        provider_request_id=settlement.provider_request_id,
        metadata=protocol_metadata(caller_metadata(current), observations, settlement, recovery),
        version=current.version + 1,
        updated_at=utc_now(),
    )
    return merged, settlement


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
    current = receipt
    for _ in range(MAX_MERGE_ROUNDS):
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
        proposed, settlement = _merged(
            current, None if observation is None else observation.record, source, method
        )
        newer = await store.merge(proposed, current)
        if newer is not None:
            current = newer  # lost a race with another writer: merge into what it wrote
            continue
        events.emit(
            EventKind.RECOVERED if source is ObservationSource.RECOVER else EventKind.RECONCILED,
            proposed,
        )
        value: object = MISSING
        result = None if observation is None else observation.result
        # A replay never exposes a value, even a freshly recovered one:
        # callers must be able to rely on "replayed" meaning "no value".
        if (
            not replayed
            and result is not None
            and result.has_value
            and recovered_value_correlated(
                settlement.final_status,
                settlement.provider_request_id_conflict,
                result.provider_request_id,
                settlement.provider_request_id,
            )
        ):
            value = result.value
        return ActionResult(proposed, replayed=replayed, value=value, taken_over=taken_over)
    raise NothingInvokedError(
        f"the verification of action {receipt.action_id} lost {MAX_MERGE_ROUNDS} races in "
        "a row; nothing was invoked",
        receipt=current,
        operation_invoked=False,
    )
