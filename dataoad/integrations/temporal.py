"""Temporal: an activity guarded by Dataoad, keyed by the activity's identity. Needs
``dataoad[temporal]``.

Temporal runs an activity at least once: a worker that dies after the
provider committed, or an activity that outlives its start-to-close timeout,
is retried, by default without limit. ``guarded_activity`` makes every retry
meet the first attempt's receipt:

    @guarded_activity(runner, "charge", request=lambda order: {...},
                      provider_reference=lambda order: f"order-{order.id}",
                      verifier=payments_lookup)
    async def charge(order: Order) -> str:
        return await payments.charge(...)

    # in the workflow
    await workflow.execute_activity(charge, order, start_to_close_timeout=...)

The key is ``activity_key()``: the namespace, workflow id and activity id,
never the attempt number, nor the run: a reset or a retry of the workflow
re-executes the same activities, and meets their receipts. A continue-as-new
or cron run restarts activity ids, so its activity 1 would meet the last
run's: a receipt another run made, settled or left PENDING, is refused
before anything runs (``ApplicationError`` of type
``"ActionOfAnotherRun"``, non-retryable) unless ``across_runs=True`` says
that a new run is the same intent; a workflow that loops through runs gives
``idempotency_key=`` (a callable of the activity's arguments: an invoice
id, ``dataoad.intent_key(...)`` of the month). A local activity has no
stable id (its retry after a long backoff gets a new one), so it needs
``idempotency_key=`` too. The activity returns the operation's value for a
CONFIRMED outcome it ran, and None for a CONFIRMED replay (Dataoad never
stores provider values: read the system of record by the reference). A FAILED
outcome and an UNKNOWN one are raised as non-retryable ``ApplicationError``
(types ``"ActionFailed"`` and ``"UnresolvedActionError"``) so Temporal never
retries them as transient; ``unresolved(error)`` in the workflow turns the
latter back into ``UnresolvedActionError``. A bad argument and a ledger that
cannot be used (closed, not set up) and a key claimed for another request
are non-retryable too; other Dataoad errors (a claim in progress, a ledger
that could not be written this time) are retried by Temporal and meet the
same receipt.
"""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable
from typing import Any, ParamSpec, TypeVar

from dataoad._arguments import check_text_arg
from dataoad._errors import (
    IdempotencyConflictError,
    InvalidArgumentError,
    InvalidRequestError,
    LedgerUnusableError,
    NothingInvokedError,
    NotInStepError,
    ReservedMetadataError,
    UnresolvedActionError,
)
from dataoad._policy import RetryPolicy
from dataoad._receipt import ActionReceipt
from dataoad._result import ActionResult
from dataoad._status import ActionStatus
from dataoad._verification import AnyVerifier
from dataoad.integrations._common import require
from dataoad.integrations._engine import (
    LEASE_WAIT,
    EngineStep,
    ReferenceSpec,
    RequestSpec,
    engine_key,
)

_activity = require("temporalio.activity", "temporal")
_exceptions = require("temporalio.exceptions", "temporal")

__all__ = [
    "ANOTHER_RUN_TYPE",
    "FAILED_TYPE",
    "RUN_METADATA_KEY",
    "UNRESOLVED_TYPE",
    "activity_key",
    "guarded_activity",
    "unresolved",
]

P = ParamSpec("P")
T = TypeVar("T")

#: The ``ApplicationError.type`` of an UNKNOWN outcome.
UNRESOLVED_TYPE = "UnresolvedActionError"
#: The ``ApplicationError.type`` of a FAILED outcome.
FAILED_TYPE = "ActionFailed"
#: The ``ApplicationError.type`` of a receipt another run of the workflow made.
ANOTHER_RUN_TYPE = "ActionOfAnotherRun"
#: The caller-metadata key under which a guarded activity notes its workflow run.
RUN_METADATA_KEY = "temporal_workflow_run_id"


def activity_key() -> str:
    """The running activity's key: ``temporal:<namespace>:<workflow id>:<activity id>``.

    The same on every retry of the activity (the attempt number is not in
    it). Raises ``NotInStepError`` outside an activity, and
    ``InvalidArgumentError`` in a local activity (whose id is not stable).
    """
    if not _activity.in_activity():
        raise NotInStepError(
            "no Temporal activity is running: a guarded activity has a key only when a "
            "worker runs it; nothing was recorded or invoked"
        )
    info = _activity.info()
    if info.is_local:
        raise InvalidArgumentError(
            "a local activity has no stable key: Temporal gives its retry a new activity id "
            "once the backoff passes the local retry threshold, and the retry would act "
            "again. Run it as a regular activity, or give guarded_activity an "
            "idempotency_key; nothing was recorded or invoked"
        )
    return engine_key("temporal", info.namespace, info.workflow_id or "", info.activity_id)


