"""What every durable-engine integration shares: the checks, the call, and the UNKNOWN rule.

An engine (DBOS, Temporal, LangGraph) runs a step at least once: after a
crash between the provider's commit and the engine's checkpoint it runs the
step again. Each integration derives the step's idempotency key from the
engine's own identity of the step (stable across that re-execution), and
hands the call to the runner here. An UNKNOWN outcome is raised as
``UnresolvedActionError`` carrying the receipt: never returned as a value
the workflow would act on, and never as an error the engine would retry as
transient (each integration turns the engine's own retries off for the
step; Dataoad's ``RetryPolicy`` decides what may run again).
"""

from __future__ import annotations

import functools
import hashlib
from collections.abc import Callable
from typing import Any, Final, TypeAlias

import rfc8785

from dataoad._arguments import (
    MAX_TEXT_ARG_LENGTH,
    MAX_WAIT_IN_PROGRESS,
    check_metadata,
    check_text_arg,
    check_wait,
)
from dataoad._blocking import is_async_callable
from dataoad._errors import InvalidArgumentError, UnresolvedActionError
from dataoad._policy import RetryPolicy
from dataoad._result import ActionResult
from dataoad._runner import ActionRunner
from dataoad._status import ActionStatus
from dataoad._verification import AnyVerifier
from dataoad._volatile import refuse_volatile

__all__ = [
    "LEASE_WAIT",
    "EngineStep",
    "ReferenceSpec",
    "RequestSpec",
    "engine_key",
    "refuse_volatile",
    "unresolved",
]

#: ``wait_in_progress="lease"``: wait for the claim's holder long enough for a
#: dead holder's lease to run out (twice the runner's lease, plus 5 s).
LEASE_WAIT: Final = "lease"

#: A request: a JSON object, or a callable of the step's arguments that returns one.
RequestSpec: TypeAlias = dict[str, Any] | Callable[..., dict[str, Any]]
#: A provider reference: a string, a callable of the step's arguments, or None.
ReferenceSpec: TypeAlias = str | Callable[..., str | None] | None


def engine_key(engine: str, *parts: str) -> str:
    """``engine:part:part``, each part with ``%`` and ``:`` escaped (so parts never run
    into one another); the SHA-256 of the parts when that would be longer than a key may be."""
    key = ":".join([engine, *(p.replace("%", "%25").replace(":", "%3A") for p in parts)])
    if len(key) <= MAX_TEXT_ARG_LENGTH["idempotency_key"]:
        return key
    digest = hashlib.sha256(rfc8785.dumps(list(parts))).hexdigest()
    return f"{engine}-sha256:{digest}"


def unresolved(result: ActionResult[Any], engine: str) -> UnresolvedActionError:
    """The error an UNKNOWN outcome reaches the workflow as."""
    receipt = result.receipt
    return UnresolvedActionError(
        f"{receipt.action_name} (action id {receipt.action_id}) is UNKNOWN: it may have "
        f"happened, and the provider did not confirm it. {engine} must not run it again; "
        "settle it read-only (a verifier, or `dataoad recover`) and decide from the receipt",
        receipt=receipt,
    )


