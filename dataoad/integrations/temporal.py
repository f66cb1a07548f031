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
never the attempt number. The activity returns the operation's value for a
CONFIRMED outcome it ran, and None for a CONFIRMED replay (Dataoad never
stores provider values: read the system of record by the reference). A FAILED
outcome and an UNKNOWN one are raised as non-retryable ``ApplicationError``
(types ``"ActionFailed"`` and ``"UnresolvedActionError"``) so Temporal never
retries them as transient; ``unresolved(error)`` in the workflow turns the
latter back into ``UnresolvedActionError``. A bad argument and a ledger that
cannot be used (closed, not set up) are non-retryable too; other Dataoad
errors (a claim in progress, a ledger that could not be written this time)
are retried by Temporal and meet the same receipt.
"""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable
from typing import Any, ParamSpec, TypeVar

from dataoad._errors import (
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

__all__ = ["FAILED_TYPE", "UNRESOLVED_TYPE", "activity_key", "guarded_activity", "unresolved"]

P = ParamSpec("P")
T = TypeVar("T")

#: The ``ApplicationError.type`` of an UNKNOWN outcome.
UNRESOLVED_TYPE = "UnresolvedActionError"
#: The ``ApplicationError.type`` of a FAILED outcome.
FAILED_TYPE = "ActionFailed"


def activity_key() -> str:
    """The running activity's key: ``temporal:<namespace>:<workflow id>:<activity id>``.

    The same on every retry of the activity (the attempt number is not in
    it). Raises ``NotInStepError`` outside an activity.
    """
    if not _activity.in_activity():
        raise NotInStepError(
            "no Temporal activity is running: a guarded activity has a key only when a "
            "worker runs it; nothing was recorded or invoked"
        )
    info = _activity.info()
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
) -> Callable[[Callable[P, Awaitable[T]]], Callable[P, Awaitable[T | None]]]:
    """Decorate an async function as a Temporal activity guarded under ``activity_key()``.

    The same shape as ``dataoad.integrations.dbos.guarded_step``. Returns the
    value of a CONFIRMED call that ran the operation (None for a replay);
    raises a non-retryable ``ApplicationError`` for FAILED and UNKNOWN.
    ``name`` is the activity's name (default: the function's).
    """
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
            key = activity_key()
            try:
                result = await step.run(key, fn, args, kwargs)
            except UnresolvedActionError as exc:
                raise _exceptions.ApplicationError(
                    str(exc),
                    _receipt_details(exc.receipt),
                    type=UNRESOLVED_TYPE,
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
