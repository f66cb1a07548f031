"""ActionRunner: claims, attempts, evidence and read-only reconciliation.

The protocol, in the order the runner follows it:

1. Validate every argument and hash the request, before touching the ledger.
2. One read: a completed claim replays, a pending one is in progress, a
   different request or provider reference is a conflict.
3. Claim the key with one atomic conditional insert.
4. Durably count the attempt *before* invoking the operation. If the write's
   acknowledgement is lost, read back and continue only when the ledger shows
   exactly the transition requested; otherwise do not invoke.
5. Invoke once. Classify by evidence: DefinitiveFailure is FAILED, any other
   exception is UNKNOWN, a plain return is CONFIRMED without a verifier and
   UNKNOWN pending read-back with one.
6. Retry only when the policy and trustworthy evidence allow it.
7. Record the outcome with one conditional write. If that write fails, raise
   ActionPersistenceError: the claim stays as a barrier against repeats.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import inspect
import json
import logging
import math
import uuid
import warnings
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, Final, TypeVar, cast, overload

from dataoad._blocking import call_blocking, call_maybe_async, is_async_callable
from dataoad._canonical import request_hash, validate_metadata, validate_request
from dataoad._clock import Clock, SystemClock
from dataoad._errors import (
    ActionInProgressError,
    ActionNotFoundError,
    ActionPersistenceError,
    IdempotencyConflictError,
    InvalidArgumentError,
    NothingInvokedError,
    OutcomeNotRecordedError,
    RecoveryRefusedError,
)
from dataoad._evidence import (
    Settlement,
    aggregate_attempts,
    attempt_evidence,
    keep_observations,
    recovered_value_correlated,
    settle,
)
from dataoad._failure import DefinitiveFailure
from dataoad._frozen import FrozenDict, freeze
from dataoad._ledger import Ledger
from dataoad._log import transition
from dataoad._policy import UNKNOWN_RETRY_WARNING, RetryPolicy
from dataoad._receipt import (
    ActionReceipt,
    AttemptRecord,
    bound_text,
    bounded_error,
    utc_now,
)
from dataoad._result import ActionResult
from dataoad._status import ActionStatus, ClaimState
from dataoad._verification import (
    MAX_IDENTIFIER_LENGTH,
    MISSING,
    AnyVerifier,
    VerificationResult,
    check_stored_text,
    classify_verification,
)

__all__ = ["ActionRunner"]

T = TypeVar("T")

#: How often a reconciliation re-reads and re-merges after losing a race.
MAX_MERGE_ROUNDS: Final = 32
#: Longest accepted ``wait_in_progress``, in seconds.
MAX_WAIT_IN_PROGRESS: Final = 3600.0
#: First and longest pause between looks at a claim held by another caller.
WAIT_FIRST_DELAY: Final = 0.005
WAIT_MAX_DELAY: Final = 0.25
#: Verifier details larger than this (as JSON) are not stored.
MAX_DETAILS_CHARS: Final = 4000

_LEDGER_METHODS: Final = ("claim", "get", "find", "start_attempt", "record", "release")

VerifyFn = Callable[[ActionReceipt], Awaitable[object]]


@dataclasses.dataclass(frozen=True, slots=True)
class _Execution:
    """What one invocation of the operation established."""

    status: ActionStatus
    error: str | None = None
    retryable: bool = False
    value: object = MISSING


@dataclasses.dataclass(frozen=True, slots=True)
class _Observation:
    """One verifier call: its raw result (if any), its worth, and its stored record."""

    result: VerificationResult | None
    status: ActionStatus
    record: Mapping[str, Any]


#: Longest accepted identity strings, in characters. Every backend must be able
#: to index ``(action_name, idempotency_key)`` in one unique key: PostgreSQL's
#: B-tree entries stop at about 2,700 bytes, and 4 * (128 + 512) stays under it.
MAX_TEXT_ARG_LENGTH: Final[dict[str, int]] = {
    "action_name": 128,
    "idempotency_key": 512,
    "provider_reference": MAX_IDENTIFIER_LENGTH,
    "risk": 128,
    "action_id": 128,
}


def _check_text_arg(name: str, value: object, *, optional: bool = False) -> None:
    check_stored_text(name, value, limit=MAX_TEXT_ARG_LENGTH[name], optional=optional)


def _resolve_verifier(verifier: object) -> VerifyFn:
    """Turn a verifier object or callable into one async function, or raise."""
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
        # A sync verifier does blocking I/O: it runs on a worker thread.
        outcome = fn(receipt) if runs_on_loop else await call_blocking(lambda: fn(receipt))
        if inspect.isawaitable(outcome):
            outcome = await outcome
        return outcome

    return call


def _json_text(value: object) -> str:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False, default=str)


def _observation_record(
    source: str,
    attempt: int,
    status: ActionStatus,
    result: VerificationResult | None,
    problem: str | None,
) -> FrozenDict:
    record: dict[str, Any] = {
        "source": source,
        "attempt": attempt,
        "status": status.value,
        "observed_at": utc_now().isoformat(),
    }
    if result is not None:
        record.update(
            claimed=result.outcome.value,
            health=result.health.value,
            conclusive_absence=result.conclusive_absence,
            retry_safe=result.retry_safe,
            verified_provider_reference=result.verified_provider_reference,
            provider_request_id=result.provider_request_id,
        )
        if result.reason is not None:
            record["reason"] = bound_text(result.reason)
        if result.details is not None:
            # Details come from the adapter; keep them only while they stay small.
            text = _json_text(result.details)
            record["details"] = (
                result.details if len(text) <= MAX_DETAILS_CHARS else {"truncated": True}
            )
    else:
        record["provider_request_id"] = None
    if problem is not None:
        record["error"] = bound_text(problem)
    return freeze(record)  # type: ignore[no-any-return]


def _storable(record: Mapping[str, Any]) -> bool:
    """Whether every ledger can store ``record`` as JSON text (no NUL, valid UTF-8)."""
    try:
        text = _json_text(record)
        text.encode("utf-8")
    except (TypeError, ValueError):  # UnicodeEncodeError is a ValueError
        return False
    return "\x00" not in text


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


def _protocol_metadata(
    base: Mapping[str, Any],
    observations: tuple[Mapping[str, Any], ...],
    settlement: Settlement | None,
    recovery: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """Caller metadata plus the reserved protocol keys derived from the facts."""
    metadata = dict(base)
    if observations:
        metadata["verification_observations"] = observations
        metadata["verification"] = observations[-1]
        metadata["verification_observation_count"] = observations[-1].get(
            "number", len(observations)
        )
    if settlement is not None and observations:
        metadata["verification_conflict"] = settlement.verification_conflict
        metadata["provider_request_ids"] = settlement.provider_request_ids
        metadata["provider_request_id_conflict"] = settlement.provider_request_id_conflict
    if recovery is not None:
        metadata["recovery"] = recovery
    return metadata


def _observations_of(receipt: ActionReceipt) -> tuple[Mapping[str, Any], ...]:
    return tuple(receipt.metadata.get("verification_observations", ()))


def _with_observation(
    attempts: tuple[AttemptRecord, ...] | list[AttemptRecord],
    previous: tuple[Mapping[str, Any], ...],
    record: Mapping[str, Any],
) -> tuple[Mapping[str, Any], ...]:
    """``previous`` plus ``record``, numbered, kept bounded without changing what they prove."""
    # Receipts written before observations were numbered count as numbered 1..n.
    last = previous[-1].get("number", len(previous)) if previous else 0
    numbered: Mapping[str, Any] = freeze({**record, "number": last + 1})
    return keep_observations(attempts, (*previous, numbered))


def _earlier_attempts_ran(
    exc: ActionPersistenceError,
    finished: list[AttemptRecord],
    observations: tuple[Mapping[str, Any], ...],
    base_metadata: Mapping[str, Any],
) -> ActionPersistenceError:
    """A retry that could not start, after earlier attempts of the same call ran."""
    settlement = settle(finished, observations)
    cause = exc.__cause__
    why = "the claim changed concurrently" if cause is None else bounded_error(cause)
    receipt = exc.receipt
    return OutcomeNotRecordedError(
        f"attempt {len(finished) + 1} of action {receipt.action_id if receipt else '?'} could "
        f"not be started ({why}), so it was not invoked; but {len(finished)} earlier "
        f"attempt(s) of this call WERE invoked ({settlement.final_status.value}): do not repeat "
        "the operation. Re-read the ledger; a PENDING claim needs read-only recover_pending",
        receipt=receipt,
        operation_invoked=True,
        observed_status=settlement.final_status,
        observed_metadata=freeze(_protocol_metadata(base_metadata, observations, settlement)),
    )


class ActionRunner:
    """Runs side-effecting operations under durable, evidence-based receipts.

    ``ActionRunner(ledger, policy=RetryPolicy())``. The default policy makes
    one attempt and never retries. The runner never invokes an operation for
    a replay, an in-progress duplicate or a conflicting request, never retries
    an UNKNOWN outcome unless the policy's escape hatch says so, and resolves
    ambiguity only through read-only verifiers bound to the provider reference.
    """

    def __init__(
        self, ledger: Ledger, *, policy: RetryPolicy | None = None, clock: Clock | None = None
    ) -> None:
        missing = [name for name in _LEDGER_METHODS if not callable(getattr(ledger, name, None))]
        if missing:
            raise InvalidArgumentError(
                f"ledger {type(ledger).__qualname__} does not implement the Ledger "
                f"protocol (missing {', '.join(missing)})"
            )
        if policy is None:
            policy = RetryPolicy()
        if type(policy) is not RetryPolicy:
            raise InvalidArgumentError(
                f"policy must be a RetryPolicy, not {type(policy).__qualname__}"
            )
        if clock is None:
            clock = SystemClock()
        elif not isinstance(clock, Clock):
            raise InvalidArgumentError(
                "clock must have monotonic() and an async sleep(seconds), "
                f"not {type(clock).__qualname__}"
            )
        self._ledger = ledger
        self._policy = policy
        self._clock = clock

    @property
    def ledger(self) -> Ledger:
        """The ledger this runner records receipts in."""
        return self._ledger

    @property
    def policy(self) -> RetryPolicy:
        """The default retry policy for ``execute``."""
        return self._policy

    # -- execute ---------------------------------------------------------------

    @overload
    async def execute(
        self,
        action_name: str,
        operation: Callable[[], Awaitable[T]],
        *,
        request: dict[str, Any],
        idempotency_key: str,
        provider_reference: str | None = ...,
        verifier: AnyVerifier | None = ...,
        risk: str | None = ...,
        metadata: dict[str, Any] | None = ...,
        policy: RetryPolicy | None = ...,
        wait_in_progress: float | None = ...,
    ) -> ActionResult[T]: ...

    @overload
    async def execute(
        self,
        action_name: str,
        operation: Callable[[], T],
        *,
        request: dict[str, Any],
        idempotency_key: str,
        provider_reference: str | None = ...,
        verifier: AnyVerifier | None = ...,
        risk: str | None = ...,
        metadata: dict[str, Any] | None = ...,
        policy: RetryPolicy | None = ...,
        wait_in_progress: float | None = ...,
    ) -> ActionResult[T]: ...

    async def execute(
        self,
        action_name: str,
        operation: Callable[[], Any],
        *,
        request: dict[str, Any],
        idempotency_key: str,
        provider_reference: str | None = None,
        verifier: AnyVerifier | None = None,
        risk: str | None = None,
        metadata: dict[str, Any] | None = None,
        policy: RetryPolicy | None = None,
        wait_in_progress: float | None = None,
    ) -> ActionResult[Any]:
        """Run ``operation`` at most as often as the policy and evidence allow.

        Raises ActionInProgressError, IdempotencyConflictError and
        ActionPersistenceError as documented, and InvalidArgumentError (or its
        relatives) for bad arguments before any ledger access. Every other
        outcome, provider exceptions included, is returned as an ActionResult.

        ``wait_in_progress`` (seconds): when another caller holds the claim,
        wait up to that long for it to complete and return its receipt as a
        replay, instead of raising ActionInProgressError at once. Waiting never
        invokes the operation for the other caller's claim; if that claim is
        released unstarted, this call claims the key like any new caller.
        """
        _check_text_arg("action_name", action_name)
        if not callable(operation):
            raise InvalidArgumentError(
                f"operation must be callable, not {type(operation).__qualname__}"
            )
        validate_request(request)
        _check_text_arg("idempotency_key", idempotency_key)
        _check_text_arg("provider_reference", provider_reference, optional=True)
        verify = None if verifier is None else _resolve_verifier(verifier)
        if verify is not None and provider_reference is None:
            raise InvalidArgumentError(
                "a verifier needs provider_reference: verification must be bound to the "
                "provider's own reference for this mutation"
            )
        _check_text_arg("risk", risk, optional=True)
        if metadata is None:
            caller_metadata: Mapping[str, Any] = FrozenDict()
        else:
            validate_metadata(metadata)
            # Snapshot now, so later changes by the caller cannot alter the receipt.
            caller_metadata = freeze(metadata)
        if policy is None:
            policy = self._policy
        elif type(policy) is not RetryPolicy:
            raise InvalidArgumentError(
                f"policy must be a RetryPolicy, not {type(policy).__qualname__}"
            )
        if wait_in_progress is not None and (
            type(wait_in_progress) not in (int, float)
            or not math.isfinite(wait_in_progress)
            or not 0 <= wait_in_progress <= MAX_WAIT_IN_PROGRESS
        ):
            raise InvalidArgumentError(
                f"wait_in_progress must be None or seconds in [0, {MAX_WAIT_IN_PROGRESS}], "
                f"not {wait_in_progress!r}"
            )
        digest = request_hash(request)
        attempt = functools.partial(
            self._execute_once,
            action_name,
            operation,
            idempotency_key=idempotency_key,
            digest=digest,
            provider_reference=provider_reference,
            verify=verify,
            risk=risk,
            caller_metadata=caller_metadata,
            policy=policy,
        )
        if wait_in_progress is None:
            return await attempt()
        deadline = self._clock.monotonic() + wait_in_progress
        delay = WAIT_FIRST_DELAY
        while True:
            try:
                return await attempt()
            except ActionInProgressError:
                remaining = deadline - self._clock.monotonic()
                if remaining <= 0:
                    raise
            # Poll the ledger, backing off: the claim holder is usually quick,
            # and a stranded claim must not be hammered.
            await self._clock.sleep(min(delay, remaining))
            delay = min(delay * 2, WAIT_MAX_DELAY)

    async def _execute_once(
        self,
        action_name: str,
        operation: Callable[[], Any],
        *,
        idempotency_key: str,
        digest: str,
        provider_reference: str | None,
        verify: VerifyFn | None,
        risk: str | None,
        caller_metadata: Mapping[str, Any],
        policy: RetryPolicy,
    ) -> ActionResult[Any]:
        """One pass of ``execute`` over validated arguments."""
        try:
            existing = await self._ledger.find(action_name, idempotency_key)
        except Exception as exc:
            raise NothingInvokedError(
                f"could not read the ledger for {action_name!r}: {bounded_error(exc)}; "
                "nothing was invoked",
                receipt=None,
                operation_invoked=False,
            ) from exc
        if existing is not None:
            return await self._answer_existing(existing, digest, provider_reference, verify)

        now = utc_now()
        proposed = ActionReceipt(
            action_id=uuid.uuid4().hex,
            action_name=action_name,
            idempotency_key=idempotency_key,
            request_hash=digest,
            provider_reference=provider_reference,
            risk=risk,
            claim_state=ClaimState.PENDING,
            attempts=0,
            execution_status=None,
            verification_status=None,
            final_status=None,
            provider_request_id=None,
            error=None,
            metadata=caller_metadata,
            attempt_records=(),
            version=1,
            created_at=now,
            updated_at=now,
        )
        claimed, created = await self._claim(proposed)
        if not created:
            return await self._answer_existing(claimed, digest, provider_reference, verify)
        transition("claimed", claimed)
        return await self._run_attempts(claimed, operation, verify, policy)

    async def _claim(self, proposed: ActionReceipt) -> tuple[ActionReceipt, bool]:
        try:
            return await self._ledger.claim(proposed)
        except Exception as exc:
            # The insert may have committed with its acknowledgement lost. Our
            # action id is fresh, so finding it stored proves the claim is ours.
            try:
                stored = await self._ledger.find(proposed.action_name, proposed.idempotency_key)
            except Exception:
                stored = None
            if stored == proposed:
                return proposed, True
            if stored is not None and stored.action_id != proposed.action_id:
                return stored, False
            raise NothingInvokedError(
                f"the claim for {proposed.action_name!r} could not be proven durable "
                f"({bounded_error(exc)}); the operation was not invoked. Re-read the ledger: "
                "a stored PENDING claim with zero attempts can be released",
                receipt=proposed,
                operation_invoked=False,
            ) from exc

    async def _answer_existing(
        self,
        existing: ActionReceipt,
        digest: str,
        provider_reference: str | None,
        verify: VerifyFn | None,
    ) -> ActionResult[Any]:
        if existing.request_hash != digest or existing.provider_reference != provider_reference:
            transition("conflict", existing, level=logging.WARNING)
        if existing.request_hash != digest:
            raise IdempotencyConflictError(
                f"idempotency key {existing.idempotency_key!r} of {existing.action_name!r} is "
                f"already claimed by action {existing.action_id} for a different request",
                receipt=existing,
            )
        if existing.provider_reference != provider_reference:
            raise IdempotencyConflictError(
                f"idempotency key {existing.idempotency_key!r} of {existing.action_name!r} is "
                f"already claimed by action {existing.action_id} with provider reference "
                f"{existing.provider_reference!r}, not {provider_reference!r}",
                receipt=existing,
            )
        if existing.claim_state is ClaimState.PENDING:
            transition("in_progress", existing)
            raise ActionInProgressError(
                f"action {existing.action_id} ({existing.action_name!r}, key "
                f"{existing.idempotency_key!r}) is still in progress; it was not invoked again",
                receipt=existing,
            )
        transition("replayed", existing)
        if existing.final_status is ActionStatus.UNKNOWN and verify is not None:
            return await self._observe_and_merge(existing, verify, "reconcile", replayed=True)
        return ActionResult(existing, replayed=True)

    async def _run_attempts(
        self,
        claimed: ActionReceipt,
        operation: Callable[[], Any],
        verify: VerifyFn | None,
        policy: RetryPolicy,
    ) -> ActionResult[Any]:
        durable = claimed
        records = list(claimed.attempt_records)
        observations = _observations_of(claimed)
        base_metadata = claimed.metadata
        while True:
            number = durable.attempts + 1
            now = utc_now()
            records.append(AttemptRecord(number=number, started_at=now))
            try:
                durable = await self._start_attempt(
                    durable.evolve(
                        attempts=number,
                        attempt_records=tuple(records),
                        metadata=_protocol_metadata(base_metadata, observations, None),
                        version=durable.version + 1,
                        updated_at=now,
                    ),
                    previous=durable,
                )
            except ActionPersistenceError as exc:
                if number == claimed.attempts + 1:
                    raise  # nothing of this call ran
                raise _earlier_attempts_ran(exc, records[:-1], observations, base_metadata) from (
                    exc.__cause__ or exc
                )
            transition("attempt_started", durable)

            try:
                execution = await self._invoke(operation, verifying=verify is not None)
                observation = None
                if verify is not None and execution.status is ActionStatus.UNKNOWN:
                    observation = await self._observe(verify, durable, "execute", number)
            except asyncio.CancelledError:
                # The operation may have run. Record UNKNOWN if we still can,
                # then let the cancellation through; a PENDING claim is safe too.
                await self._record_cancelled(durable, records, observations, base_metadata)
                raise

            if observation is not None:
                observations = _with_observation(records, observations, observation.record)
            verification_status = None if observation is None else observation.status
            confirmed_id = (
                observation.result.provider_request_id
                if observation is not None
                and observation.result is not None
                and observation.status is ActionStatus.CONFIRMED
                else None
            )
            finished = AttemptRecord(
                number=number,
                started_at=records[-1].started_at,
                execution_status=execution.status,
                verification_status=verification_status,
                error=execution.error,
                provider_request_id=confirmed_id,
                finished_at=utc_now(),
            )
            records[-1] = finished
            status = aggregate_attempts(
                [attempt_evidence(r.execution_status, r.verification_status) for r in records]
            )
            assert status is not None
            if execution.status is ActionStatus.FAILED:
                retryable = execution.retryable
            else:
                # FAILED through read-back is fenced, retry-safe absence by definition.
                retryable = verification_status is ActionStatus.FAILED
            retry = policy.should_retry(status, number, retryable)
            records[-1] = dataclasses.replace(finished, retry_decision="retry" if retry else "stop")
            if retry:
                if status is ActionStatus.UNKNOWN:
                    # Point at the caller of execute (via _execute_once).
                    warnings.warn(UNKNOWN_RETRY_WARNING, RuntimeWarning, stacklevel=4)
                transition(
                    "retrying",
                    durable,
                    attempt_status=status.value,
                    level=logging.WARNING if status is ActionStatus.UNKNOWN else logging.INFO,
                )
                continue
            return await self._complete(
                durable, records, observations, base_metadata, execution, observation
            )

    async def _start_attempt(
        self, proposed: ActionReceipt, *, previous: ActionReceipt
    ) -> ActionReceipt:
        try:
            written = await self._ledger.start_attempt(proposed)
        except Exception as exc:
            # Lost acknowledgement? Continue only if the ledger shows exactly
            # the transition we asked for; never write it a second time.
            try:
                stored = await self._ledger.get(proposed.action_id)
            except Exception:
                stored = None
            if stored == proposed:
                transition("attempt_start_acknowledgement_recovered", proposed)
                return proposed
            transition("attempt_not_started", previous, level=logging.WARNING)
            raise NothingInvokedError(
                f"attempt {proposed.attempts} of action {proposed.action_id} could not be "
                f"proven durable ({bounded_error(exc)}); the operation was not invoked",
                receipt=stored if stored is not None else previous,
                operation_invoked=False,
            ) from exc
        if not written:
            try:
                stored = await self._ledger.get(proposed.action_id)
            except Exception:
                stored = None
            raise NothingInvokedError(
                f"action {proposed.action_id} changed before attempt {proposed.attempts} could "
                "start (released or recovered concurrently?); the operation was not invoked",
                receipt=stored if stored is not None else previous,
                operation_invoked=False,
            )
        return proposed

    async def _invoke(self, operation: Callable[[], Any], *, verifying: bool) -> _Execution:
        try:
            # A sync operation runs on a worker thread, never on the loop.
            value = await call_maybe_async(operation)
        except DefinitiveFailure as exc:
            return _Execution(
                ActionStatus.FAILED, error=bounded_error(exc), retryable=exc.retryable is True
            )
        except Exception as exc:
            # Timeouts, resets, malformed responses: the effect may have happened.
            return _Execution(ActionStatus.UNKNOWN, error=bounded_error(exc))
        if verifying:
            # A return proves only that execution finished; read-back decides.
            return _Execution(ActionStatus.UNKNOWN, value=value)
        return _Execution(ActionStatus.CONFIRMED, value=value)

    async def _observe(
        self, verify: VerifyFn, receipt: ActionReceipt, source: str, attempt: int
    ) -> _Observation:
        try:
            result = await verify(receipt)
        except Exception as exc:
            record = _observation_record(
                source, attempt, ActionStatus.UNKNOWN, None, f"verifier raised {bounded_error(exc)}"
            )
            return _Observation(None, ActionStatus.UNKNOWN, record)
        if type(result) is not VerificationResult:
            invalid = f"verifier returned {type(result).__qualname__}, not a VerificationResult"
            record = _observation_record(source, attempt, ActionStatus.UNKNOWN, None, invalid)
            return _Observation(None, ActionStatus.UNKNOWN, record)
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
        record = _observation_record(source, attempt, status, result, problem)
        if not _storable(record) or not _storable_identifiers(result):
            # Whatever it was, an answer no ledger can store must not leave an
            # invoked outcome unrecordable: it counts as no evidence at all.
            unstorable = "verifier returned a VerificationResult that no ledger can store"
            record = _observation_record(source, attempt, ActionStatus.UNKNOWN, None, unstorable)
            return _Observation(None, ActionStatus.UNKNOWN, record)
        return _Observation(result, status, record)

    async def _complete(
        self,
        durable: ActionReceipt,
        records: list[AttemptRecord],
        observations: tuple[Mapping[str, Any], ...],
        base_metadata: Mapping[str, Any],
        execution: _Execution,
        observation: _Observation | None,
    ) -> ActionResult[Any]:
        settlement = settle(records, observations)
        metadata = _protocol_metadata(base_metadata, observations, settlement)
        final = durable.evolve(
            claim_state=ClaimState.COMPLETED,
            attempt_records=tuple(records),
            execution_status=settlement.execution_status,
            verification_status=settlement.verification_status,
            final_status=settlement.final_status,
            provider_request_id=settlement.provider_request_id,
            error=execution.error,
            metadata=metadata,
            version=durable.version + 1,
            updated_at=utc_now(),
        )
        value: object = MISSING
        if settlement.final_status is ActionStatus.CONFIRMED:
            if execution.value is not MISSING and not settlement.provider_request_id_conflict:
                value = execution.value
            elif (
                observation is not None
                and observation.result is not None
                and observation.result.has_value
                and recovered_value_correlated(
                    settlement.final_status,
                    settlement.provider_request_id_conflict,
                    observation.result.provider_request_id,
                    settlement.provider_request_id,
                )
            ):
                value = observation.result.value
        problem = "the claim changed concurrently"
        cause: Exception | None = None
        try:
            written = await self._ledger.record(final)
        except Exception as exc:
            written, problem, cause = False, bounded_error(exc), exc
            # Lost acknowledgement? Only the exact receipt we wrote proves it.
            try:
                stored = await self._ledger.get(final.action_id)
            except Exception:
                stored = None
            if stored == final:
                transition("outcome_acknowledgement_recovered", final)
                written = True
        if not written:
            transition(
                "outcome_not_recorded",
                durable,
                level=logging.ERROR,
                observed_status=settlement.final_status.value,
            )
            raise OutcomeNotRecordedError(
                f"the outcome of action {durable.action_id} ({settlement.final_status.value}) "
                f"could not be recorded ({problem}). The operation WAS invoked: do not repeat "
                "it. Re-read the ledger; a PENDING claim needs read-only recover_pending",
                receipt=durable,
                operation_invoked=True,
                observed_status=settlement.final_status,
                observed_metadata=freeze(metadata),
                value_available=value is not MISSING,
                observed_value=None if value is MISSING else value,
            ) from cause
        transition("completed", final)
        return ActionResult(final, value=value)

    async def _record_cancelled(
        self,
        durable: ActionReceipt,
        records: list[AttemptRecord],
        observations: tuple[Mapping[str, Any], ...],
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
        settlement = settle(records, observations)
        try:
            await self._ledger.record(
                durable.evolve(
                    claim_state=ClaimState.COMPLETED,
                    attempt_records=tuple(records),
                    execution_status=settlement.execution_status,
                    verification_status=settlement.verification_status,
                    final_status=settlement.final_status,
                    provider_request_id=settlement.provider_request_id,
                    error=records[-1].error,
                    metadata=_protocol_metadata(base_metadata, observations, settlement),
                    version=durable.version + 1,
                    updated_at=utc_now(),
                )
            )
        except BaseException:
            # Best effort only: a PENDING claim with attempts >= 1 is still a
            # safe barrier, recoverable read-only.
            return

    # -- reconciliation and recovery ----------------------------------------

    async def receipt(self, action_id: str) -> ActionReceipt:
        """The stored receipt for ``action_id``; ActionNotFoundError if none."""
        _check_text_arg("action_id", action_id)
        try:
            stored = await self._ledger.get(action_id)
        except Exception as exc:
            raise NothingInvokedError(
                f"could not read action {action_id} from the ledger: {bounded_error(exc)}",
                receipt=None,
                operation_invoked=False,
            ) from exc
        if stored is None:
            raise ActionNotFoundError(f"no action with id {action_id!r}", action_id=action_id)
        return stored

    async def reconcile(self, action_id: str, verifier: AnyVerifier) -> ActionResult[Any]:
        """Settle a completed UNKNOWN receipt with a read-only verifier.

        A receipt that is already CONFIRMED or FAILED is returned unchanged
        without calling the verifier. A PENDING claim is refused: it may still
        be in flight; use ``recover_pending`` once its worker is known to be gone.
        The operation is never invoked.
        """
        _check_text_arg("action_id", action_id)
        verify = _resolve_verifier(verifier)
        receipt = await self.receipt(action_id)
        if receipt.claim_state is ClaimState.PENDING:
            raise RecoveryRefusedError(
                f"action {action_id} is still PENDING and may be in flight; make sure its "
                "worker has stopped, then use recover_pending",
                receipt=receipt,
            )
        if receipt.final_status is not ActionStatus.UNKNOWN:
            return ActionResult(receipt)
        return await self._observe_and_merge(receipt, verify, "reconcile", replayed=False)

    async def recover_pending(self, action_id: str, verifier: AnyVerifier) -> ActionResult[Any]:
        """Complete a stranded PENDING claim (attempts >= 1) from read-only evidence.

        First make sure the original worker can no longer mutate. The claim
        becomes COMPLETED with whatever the verifier proves; inconclusive
        read-back leaves a completed UNKNOWN receipt that ``reconcile`` can
        settle later. A claim that never started an attempt is refused (use
        ``release_unstarted``); a completed claim is reconciled instead.
        """
        _check_text_arg("action_id", action_id)
        verify = _resolve_verifier(verifier)
        receipt = await self.receipt(action_id)
        if receipt.claim_state is ClaimState.COMPLETED:
            if receipt.final_status is not ActionStatus.UNKNOWN:
                return ActionResult(receipt)
            return await self._observe_and_merge(receipt, verify, "reconcile", replayed=False)
        if receipt.attempts == 0:
            raise RecoveryRefusedError(
                f"action {action_id} never started an attempt; nothing can have happened, "
                "so use release_unstarted instead",
                receipt=receipt,
            )
        return await self._observe_and_merge(receipt, verify, "recover", replayed=False)

    async def _observe_and_merge(
        self, receipt: ActionReceipt, verify: VerifyFn, source: str, *, replayed: bool
    ) -> ActionResult[Any]:
        observation = await self._observe(verify, receipt, source, receipt.attempts)
        current = receipt
        for _ in range(MAX_MERGE_ROUNDS):
            if current.attempts != receipt.attempts:
                raise RecoveryRefusedError(
                    f"action {receipt.action_id} started another attempt during recovery; "
                    "its worker is still active, so this observation is out of date",
                    receipt=current,
                )
            observations = _with_observation(
                current.attempt_records, _observations_of(current), observation.record
            )
            settlement = settle(current.attempt_records, observations)
            recovery = current.metadata.get("recovery")
            if source == "recover" and current.claim_state is ClaimState.PENDING:
                recovery = {
                    "method": "recover_pending",
                    "recovered_at": utc_now().isoformat(),
                    "attempts": current.attempts,
                }
            caller_metadata = {k: v for k, v in current.metadata.items() if k not in _PROTOCOL_KEYS}
            proposed = current.evolve(
                claim_state=ClaimState.COMPLETED,
                execution_status=settlement.execution_status,
                verification_status=settlement.verification_status,
                final_status=settlement.final_status,
                provider_request_id=settlement.provider_request_id,
                metadata=_protocol_metadata(caller_metadata, observations, settlement, recovery),
                version=current.version + 1,
                updated_at=utc_now(),
            )
            try:
                written = await self._ledger.record(proposed)
            except Exception as exc:
                try:
                    stored = await self._ledger.get(receipt.action_id)
                except Exception:
                    stored = None
                if stored == proposed:
                    written = True
                else:
                    raise NothingInvokedError(
                        f"the verification of action {receipt.action_id} could not be recorded "
                        f"({bounded_error(exc)}); nothing was invoked",
                        receipt=stored if stored is not None else current,
                        operation_invoked=False,
                        observed_status=settlement.final_status,
                        observed_metadata=proposed.metadata,
                    ) from exc
            if written:
                transition("recovered" if source == "recover" else "reconciled", proposed)
                value: object = MISSING
                result = observation.result
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
                return ActionResult(proposed, replayed=replayed, value=value)
            # Lost a race with another writer: merge into what it wrote.
            try:
                stored = await self._ledger.get(receipt.action_id)
            except Exception as exc:
                raise NothingInvokedError(
                    f"the verification of action {receipt.action_id} lost a race and the "
                    f"receipt could not be re-read ({bounded_error(exc)}); nothing was invoked",
                    receipt=current,
                    operation_invoked=False,
                    observed_status=settlement.final_status,
                    observed_metadata=proposed.metadata,
                ) from exc
            if stored is None:
                raise ActionNotFoundError(
                    f"action {receipt.action_id} disappeared during reconciliation",
                    action_id=receipt.action_id,
                )
            current = stored
        raise NothingInvokedError(
            f"the verification of action {receipt.action_id} lost {MAX_MERGE_ROUNDS} races in "
            "a row; nothing was invoked",
            receipt=current,
            operation_invoked=False,
        )

    async def release_unstarted(self, action_id: str) -> None:
        """Remove a PENDING claim that never started an attempt, so its key can be reused.

        Atomic against attempt start: once invocation may have begun
        (attempts >= 1), or the claim is completed, this raises
        RecoveryRefusedError and changes nothing.
        """
        _check_text_arg("action_id", action_id)
        receipt = await self.receipt(action_id)
        if receipt.claim_state is not ClaimState.PENDING or receipt.attempts != 0:
            raise RecoveryRefusedError(
                f"action {action_id} has started {receipt.attempts} attempt(s) or is completed; "
                "only a claim that never invoked its operation can be released",
                receipt=receipt,
            )
        try:
            released = await self._ledger.release(action_id, receipt.version)
        except Exception as exc:
            try:
                stored = await self._ledger.get(action_id)
            except Exception:
                raise NothingInvokedError(
                    f"the release of action {action_id} could not be confirmed "
                    f"({bounded_error(exc)})",
                    receipt=receipt,
                    operation_invoked=False,
                ) from exc
            if stored is None:
                transition("released", receipt)
                return
            raise NothingInvokedError(
                f"the release of action {action_id} failed ({bounded_error(exc)})",
                receipt=stored,
                operation_invoked=False,
            ) from exc
        if released:
            transition("released", receipt)
            return
        if not released:
            try:
                stored = await self._ledger.get(action_id)
            except Exception as exc:
                raise NothingInvokedError(
                    f"action {action_id} changed before it could be released, and it could "
                    f"not be re-read ({bounded_error(exc)}); nothing was released",
                    receipt=receipt,
                    operation_invoked=False,
                ) from exc
            raise RecoveryRefusedError(
                f"action {action_id} changed before it could be released (an attempt may "
                "have started); nothing was released",
                receipt=stored,
            )


_PROTOCOL_KEYS: Final = frozenset(
    {
        "verification",
        "verification_observations",
        "verification_observation_count",
        "verification_conflict",
        "provider_request_ids",
        "provider_request_id_conflict",
    }
)
