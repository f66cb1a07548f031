"""Asking a verifier, and turning its answer into a stored observation.

The verifier is called (off the loop when it is sync), its answer judged by
``classify_verification``, and recorded as a typed
:class:`~dataoad._records.VerificationObservation`. An answer no ledger can
store counts as no evidence at all (UNKNOWN), so it can never leave an
invoked outcome unrecordable. The receipt's reserved metadata keys are
derived from the observations here, in one function.
"""

from __future__ import annotations

import asyncio
import copy
import dataclasses
import inspect
import logging
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any, Final, cast

from dataoad._blocking import call_blocking, caller_cancelled, is_async_callable
from dataoad._canonical import json_text
from dataoad._errors import InvalidArgumentError
from dataoad._events import EventKind, EventSink
from dataoad._evidence import Settlement, keep_observations
from dataoad._frozen import FrozenDict, freeze, thaw
from dataoad._receipt import ActionReceipt, AttemptRecord, bound_text, bounded_error, utc_now
from dataoad._records import (
    OBSERVATION_KEYS,
    ObservationSource,
    RecoveryRecord,
    VerificationObservation,
)
from dataoad._status import ActionStatus
from dataoad._verification import (
    MAX_IDENTIFIER_LENGTH,
    VerificationResult,
    check_stored_text,
    classify_verification,
)

__all__ = [
    "MAX_DETAILS_CHARS",
    "Observation",
    "VerifyFn",
    "caller_metadata",
    "observe",
    "protocol_metadata",
    "resolve_verifier",
    "with_observation",
]

#: Verifier details larger than this (as JSON) are not stored.
MAX_DETAILS_CHARS: Final = 4000

VerifyFn = Callable[[ActionReceipt], Awaitable[object]]


@dataclasses.dataclass(frozen=True, slots=True)
class Observation:
    """One verifier call: its raw result (if usable), and its stored record."""

    result: VerificationResult | None
    record: VerificationObservation

    @property
    def status(self) -> ActionStatus:
        """What the runner judged the answer to be worth."""
        return self.record.status


class _NoAnswerInTime(TimeoutError):
    """The runner's own time limit ran out (its message is the runner's, safe to store)."""


def resolve_verifier(verifier: object, time_limit: float | None = None) -> VerifyFn:
    """Turn a verifier object or callable into one async function, or raise.

    With ``time_limit`` (seconds), a verifier that has not answered by then
    raises TimeoutError, which ``observe`` records as no evidence (UNKNOWN).
    """
    method = getattr(verifier, "verify", None)
    target = method if callable(method) else verifier
    if not callable(target):
        raise InvalidArgumentError(
            "verifier must have a callable verify(receipt) method or be a callable, "
            f"not {type(verifier).__qualname__}"
        )
    fn = cast(Callable[[ActionReceipt], object], target)
    runs_on_loop = is_async_callable(fn)

    async def call(receipt: ActionReceipt) -> object:
        # A sync verifier does blocking I/O: it runs on a worker thread, of
        # the pool even for a SyncActionRunner, so that its time limit frees
        # the caller (a verifier only reads: it needs no thread of its own).
        outcome = (
            fn(receipt) if runs_on_loop else await call_blocking(lambda: fn(receipt), on_pool=True)
        )
        if inspect.isawaitable(outcome):
            outcome = await outcome
        return outcome

    if time_limit is None:
        return call

    async def bounded(receipt: ActionReceipt) -> object:
        scope = asyncio.timeout(time_limit)
        try:
            async with scope:
                return await call(receipt)
        except TimeoutError:
            if not scope.expired():
                raise  # the verifier's own TimeoutError
            # A sync verifier's thread finishes on its own: it only reads.
            raise _NoAnswerInTime(f"no answer within {time_limit:g} s") from None

    return bounded


def _kept_details(details: Mapping[str, Any] | None) -> Mapping[str, Any] | None:
    """Details as stored: small ones as given, large ones replaced by a marker."""
    if details is None:
        return None
    try:
        size = len(json_text(details))
    except (TypeError, ValueError):
        return details  # not JSON after all: _storable refuses the whole record
    # Details come from the adapter; keep them only while they stay small.
    return details if size <= MAX_DETAILS_CHARS else {"truncated": True}


