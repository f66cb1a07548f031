"""The end of an attempt run: writing what it settles to, and what the caller is told.

``execute`` and a takeover finish the same way: the recorded facts settle
to one COMPLETED receipt (built by ``_settled``), written with the
proven-write rule, and the caller sees the value ``_settled`` allows; a
zombie fenced out of its claim merges what it saw as evidence
(``_recovery``); a cancellation records UNKNOWN if it still can; a retry
that cannot start says that the earlier attempts ran.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

from dataoad._errors import ActionPersistenceError, ClaimFencedError, OutcomeNotRecordedError
from dataoad._events import EventKind, EventSink
from dataoad._evidence import settle
from dataoad._observing import Observation, protocol_metadata
from dataoad._proven import ProvenLedger
from dataoad._receipt import ActionReceipt, AttemptRecord, bounded_error, utc_now
from dataoad._records import VerificationObservation
from dataoad._recovery import merge_zombie_evidence
from dataoad._result import ActionResult
from dataoad._settled import completed, exposed_value, rebased_over_evidence
from dataoad._status import ActionStatus
from dataoad._verification import MISSING

__all__ = [
    "Execution",
    "complete",
    "earlier_attempts_ran",
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
    *,
    why: str | None = None,
) -> ActionPersistenceError:
    """A retry that could not start, after earlier attempts of the same call ran."""
    settlement = settle(finished, observations)
    cause = exc.__cause__
    if why is None:
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
    value = exposed_value(settlement, execution.value, observation)
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
    except asyncio.CancelledError:
        # The operation ran and what it did is known: the same conditional
        # write once more (refused if the first landed) before the
        # cancellation goes through, or the claim would keep neither its
        # outcome nor its evidence until a lease or an operator settles it.
        await store.record_best_effort(final)
        raise
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
            settle(recorded.attempt_records, recorded.observations), execution.value, observation
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