class EngineStep:
    """One guarded step of an engine: its fixed options, checked once when decorating.

    Every option of ``execute`` but ``expires_after``: an engine runs a step
    at least once, and a step re-executed after its receipt expired would
    run the operation again (a second charge), so a re-run always replays.
    """

    def __init__(
        self,
        engine: str,
        runner: object,
        action_name: object,
        *,
        request: object,
        provider_reference: object,
        verifier: AnyVerifier | None,
        policy: RetryPolicy | None,
        wait_in_progress: float | str | None,
        risk: str | None = None,
        metadata: dict[str, Any] | None = None,
    ) -> None:
        if not isinstance(runner, ActionRunner):
            raise InvalidArgumentError(
                f"{engine} steps are async: the runner must be an ActionRunner, not "
                f"{type(runner).__qualname__}"
            )
        check_text_arg("action_name", action_name)
        if not (callable(request) or type(request) is dict):
            raise InvalidArgumentError(
                "request must be a JSON object or a callable of the step's arguments"
            )
        if not (provider_reference is None or callable(provider_reference)):
            check_text_arg("provider_reference", provider_reference)
        if verifier is not None and provider_reference is None:
            raise InvalidArgumentError(
                "a verifier needs a provider_reference: it reads the provider by that reference"
            )
        if policy is not None and not isinstance(policy, RetryPolicy):
            raise InvalidArgumentError("policy must be a RetryPolicy or None")
        check_text_arg("risk", risk, optional=True)
        if metadata is not None:
            # Checked now, not on the step's first run: an engine retries a
            # step whose error is not its own as transient, without end.
            check_metadata(metadata, runner._bounds.max_metadata_bytes)
        self.engine = engine
        self.runner = runner
        self.action_name: str = action_name  # type: ignore[assignment]
        self.request = request
        self.provider_reference = provider_reference
        self.verifier = verifier
        self.policy = policy
        self.risk = risk
        self.metadata = metadata
        if wait_in_progress == LEASE_WAIT:
            lease = runner.lease
            # A step re-executed after a crash meets its own claim, held by
            # the dead worker until the lease runs out; then it takes it over.
            wait_in_progress = None if lease is None else min(2 * lease + 5, MAX_WAIT_IN_PROGRESS)
        self.wait_in_progress = check_wait(wait_in_progress)

    @staticmethod
    def check_function(fn: object, engine: str) -> None:
        """Refuse anything but an async function (the runner awaits it on the step's loop)."""
        if not callable(fn):
            raise InvalidArgumentError(f"a {engine} step needs a function, not {type(fn).__name__}")
        if not is_async_callable(fn):
            raise InvalidArgumentError(
                f"{getattr(fn, '__qualname__', fn)!r} is not async: a guarded {engine} step "
                "is an async function (ActionRunner awaits it on the step's event loop)"
            )

    def arguments(
        self,
        key: str,
        fn: Callable[..., Any],
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        metadata: dict[str, Any] | None = None,
    ) -> dict[str, Any]:
        """``execute``'s arguments for ``fn(*args, **kwargs)`` under ``key``.

        ``metadata``: this call's, instead of the step's (an engine notes its own facts).
        """
        spec: Any = self.request
        given: Any = self.provider_reference
        return {
            "action_name": self.action_name,
            "operation": functools.partial(fn, *args, **kwargs),
            "request": spec(*args, **kwargs) if callable(spec) else spec,
            "idempotency_key": key,
            "provider_reference": given(*args, **kwargs) if callable(given) else given,
            "verifier": self.verifier,
            "policy": self.policy,
            "wait_in_progress": self.wait_in_progress,
            "risk": self.risk,
            "metadata": self.metadata if metadata is None else metadata,
        }

    async def execute(
        self,
        key: str,
        fn: Callable[..., Any],
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        *,
        metadata: dict[str, Any] | None = None,
    ) -> ActionResult[Any]:
        """``runner.execute`` of ``fn(*args, **kwargs)`` under ``key``, whatever the outcome."""
        result: ActionResult[Any] = await self.runner.execute(
            **self.arguments(key, fn, args, kwargs, metadata)
        )
        return result

    async def run(
        self,
        key: str,
        fn: Callable[..., Any],
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        *,
        metadata: dict[str, Any] | None = None,
        admit: Callable[[ActionResult[Any]], None] | None = None,
    ) -> ActionResult[Any]:
        """Execute ``fn(*args, **kwargs)`` under ``key``; an UNKNOWN outcome is raised.

        ``admit(result)`` may refuse a result first, by raising (an engine's
        own check of whose receipt it is).
        """
        result = await self.execute(key, fn, args, kwargs, metadata=metadata)
        if admit is not None:
            admit(result)
        if result.status is ActionStatus.UNKNOWN:
            raise unresolved(result, self.engine)
        return result