def _record(
    source: ObservationSource,
    attempt: int,
    status: ActionStatus,
    result: VerificationResult | None,
    problem: str | None,
) -> VerificationObservation:
    error = None if problem is None else bound_text(problem)
    now = utc_now()
    if result is None:
        return VerificationObservation(source, attempt, status, now, error=error)
    details = _kept_details(result.details)
    return VerificationObservation(
        source,
        attempt,
        status,
        now,
        claimed=result.outcome,
        health=result.health,
        conclusive_absence=result.conclusive_absence,
        retry_safe=result.retry_safe,
        verified_provider_reference=result.verified_provider_reference,
        provider_request_id=result.provider_request_id,
        reason=None if result.reason is None else bound_text(result.reason),
        details=details,
        error=error,
    )


def _storable(record: VerificationObservation) -> bool:
    """Whether every ledger can store ``record`` as JSON text (valid JSON, valid UTF-8).

    The encoder escapes NUL and other control characters, so only values that
    are not JSON at all, or text that is not UTF-8, are refused here.
    """
    try:
        # The ledgers' own encoder: what passes here is what they will write.
        text = json_text(record.to_json())
        text.encode("utf-8")
    except (TypeError, ValueError):  # UnicodeEncodeError is a ValueError
        return False
    return True


def _storable_identifiers(result: VerificationResult) -> bool:
    """Whether the result's identifiers can go into a receipt's own columns on every ledger."""
    for name in ("verified_provider_reference", "provider_request_id"):
        try:
            check_stored_text(
                name, getattr(result, name), limit=MAX_IDENTIFIER_LENGTH, optional=True
            )
        except InvalidArgumentError:
            return False  # only a result built around its own checks gets here
    return True


async def observe(
    verify: VerifyFn,
    receipt: ActionReceipt,
    source: ObservationSource,
    attempt: int,
    events: EventSink,
) -> Observation:
    """Ask the verifier about ``receipt`` and judge its answer; never raises an Exception."""
    try:
        result = await verify(_handed_over(receipt))
    except (Exception, asyncio.CancelledError) as exc:
        if not isinstance(exc, Exception) and caller_cancelled():
            raise  # the caller's own cancellation; a verifier's own is no answer
        # Only the type is stored: the message may carry a provider's values
        # (a URL, a response body). The event logs it, bounded.
        raised = f"verifier raised {type(exc).__name__}"
        said = bounded_error(exc)
        if isinstance(exc, _NoAnswerInTime):
            # The runner's own words, safe to store; the log names no private class.
            raised = said = f"verifier raised TimeoutError: {exc}"
        return _no_answer(events, receipt, source, attempt, raised, said)
    if type(result) is not VerificationResult:
        invalid = f"verifier returned {type(result).__qualname__}, not a VerificationResult"
        return _no_answer(events, receipt, source, attempt, invalid, invalid)
    try:
        return _judged(result, receipt, source, attempt, events)
    except Exception as exc:
        # Its fields were changed after it was made (object.__setattr__), to values
        # the judgement cannot even compare: no evidence, never an escape.
        invalid = (
            "verifier returned a VerificationResult whose fields could not be judged "
            f"({type(exc).__name__})"
        )
        return _no_answer(events, receipt, source, attempt, invalid, invalid)


def _handed_over(receipt: ActionReceipt) -> ActionReceipt:
    """A copy of ``receipt`` all the way down, for the verifier to keep or change.

    The verifier cannot change the runner's snapshot, nor through it what an
    in-memory ledger holds or what the outcome will write, even with
    ``object.__setattr__`` or ``dict.__setitem__`` on its frozen parts.
    """
    return receipt.evolve(
        metadata=thaw(receipt.metadata),
        attempt_records=tuple(dataclasses.replace(r) for r in receipt.attempt_records),
        operator_records=tuple(dataclasses.replace(o) for o in receipt.operator_records),
    )


