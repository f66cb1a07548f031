"""What a language model should read after a guarded tool call.

Framework adapters (``dataoad.integrations.*``) are thin: they call
:func:`run_tool` and hand its :class:`ToolOutcome` message to the model.
The message states the evidence plainly: CONFIRMED with the value, FAILED
"did not happen", UNKNOWN "may have happened, do not call again, it will be
verified", always with the action id a person can look up.

The idempotency key must come from the business intent the caller declares
(an order id, a ticket number in the tool's arguments), never from the
framework's per-call tool-call id: a model that retries a timed-out call
issues a *new* tool-call id for the *same* intent, and only a key derived
from the intent makes that retry a replay instead of a second charge.
"""

from __future__ import annotations

import dataclasses
import functools
import json
from collections.abc import Callable, Mapping
from typing import Any

from dataoad._errors import (
    ActionInProgressError,
    ActionPersistenceError,
    IdempotencyConflictError,
    InvalidArgumentError,
)
from dataoad._policy import RetryPolicy
from dataoad._receipt import ActionReceipt
from dataoad._result import ActionResult
from dataoad._runner import ActionRunner
from dataoad._status import ActionStatus
from dataoad._verification import AnyVerifier
from dataoad._volatile import call_ids_of, stable_key

__all__ = ["GuardedTool", "ToolOutcome", "describe_result", "run_tool"]

#: Longest rendering of a CONFIRMED value put in front of the model.
MAX_VALUE_CHARS = 2000


@dataclasses.dataclass(frozen=True, slots=True)
class ToolOutcome:
    """A guarded tool call's outcome, and the message the model should read."""

    #: CONFIRMED, FAILED or UNKNOWN, or IN_PROGRESS, CONFLICT, NOT_ATTEMPTED.
    status: str
    message: str
    action_id: str | None
    replayed: bool = False
    #: The operation's return value, only for a fresh CONFIRMED result.
    value: Any = None
    #: The receipt the outcome was read from, when there is one.
    receipt: ActionReceipt | None = dataclasses.field(default=None, repr=False, compare=False)

    def __str__(self) -> str:
        return self.message


def _render_value(value: Any) -> str:
    try:
        text = json.dumps(value, ensure_ascii=False, default=str)
    except (TypeError, ValueError):
        text = repr(value)
    return text if len(text) <= MAX_VALUE_CHARS else text[: MAX_VALUE_CHARS - 1] + "\u2026"


def describe_result(
    result: ActionResult[Any], action: str, *, verifier_set: bool = True
) -> ToolOutcome:
    """The model-facing outcome of a finished ``execute`` (or replay).

    ``verifier_set``: whether a read-only verifier will check an UNKNOWN;
    without one the text says an operator must, never that it will be verified.
    """
    receipt = result.receipt
    ref = f"action id {receipt.action_id}"
    if result.status is ActionStatus.CONFIRMED:
        if result.replayed:
            return ToolOutcome(
                "CONFIRMED",
                f"CONFIRMED: {action} already happened earlier ({ref}). This call did not "
                "repeat it. Do not call again for the same request.",
                receipt.action_id,
                replayed=True,
                receipt=receipt,
            )
        value = result.value if result.value_available else None
        shown = f" Result: {_render_value(value)}" if result.value_available else ""
        return ToolOutcome(
            "CONFIRMED",
            f"CONFIRMED: {action} happened ({ref}).{shown}",
            receipt.action_id,
            value=value,
            receipt=receipt,
        )
    if result.status is ActionStatus.FAILED:
        reason = f" Reason: {receipt.error}." if receipt.error else ""
        return ToolOutcome(
            "FAILED",
            f"FAILED: {action} did not happen ({ref}).{reason} Nothing was changed, so a new "
            "attempt is safe, but it needs a new request: repeating this same call returns "
            "this same answer.",
            receipt.action_id,
            replayed=result.replayed,
            receipt=receipt,
        )
    checked = (
        "It will be verified read-only; tell the user the outcome is being checked."
        if verifier_set
        else "Nothing will check it automatically (no verifier is set): an operator must "
        "check it with the provider. Tell the user the outcome is not known yet."
    )
    return ToolOutcome(
        "UNKNOWN",
        f"UNKNOWN: {action} may have happened ({ref}); the provider did not confirm it. Do "
        f"NOT call this tool again for the same request: that could do it twice. {checked}",
        receipt.action_id,
        replayed=result.replayed,
        receipt=receipt,
    )


def describe_error(exc: Exception, action: str) -> ToolOutcome:
    """The model-facing outcome of a refusal: in progress, conflict, or not recorded."""
    receipt = getattr(exc, "receipt", None)
    action_id = None if receipt is None else receipt.action_id
    ref = "" if action_id is None else f" (action id {action_id})"
    if isinstance(exc, ActionInProgressError):
        return ToolOutcome(
            "IN_PROGRESS",
            f"IN PROGRESS: {action} is already running for this request{ref}. Do NOT call "
            "again; its outcome will be recorded and can be checked later.",
            action_id,
            receipt=receipt,
        )
    if isinstance(exc, IdempotencyConflictError):
        return ToolOutcome(
            "CONFLICT",
            f"CONFLICT: this request's key was already used for a different request{ref}. "
            "Nothing was done. Check the arguments; do not reuse the key for another request.",
            action_id,
            receipt=receipt,
        )
    # The receipt the error carries is evidence too: a claim that counted an
    # attempt may have done it, whichever call this was (a replay's read-only
    # check that could not be recorded, say), so it is never "not attempted".
    if isinstance(exc, ActionPersistenceError) and (
        exc.operation_invoked or (receipt is not None and receipt.attempts > 0)
    ):
        return ToolOutcome(
            "UNKNOWN",
            f"UNKNOWN: {action} may have happened{ref}: it was attempted, but its outcome could "
            "not be recorded or checked. Do NOT call this tool again for the same request; "
            "that could do it twice. An operator must check it.",
            action_id,
            receipt=receipt,
        )
    if isinstance(exc, ActionPersistenceError):
        return ToolOutcome(
            "NOT_ATTEMPTED",
            f"NOT ATTEMPTED: {action} was not run, because it could not be recorded safely"
            f"{ref}. Nothing was changed; it may be tried again later.",
            action_id,
            receipt=receipt,
        )
    raise exc


