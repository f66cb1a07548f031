"""The end of an attempt run: the receipt it settles to, and what the caller sees.

``execute`` and a takeover finish the same way: the recorded facts settle
to one COMPLETED receipt (built only here), written with the proven-write
rule; a zombie fenced out of its claim merges what it saw as evidence; a
cancellation records UNKNOWN if it still can; a retry that cannot start
says that the earlier attempts ran.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

from dataoad._errors import ActionPersistenceError, ClaimFencedError, OutcomeNotRecordedError
from dataoad._events import EventKind, EventSink
from dataoad._evidence import Settlement, recovered_value_correlated, settle
from dataoad._leases import merge_zombie_evidence, rebased_over_evidence
from dataoad._observing import Observation, protocol_metadata
from dataoad._proven import ProvenLedger
from dataoad._receipt import ActionReceipt, AttemptRecord, bounded_error, utc_now
from dataoad._records import VerificationObservation
from dataoad._result import ActionResult
from dataoad._status import ActionStatus, ClaimState
from dataoad._verification import MISSING

__all__ = [
    "Execution",
    "complete",
    "completed",
    "earlier_attempts_ran",
    "exposed_value",
    "fenced_after_running",
    "record_cancelled",
]


class Execution(NamedTuple):
    """What one invocation of the operation established (a named tuple: built once per attempt)."""

    status: ActionStatus
    error: str | None = None
    retryable: bool = False
    value: object = MISSING


def earlier_attempts_ran(
    exc: ActionPersistenceError,
    action_id: str,
    finished: Sequence[AttemptRecord],
    observations: Sequence[VerificationObservation],
    base_metadata: Mapping[str, Any],
) -> ActionPersistenceError:
    """A retry that could not start, after earlier attempts of the same call ran."""
    settlement = settle(finished, observations)
    cause = exc.__cause__
    why = "the claim changed concurrently" if cause is None else bounded_error(cause)
    return OutcomeNotRecordedError(
        f"attempt {len(finished) + 1} of action {action_id} could "
        f"not be started ({why}), so it was not invoked; but {len(finished)} earlier "
        f"attempt(s) of this call WERE invoked ({settlement.final_status.value}): do not repeat "
        "the operation. Re-read the ledger; a PENDING claim needs read-only recover_pending",
        receipt=exc.receipt,
        operation_invoked=True,
        observed_status=settlement.final_status,
        observed_metadata=protocol_metadata(base_metadata, observations, settlement),
    )


def completed(
    durable: ActionReceipt,
    records: Sequence[AttemptRecord],
    observations: Sequence[VerificationObservation],
    base_metadata: Mapping[str, Any],
    error: str | None,
) -> tuple[ActionReceipt, Settlement]:
    """The COMPLETED receipt the recorded facts settle to (the one place it is built)."""
    settlement = settle(records, observations)
    final = durable.evolve(
        claim_state=ClaimState.COMPLETED,
        attempt_records=tuple(records),
        execution_status=settlement.execution_status,
        verification_status=settlement.verification_status,
        final_status=settlement.final_status,
        provider_request_id=settlement.provider_request_id,
        error=error,
        metadata=protocol_metadata(base_metadata, observations, settlement),
        version=durable.version + 1,
        updated_at=utc_now(),
    )
    return final, settlement


def exposed_value(
    settlement: Settlement, execution: Execution, observation: Observation | None
) -> object:
    """The value the caller may see: the operation's own, or a correlated recovered one.

    The operation's own value is tied to the retained provider request id
    only when that id is none or its own attempt's confirmation named it: a
    value from one charge is never shown under another charge's id.
    """
    if settlement.final_status is not ActionStatus.CONFIRMED:
        return MISSING
    conflict = settlement.provider_request_id_conflict
    result = None if observation is None else observation.result
    own_id = (
        result.provider_request_id
        if result is not None
        and observation is not None
        and observation.status is ActionStatus.CONFIRMED
        else None
    )
    if (
        execution.value is not MISSING
        and not conflict
        and settlement.provider_request_id in (None, own_id)
    ):
        return execution.value
    if (
        result is not None
        and result.has_value
        and recovered_value_correlated(
            settlement.final_status,
            conflict,
            result.provider_request_id,
            settlement.provider_request_id,
        )
    ):
        return result.value
    return MISSING


async def complete(
    store: ProvenLedger,
    durable: ActionReceipt,
    records: list[AttemptRecord],
    observations: Sequence[VerificationObservation],
    base_metadata: Mapping[str, Any],
    execution: Execution,
    observation: Observation | None,
    events: EventSink,
    *,
    taken_over: bool,
) -> ActionResult[Any]:
    final, settlement = completed(durable, records, observations, base_metadata, execution.error)
    value = exposed_value(settlement, execution, observation)
    try:
        recorded = await store.record_outcome(
            final,
            durable,
            events,
            observed_status=settlement.final_status,
            observed_metadata=final.metadata,
            value=value,
            has_value=value is not MISSING,
            # A fenced worker's evidence merged under this owner is folded in.
            rebase=rebased_over_evidence,
        )
    except ClaimFencedError as exc:
        if exc.receipt is None:
            raise
        raise await fenced_after_running(
            store,
            exc,
            exc.receipt,
            records[-1],
            None if observation is None else observation.record,
            events,
        ) from None
    if recorded is not final:
        # A fenced worker's evidence was folded in (a second confirmation,
        # another provider id): the same rule decides again over all of it.
        value = exposed_value(
            settle(recorded.attempt_records, recorded.observations), execution, observation
        )
    events.emit(EventKind.COMPLETED, recorded)
    return ActionResult(recorded, value=value, taken_over=taken_over)


async def fenced_after_running(
    store: ProvenLedger,
    exc: ClaimFencedError,
    stored: ActionReceipt,
    finished: AttemptRecord,
    observation: VerificationObservation | None,
    events: EventSink,
    *,
    observed_status: ActionStatus | None = None,
    observed_metadata: Mapping[str, Any] | None = None,
) -> ClaimFencedError:
    """The error a zombie raises, once its attempt is merged into the receipt as evidence."""
    merged = await merge_zombie_evidence(store, stored, finished, observation, events)
    return ClaimFencedError(
        str(exc)
        if exc.operation_invoked
        else f"action {stored.action_id} was taken over by {stored.owner!r} (its lease had run "
        f"out) after attempt {finished.number} of this call WAS invoked: do not repeat it. "
        "What this worker saw was merged into the receipt as evidence",
        receipt=merged,
        operation_invoked=True,
        observed_status=exc.observed_status or observed_status,
        observed_metadata=exc.observed_metadata or observed_metadata,
        value_available=exc.value_available,
        observed_value=exc.observed_value,
    )


async def record_cancelled(
    store: ProvenLedger,
    durable: ActionReceipt,
    records: list[AttemptRecord],
    observations: Sequence[VerificationObservation],
    base_metadata: Mapping[str, Any],
) -> None:
    records = list(records)
    records[-1] = dataclasses.replace(
        records[-1],
        execution_status=ActionStatus.UNKNOWN,
        error="CancelledError: cancelled after the operation was invoked",
        retry_decision="stop",
        finished_at=utc_now(),
    )
    final, _ = completed(durable, records, observations, base_metadata, records[-1].error)
    await store.record_best_effort(final)