def _judged(
    result: VerificationResult,
    receipt: ActionReceipt,
    source: ObservationSource,
    attempt: int,
    events: EventSink,
) -> Observation:
    # Judged and kept as a copy of its own, details too: the verifier may still
    # hold the result and write into it later (dict.__setitem__ past FrozenDict).
    result = copy.copy(result)
    if result.details is not None:
        object.__setattr__(result, "details", freeze(thaw(result.details)))
    status = classify_verification(result, receipt.provider_reference)
    problem: str | None = None
    if (
        result.outcome is not ActionStatus.UNKNOWN
        and result.verified_provider_reference != receipt.provider_reference
    ):
        problem = (
            f"verified_provider_reference {result.verified_provider_reference!r} does not "
            f"match the receipt's provider_reference {receipt.provider_reference!r}"
        )
    record = _record(source, attempt, status, result, problem)
    if not _storable(record) or not _storable_identifiers(result):
        # Whatever it was, an answer no ledger can store must not leave an
        # invoked outcome unrecordable: it counts as no evidence at all.
        unstorable = "verifier returned a VerificationResult that no ledger can store"
        return _no_answer(events, receipt, source, attempt, unstorable, unstorable)
    # Made anew, it must pass its own checks: fields changed after it was made
    # (object.__setattr__) that only those checks refuse are no evidence either,
    # and the copy kept is one the verifier no longer holds.
    details = None if result.details is None else thaw(result.details)
    return Observation(dataclasses.replace(result, details=details), record)


def _no_answer(
    events: EventSink,
    receipt: ActionReceipt,
    source: ObservationSource,
    attempt: int,
    stored: str,
    said: str,
) -> Observation:
    """No evidence: an UNKNOWN record saying ``stored``; ``said`` goes to the log only."""
    events.emit(
        EventKind.VERIFICATION_FAILED,
        receipt,
        level=logging.WARNING,
        source=source.value,
        said=said,
    )
    return Observation(None, _record(source, attempt, ActionStatus.UNKNOWN, None, stored))


def with_observation(
    attempts: Sequence[AttemptRecord],
    previous: Sequence[VerificationObservation],
    record: VerificationObservation,
) -> tuple[VerificationObservation, ...]:
    """``previous`` plus ``record``, numbered, kept bounded without changing what they prove."""
    # Receipts written before observations were numbered count as numbered 1..n.
    last = 0
    if previous:
        last = previous[-1].number if previous[-1].number is not None else len(previous)
    numbered = dataclasses.replace(record, number=last + 1)
    return keep_observations(attempts, (*previous, numbered))


def caller_metadata(receipt: ActionReceipt) -> Mapping[str, Any]:
    """The receipt's metadata without the keys observations derive."""
    return {k: v for k, v in receipt.metadata.items() if k not in OBSERVATION_KEYS}


def protocol_metadata(
    base: Mapping[str, Any],
    observations: Sequence[VerificationObservation],
    settlement: Settlement | None,
    recovery: RecoveryRecord | None = None,
) -> FrozenDict:
    """Caller metadata plus the reserved protocol keys derived from the facts."""
    if not observations and recovery is None:
        # Nothing derived to add: the caller's metadata, frozen (a frozen one is kept as is).
        return freeze(base)  # type: ignore[no-any-return]
    metadata = dict(base)
    if observations:
        stored = tuple(o.to_json() for o in observations)
        last = observations[-1]
        metadata["verification_observations"] = stored
        metadata["verification"] = stored[-1]
        metadata["verification_observation_count"] = (
            last.number if last.number is not None else len(observations)
        )
    if settlement is not None and observations:
        metadata["verification_conflict"] = settlement.verification_conflict
        metadata["provider_request_ids"] = settlement.provider_request_ids
        metadata["provider_request_id_conflict"] = settlement.provider_request_id_conflict
    if recovery is not None:
        metadata["recovery"] = recovery.to_json()
    return freeze(metadata)  # type: ignore[no-any-return]
