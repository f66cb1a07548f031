"""Less ceremony: a decorator that guards a function, and a synchronous facade.

Both are thin: every call goes through ``ActionRunner.execute`` (or the
other runner methods) with the same rules, so they add no behaviour of
their own.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import threading
from collections.abc import Callable, Coroutine
from typing import Any, ParamSpec, TypeVar, overload

from dataoad._errors import DataoadError, InvalidArgumentError
from dataoad._policy import RetryPolicy
from dataoad._receipt import ActionReceipt
from dataoad._result import ActionResult
from dataoad._runner import ActionRunner
from dataoad._verification import AnyVerifier

__all__ = ["SyncActionRunner", "guarded"]

P = ParamSpec("P")
T = TypeVar("T")


class _Guard:
    def __init__(
        self,
        action_name: str,
        runner: ActionRunner,
        idempotency_key: Callable[..., str],
        request: Callable[..., dict[str, Any]],
        provider_reference: Callable[..., str | None] | None,
        verifier: AnyVerifier | None,
        policy: RetryPolicy | None,
        risk: str | None,
        wait_in_progress: float | None,
    ) -> None:
        if type(runner) is not ActionRunner and not isinstance(runner, ActionRunner):
            raise InvalidArgumentError("runner must be an ActionRunner")
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
        self.verifier = verifier
        self.policy = policy
        self.risk = risk
        self.wait_in_progress = wait_in_progress

    async def call(
        self, fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> Any:
        return await self.runner.execute(
            self.action_name,
            lambda: fn(*args, **kwargs),
            request=self.request(*args, **kwargs),
            idempotency_key=self.idempotency_key(*args, **kwargs),
            provider_reference=None
            if self.provider_reference is None
            else self.provider_reference(*args, **kwargs),
            verifier=self.verifier,
            risk=self.risk,
            policy=self.policy,
            wait_in_progress=self.wait_in_progress,
        )


class _Decorator:
    def __init__(self, guard: _Guard) -> None:
        self.guard = guard

    @overload
    def __call__(
        self, fn: Callable[P, Coroutine[Any, Any, T]]
    ) -> Callable[P, Coroutine[Any, Any, ActionResult[T]]]: ...

    @overload
    def __call__(self, fn: Callable[P, T]) -> Callable[P, Coroutine[Any, Any, ActionResult[T]]]: ...

    def __call__(self, fn: Callable[P, Any]) -> Callable[P, Coroutine[Any, Any, ActionResult[Any]]]:
        guard = self.guard

        @functools.wraps(fn)
        async def wrapper(*args: P.args, **kwargs: P.kwargs) -> ActionResult[Any]:
            return await guard.call(fn, args, kwargs)  # type: ignore[no-any-return]

        return wrapper


def guarded(
    action_name: str,
    *,
    runner: ActionRunner,
    idempotency_key: Callable[..., str],
    request: Callable[..., dict[str, Any]],
    provider_reference: Callable[..., str | None] | None = None,
    verifier: AnyVerifier | None = None,
    policy: RetryPolicy | None = None,
    risk: str | None = None,
    wait_in_progress: float | None = None,
) -> _Decorator:
    """Guard a function with ``runner``: calling it runs ``runner.execute``.

    ``idempotency_key``, ``request`` and ``provider_reference`` are explicit
    callables given the function's own arguments; nothing is inferred. The
    guarded function, sync or async, becomes a coroutine function returning
    an ``ActionResult``; its name, docstring and signature are kept.
    ``policy``, ``risk`` and ``wait_in_progress`` are passed to ``execute``.
    """
    return _Decorator(
        _Guard(
            action_name,
            runner,
            idempotency_key,
            request,
            provider_reference,
            verifier,
            policy,
            risk,
            wait_in_progress,
        )
    )


class SyncActionRunner:
    """A blocking facade over ActionRunner for code that is not async.

    It runs its own event loop on a background thread; every method blocks
    until that loop has finished the call, and any number of threads may
    call it at once. Inside a running event loop use ActionRunner instead:
    calling this from async code raises rather than deadlocking. Close it
    with ``close()`` or use it as a context manager.
    """

    def __init__(self, ledger: Any, *, policy: RetryPolicy | None = None) -> None:
        self._runner = ActionRunner(ledger, policy=policy)
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(
            target=self._loop.run_forever, name="dataoad-sync-runner", daemon=True
        )
        self._thread.start()
        self._closed = False

    @property
    def runner(self) -> ActionRunner:
        """The async runner that does the work."""
        return self._runner

    def _run(self, coro: Coroutine[Any, Any, T]) -> T:
        if self._closed:
            if inspect.iscoroutine(coro):
                coro.close()
            raise DataoadError("this SyncActionRunner is closed")
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            pass
        else:
            if inspect.iscoroutine(coro):
                coro.close()
            raise DataoadError(
                "SyncActionRunner was called from inside a running event loop; it would block "
                "that loop. Use ActionRunner and await it instead"
            )
        future = asyncio.run_coroutine_threadsafe(coro, self._loop)
        return future.result()

    def execute(
        self, action_name: str, operation: Callable[[], Any], **kwargs: Any
    ) -> ActionResult[Any]:
        """Blocking ``ActionRunner.execute``; same arguments, same rules."""
        return self._run(self._runner.execute(action_name, operation, **kwargs))

    def reconcile(self, action_id: str, verifier: AnyVerifier) -> ActionResult[Any]:
        """Blocking ``ActionRunner.reconcile``."""
        return self._run(self._runner.reconcile(action_id, verifier))

    def recover_pending(self, action_id: str, verifier: AnyVerifier) -> ActionResult[Any]:
        """Blocking ``ActionRunner.recover_pending``."""
        return self._run(self._runner.recover_pending(action_id, verifier))

    def release_unstarted(self, action_id: str) -> None:
        """Blocking ``ActionRunner.release_unstarted``."""
        self._run(self._runner.release_unstarted(action_id))

    def receipt(self, action_id: str) -> ActionReceipt:
        """Blocking ``ActionRunner.receipt``."""
        return self._run(self._runner.receipt(action_id))

    def close(self) -> None:
        """Close the ledger and stop the background loop. Safe to call twice."""
        if self._closed:
            return
        close = getattr(self._runner.ledger, "close", None)
        if close is not None:
            asyncio.run_coroutine_threadsafe(close(), self._loop).result()
        self._closed = True
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join()
        self._loop.close()

    def __enter__(self) -> SyncActionRunner:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