async def run_tool(
    runner: ActionRunner,
    action_name: str,
    operation: Callable[[], Any],
    *,
    request: dict[str, Any],
    idempotency_key: str,
    provider_reference: str | None = None,
    verifier: AnyVerifier | None = None,
    policy: RetryPolicy | None = None,
    action: str | None = None,
    risk: str | None = None,
    metadata: dict[str, Any] | None = None,
    wait_in_progress: float | None = None,
    expires_after: float | None = None,
) -> ToolOutcome:
    """``runner.execute`` for a tool call; every protocol outcome becomes a ToolOutcome.

    Refusals the model can act on (in progress, conflict, not recorded) are
    outcomes too; bad arguments (``InvalidArgumentError``) still raise,
    because they are a programming error in the adapter, not news for the model.
    """
    label = action or action_name
    try:
        result = await runner.execute(
            action_name,
            operation,
            request=request,
            idempotency_key=idempotency_key,
            provider_reference=provider_reference,
            verifier=verifier,
            policy=policy,
            risk=risk,
            metadata=metadata,
            wait_in_progress=wait_in_progress,
            expires_after=expires_after,
        )
    except (ActionInProgressError, IdempotencyConflictError, ActionPersistenceError) as exc:
        return describe_error(exc, label)
    return describe_result(result, label, verifier_set=verifier is not None)


@dataclasses.dataclass(frozen=True)
class GuardedTool:
    """How a tool's arguments map onto the runner: explicit callables, no inference.

    ``idempotency_key`` and ``request`` (and ``provider_reference``) receive
    the tool's keyword arguments. Framework adapters build on this.
    ``idempotency_key=None`` is for a framework that knows where the call
    runs (LangGraph: the thread and task); the others refuse it.
    """

    runner: ActionRunner
    action_name: str
    idempotency_key: Callable[..., str] | None
    request: Callable[..., dict[str, Any]]
    provider_reference: Callable[..., str | None] | None = None
    verifier: AnyVerifier | None = None
    policy: RetryPolicy | None = None
    action: str | None = None
    risk: str | None = None
    metadata: dict[str, Any] | None = None
    wait_in_progress: float | None = None
    expires_after: float | None = None

    def __post_init__(self) -> None:
        # Tool adapters await the runner: a SyncActionRunner would fail only at
        # the first call (inside the framework), so it is refused here.
        if not isinstance(self.runner, ActionRunner):
            raise InvalidArgumentError(
                f"runner must be an ActionRunner, not {type(self.runner).__name__}: framework "
                "tools are awaited (a SyncActionRunner is for sync code, with @guarded)"
            )
        if not callable(self.request):
            raise InvalidArgumentError("request must be a callable of the tool's arguments")
        if self.idempotency_key is not None and not callable(self.idempotency_key):
            raise InvalidArgumentError(
                "idempotency_key must be a callable of the tool's arguments (or None where the "
                "framework derives it)"
            )
        if self.provider_reference is not None and not callable(self.provider_reference):
            raise InvalidArgumentError("provider_reference must be a callable or None")

    def key_function(self, framework: str) -> Callable[..., str]:
        """The key callable; a framework that derives no key of its own refuses None."""
        if self.idempotency_key is None:
            raise InvalidArgumentError(
                f"{framework} tools need an idempotency_key: a callable of the tool's "
                "arguments that names the business intent (an order id, or "
                "dataoad.intent_key(scope, action, request)), never the model's call id"
            )
        return self.idempotency_key

    async def call(
        self,
        fn: Callable[..., Any],
        arguments: Mapping[str, Any],
        *,
        default_key: Callable[[dict[str, Any]], str] | None = None,
        check_key: Callable[[Callable[[], str], dict[str, Any], object], str] | None = None,
    ) -> ToolOutcome:
        """Run ``fn(**arguments)`` under the runner and describe the outcome.

        ``default_key(request)`` gives the key when ``idempotency_key`` is None.
        ``check_key(derive, arguments, request)`` derives the key with
        ``derive`` and may refuse it (before anything happens): it returns the
        key to use. Without one, the key is still derived twice and refused if
        it changes, or if it or the request holds the model's call id from a
        context argument (``ToolContext``, ``ToolRuntime``).
        """
        kwargs = dict(arguments)
        request = self.request(**kwargs)
        given = self.idempotency_key

        def derive() -> str:
            if given is not None:
                return given(**kwargs)
            if default_key is not None:
                return default_key(request)
            return self.key_function("framework")(**kwargs)

        key = (
            stable_key(derive, request, call_ids_of(kwargs))
            if check_key is None
            else check_key(derive, kwargs, request)
        )
        return await run_tool(
            self.runner,
            self.action_name,
            # A partial, not a lambda: an async tool then runs on the loop directly.
            functools.partial(fn, **kwargs),
            request=request,
            idempotency_key=key,
            provider_reference=None
            if self.provider_reference is None
            else self.provider_reference(**kwargs),
            verifier=self.verifier,
            policy=self.policy,
            action=self.action,
            risk=self.risk,
            metadata=self.metadata,
            wait_in_progress=self.wait_in_progress,
            expires_after=self.expires_after,
        )
