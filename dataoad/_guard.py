"""Less ceremony: a decorator that guards a function with a runner.

It is thin: every call goes through the runner's ``execute`` with the same
rules, so it adds no behaviour of its own. An async function pairs with an
``ActionRunner`` and stays async; a sync function pairs with a
``SyncActionRunner`` and stays sync. Any other pairing is refused when
decorating, because it would hand a sync caller a coroutine (or an async
caller a blocking call).
"""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, ParamSpec, TypeVar, overload

from dataoad._blocking import is_async_callable
from dataoad._errors import InvalidArgumentError
from dataoad._policy import RetryPolicy
from dataoad._result import ActionResult
from dataoad._runner import ActionRunner
from dataoad._sync import SyncActionRunner
from dataoad._verification import AnyVerifier

__all__ = ["guarded"]

P = ParamSpec("P")
T = TypeVar("T")


class _Guard:
    def __init__(
        self,
        action_name: str,
        runner: ActionRunner | SyncActionRunner,
        idempotency_key: Callable[..., str],
        request: Callable[..., dict[str, Any]],
        provider_reference: Callable[..., str | None] | None,
        options: dict[str, Any],
    ) -> None:
        if not isinstance(runner, ActionRunner | SyncActionRunner):
            raise InvalidArgumentError(
                f"runner must be an ActionRunner or a SyncActionRunner, not "
                f"{type(runner).__qualname__}"
            )
        for name, fn in (("idempotency_key", idempotency_key), ("request", request)):
            if not callable(fn):
                raise InvalidArgumentError(f"{name} must be a callable of the function's arguments")
        if provider_reference is not None and not callable(provider_reference):
            raise InvalidArgumentError("provider_reference must be a callable or None")
        self.action_name = action_name
        self.runner = runner
        self.idempotency_key = idempotency_key
        self.request = request
        self.provider_reference = provider_reference
        #: The options passed to every ``execute`` unchanged (checked there, per call).
        self.options = options

    def arguments(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> dict[str, Any]:
        """``execute``'s keyword arguments for one call, derived from its arguments."""
        return {
            "request": self.request(*args, **kwargs),
            "idempotency_key": self.idempotency_key(*args, **kwargs),
            "provider_reference": None
            if self.provider_reference is None
            else self.provider_reference(*args, **kwargs),
            **self.options,
        }


class _AsyncDecorator:
    def __init__(self, guard: _Guard) -> None:
        self.guard = guard

    def __call__(
        self, fn: Callable[P, Awaitable[T]]
    ) -> Callable[P, Coroutine[Any, Any, ActionResult[T]]]:
        return _decorate(self.guard, fn)  # type: ignore[no-any-return]


class _SyncDecorator:
    def __init__(self, guard: _Guard) -> None:
        self.guard = guard

    def __call__(self, fn: Callable[P, T]) -> Callable[P, ActionResult[T]]:
        return _decorate(self.guard, fn)  # type: ignore[no-any-return]


def _decorate(guard: _Guard, fn: Callable[P, Any]) -> Any:
    if not callable(fn):
        raise InvalidArgumentError(f"guarded needs a function, not {type(fn).__qualname__}")
    runner = guard.runner
    if is_async_callable(fn):
        if not isinstance(runner, ActionRunner):
            raise InvalidArgumentError(
                f"{getattr(fn, '__qualname__', fn)!r} is async, but the runner is a "
                "SyncActionRunner: guard an async function with an ActionRunner, or a "
                "sync function with a SyncActionRunner"
            )
        async_runner = runner

        @functools.wraps(fn)
        async def async_wrapper(*args: P.args, **kwargs: P.kwargs) -> ActionResult[Any]:
            # The call itself only builds a coroutine: nothing runs before the claim.
            return await async_runner.execute(
                guard.action_name,
                functools.partial(fn, *args, **kwargs),
                **guard.arguments(args, kwargs),
            )

        return async_wrapper
    if not isinstance(runner, SyncActionRunner):
        raise InvalidArgumentError(
            f"{getattr(fn, '__qualname__', fn)!r} is a sync function, but the runner is an "
            "ActionRunner, which would turn it into a coroutine function: guard a sync "
            "function with a SyncActionRunner, or an async function with an ActionRunner "
            "(ActionRunner.execute runs a blocking operation on a worker thread)"
        )
    sync_runner = runner

    @functools.wraps(fn)
    def sync_wrapper(*args: P.args, **kwargs: P.kwargs) -> ActionResult[Any]:
        # ``fn`` is handed over uncalled: the runner calls it after the claim.
        return sync_runner.execute(
            guard.action_name,
            functools.partial(fn, *args, **kwargs),
            **guard.arguments(args, kwargs),
        )

    return sync_wrapper


@overload
def guarded(
    action_name: str,
    *,
    runner: ActionRunner,
    idempotency_key: Callable[..., str],
    request: Callable[..., dict[str, Any]],
    provider_reference: Callable[..., str | None] | None = ...,
    verifier: AnyVerifier | None = ...,
    policy: RetryPolicy | None = ...,
    risk: str | None = ...,
    wait_in_progress: float | None = ...,
    metadata: dict[str, Any] | None = ...,
    expires_after: float | None = ...,
) -> _AsyncDecorator: ...


@overload
def guarded(
    action_name: str,
    *,
    runner: SyncActionRunner,
    idempotency_key: Callable[..., str],
    request: Callable[..., dict[str, Any]],
    provider_reference: Callable[..., str | None] | None = ...,
    verifier: AnyVerifier | None = ...,
    policy: RetryPolicy | None = ...,
    risk: str | None = ...,
    wait_in_progress: float | None = ...,
    metadata: dict[str, Any] | None = ...,
    expires_after: float | None = ...,
) -> _SyncDecorator: ...


def guarded(
    action_name: str,
    *,
    runner: ActionRunner | SyncActionRunner,
    idempotency_key: Callable[..., str],
    request: Callable[..., dict[str, Any]],
    provider_reference: Callable[..., str | None] | None = None,
    verifier: AnyVerifier | None = None,
    policy: RetryPolicy | None = None,
    risk: str | None = None,
    wait_in_progress: float | None = None,
    metadata: dict[str, Any] | None = None,
    expires_after: float | None = None,
) -> _AsyncDecorator | _SyncDecorator:
    """Guard a function with ``runner``: calling it runs ``runner.execute``.

    ``idempotency_key``, ``request`` and ``provider_reference`` are explicit
    callables given the function's own arguments; nothing is inferred. An
    async function with an ``ActionRunner`` becomes a coroutine function
    returning an ``ActionResult``; a sync function with a ``SyncActionRunner``
    becomes a sync function returning one. Any other pairing raises
    InvalidArgumentError when decorating. Name, docstring and signature are
    kept. ``verifier``, ``policy``, ``risk``, ``wait_in_progress``, ``metadata``
    and ``expires_after`` go to ``execute`` unchanged on every call.
    """
    guard = _Guard(
        action_name,
        runner,
        idempotency_key,
        request,
        provider_reference,
        {
            "verifier": verifier,
            "policy": policy,
            "risk": risk,
            "wait_in_progress": wait_in_progress,
            "metadata": metadata,
            "expires_after": expires_after,
        },
    )
    if isinstance(runner, SyncActionRunner):
        return _SyncDecorator(guard)
    return _AsyncDecorator(guard)