def _receipt_details(receipt: ActionReceipt | None) -> dict[str, Any]:
    if receipt is None:
        return {}
    return {
        "action_id": receipt.action_id,
        "action_name": receipt.action_name,
        "idempotency_key": receipt.idempotency_key,
        "status": None if receipt.final_status is None else receipt.final_status.value,
        "error": receipt.error,
    }


def unresolved(error: BaseException) -> UnresolvedActionError | None:
    """In a workflow: the ``UnresolvedActionError`` an activity's failure carries, if it does.

    Looks through ``ActivityError`` causes for the guarded activity's
    non-retryable error; returns None for any other failure.
    """
    seen: BaseException | None = error
    while seen is not None:
        if isinstance(seen, _exceptions.ApplicationError) and seen.type == UNRESOLVED_TYPE:
            details = seen.details[0] if seen.details else {}
            action_id = details.get("action_id") if isinstance(details, dict) else None
            return UnresolvedActionError(seen.message, action_id=action_id)
        seen = seen.__cause__
    return None


def _key_and_run(
    given: Callable[..., str] | None, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> tuple[str, str]:
    """The activity's key (``given(*args, **kwargs)`` or ``activity_key()``) and its run."""
    if given is None:
        key = activity_key()
    else:
        if not _activity.in_activity():
            activity_key()  # NotInStepError, as without a key of one's own
        key = given(*args, **kwargs)
        check_text_arg("idempotency_key", key)
    return key, _activity.info().workflow_run_id or ""


def _another_run(receipt: ActionReceipt, run_id: str) -> str | None:
    # The run that made ``receipt``, when it is not this one (None: this
    # run's, or made before runs were noted).
    made_by = receipt.metadata.get(RUN_METADATA_KEY)
    return made_by if isinstance(made_by, str) and made_by != run_id else None


def _refused_across_runs(receipt: ActionReceipt, made_by: str, key: str) -> BaseException:
    pending = (
        " It is still PENDING (its worker stopped): settle it read-only (a verifier, or "
        "`dataoad recover`)."
        if receipt.is_pending
        else ""
    )
    error: BaseException = _exceptions.ApplicationError(
        f"the key {key!r} holds action {receipt.action_id}, made by another run of this "
        f"workflow ({made_by!r}): a continue-as-new or cron run restarts activity ids, so "
        "this may be a new action under an old key. Give guarded_activity an "
        "idempotency_key that tells the runs' actions apart, or across_runs=True if a new "
        f"run is the same intent (a reset, a workflow retry).{pending} Nothing was invoked",
        _receipt_details(receipt),
        type=ANOTHER_RUN_TYPE,
        non_retryable=True,
    )
    return error


def _taken_from_another_run(receipt: ActionReceipt, made_by: str, key: str) -> BaseException:
    status = "still open" if receipt.final_status is None else receipt.final_status.value
    error: BaseException = _exceptions.ApplicationError(
        f"the key {key!r} was claimed by another run of this workflow ({made_by!r}) while "
        f"this activity started, and this activity took its claim over (action "
        f"{receipt.action_id}, now {status}). Whose action that receipt records cannot be "
        "told: do not repeat the operation; decide from the receipt and the provider. Give "
        "guarded_activity an idempotency_key that tells the runs' actions apart",
        _receipt_details(receipt),
        type=ANOTHER_RUN_TYPE,
        non_retryable=True,
    )
    return error


def guarded_activity(
    runner: Any,
    action_name: str,
    *,
    request: RequestSpec,
    provider_reference: ReferenceSpec = None,
    verifier: AnyVerifier | None = None,
    policy: RetryPolicy | None = None,
    risk: str | None = None,
    metadata: dict[str, Any] | None = None,
    wait_in_progress: float | str | None = LEASE_WAIT,
    name: str | None = None,
    idempotency_key: Callable[..., str] | None = None,
    across_runs: bool = False,
) -> Callable[[Callable[P, Awaitable[T]]], Callable[P, Awaitable[T | None]]]:
    """Decorate an async function as a Temporal activity guarded under ``activity_key()``.

    The same shape as ``dataoad.integrations.dbos.guarded_step``. Returns the
    value of a CONFIRMED call that ran the operation (None for a replay);
    raises a non-retryable ``ApplicationError`` for FAILED and UNKNOWN.
    ``name`` is the activity's name (default: the function's).
    ``idempotency_key``: a callable of the activity's arguments giving the
    key instead (for workflows that continue as new, cron runs, local
    activities). ``across_runs``: a receipt made by another run of the
    workflow is this activity's too (refused by default; see the module).
    """
    if idempotency_key is not None and not callable(idempotency_key):
        raise InvalidArgumentError("idempotency_key must be a callable of the activity's arguments")
    if type(across_runs) is not bool:
        raise InvalidArgumentError(f"across_runs must be True or False, not {across_runs!r}")
    if isinstance(metadata, dict) and RUN_METADATA_KEY in metadata:
        raise InvalidArgumentError(
            f"metadata key {RUN_METADATA_KEY!r} is guarded_activity's own: it notes the "
            "workflow run that made the receipt"
        )
    step = EngineStep(
        "Temporal",
        runner,
        action_name,
        request=request,
        provider_reference=provider_reference,
        verifier=verifier,
        policy=policy,
        risk=risk,
        metadata=metadata,
        wait_in_progress=wait_in_progress,
    )

    def decorate(fn: Callable[P, Awaitable[T]]) -> Callable[P, Awaitable[T | None]]:
        EngineStep.check_function(fn, "Temporal")

        @functools.wraps(fn)
        async def guarded(*args: P.args, **kwargs: P.kwargs) -> T | None:
            try:
                key, run_id = _key_and_run(idempotency_key, args, kwargs)
                if idempotency_key is None and not across_runs:
                    # Before the call, not after: a claim another run left
                    # PENDING would be taken over, and settled or run again
                    # as this run's, before any answer could be refused.
                    held = await step.runner._store.read_claim(action_name, key)
                    made_by = None if held is None else _another_run(held, run_id)
                    if held is not None and made_by is not None:
                        raise _refused_across_runs(held, made_by, key)

                def admit(result: ActionResult[Any]) -> None:
                    # Another run's claim made after the read above (its activity
                    # outlived the continue-as-new): a replay ran nothing here; a
                    # takeover may have, and is never this run's success either.
                    if idempotency_key is not None or across_runs:
                        return
                    made_by = _another_run(result.receipt, run_id)
                    if made_by is None:
                        return
                    if result.replayed:
                        raise _refused_across_runs(result.receipt, made_by, key)
                    if result.taken_over:
                        raise _taken_from_another_run(result.receipt, made_by, key)

                noted = {**(metadata or {}), RUN_METADATA_KEY: run_id}
                result = await step.run(key, fn, args, kwargs, metadata=noted, admit=admit)
            except UnresolvedActionError as exc:
                raise _exceptions.ApplicationError(
                    str(exc),
                    _receipt_details(exc.receipt),
                    type=UNRESOLVED_TYPE,
                    non_retryable=True,
                ) from exc
            except IdempotencyConflictError as exc:
                made_by = _another_run(exc.receipt, run_id)
                if made_by is not None and idempotency_key is None and not across_runs:
                    raise _refused_across_runs(exc.receipt, made_by, key) from exc
                # The same answer on every retry.
                raise _exceptions.ApplicationError(
                    str(exc),
                    _receipt_details(exc.receipt),
                    type=type(exc).__name__,
                    non_retryable=True,
                ) from exc
            except (InvalidArgumentError, InvalidRequestError, ReservedMetadataError) as exc:
                # A bad argument is the same on every retry.
                raise _exceptions.ApplicationError(
                    str(exc), type=type(exc).__name__, non_retryable=True
                ) from exc
            except NothingInvokedError as exc:
                if not isinstance(exc.__cause__, LedgerUnusableError):
                    raise  # a ledger that could not be written now: Temporal may retry
                # A closed ledger, or one set up wrong, stays so on every retry.
                raise _exceptions.ApplicationError(
                    str(exc), type=type(exc.__cause__).__name__, non_retryable=True
                ) from exc
            if result.status is ActionStatus.FAILED:
                receipt = result.receipt
                raise _exceptions.ApplicationError(
                    f"{action_name} (action id {receipt.action_id}) FAILED: it did not happen"
                    + (f" ({receipt.error})" if receipt.error else ""),
                    _receipt_details(receipt),
                    type=FAILED_TYPE,
                    non_retryable=True,
                )
            return result.value if result.value_available else None

        return _activity.defn(name=name or getattr(fn, "__name__", action_name))(guarded)  # type: ignore[no-any-return]

    return decorate
