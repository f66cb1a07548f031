"""SyncActionRunner: the runner's verbs as blocking calls, for code that is not async.

One event loop on a background thread serves every calling thread; the
ledger lives on that loop. A sync operation or verifier runs on the *calling*
thread (which is blocked waiting for its result anyway), never on the loop,
so N threads each making a blocking call on distinct keys overlap instead of
queueing behind one another, and each call sees its own thread-locals.
"""

from __future__ import annotations

import asyncio
import inspect
import queue
import threading
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from typing import Any, Final, TypeVar, overload

from dataoad._blocking import placed
from dataoad._bounds import (
    DEFAULT_MAX_METADATA_BYTES,
    DEFAULT_MAX_REQUEST_BYTES,
    DEFAULT_VERIFIER_TIMEOUT,
)
from dataoad._clock import Clock
from dataoad._errors import DataoadError, InvalidArgumentError
from dataoad._events import RunnerObserver
from dataoad._forks import FORKED_ADVICE, generation
from dataoad._in_flight import InFlight
from dataoad._leases import DEFAULT_LEASE
from dataoad._ledger import Ledger
from dataoad._policy import RetryPolicy
from dataoad._receipt import ActionReceipt
from dataoad._result import ActionResult
from dataoad._runner import ActionRunner
from dataoad._verification import AnyVerifier

__all__ = ["SyncActionRunner"]

T = TypeVar("T")

#: How long ``close()`` waits for calls in flight by default, in seconds.
CLOSE_WAIT: Final = 30.0

#: What the loop posts to a waiting caller: a job to run on its thread, or
#: ``None`` when the call is over.
_Inbox = queue.SimpleQueue[Callable[[], None] | None]


class SyncActionRunner:
    """A blocking facade over ActionRunner for code that is not async.

    ``SyncActionRunner(ledger, policy=..., lease=..., owner=..., namespace=...)`` takes
    ActionRunner's options.
    Every method blocks until the call is done; any number of threads may
    call at once, and their operations run concurrently, each on its caller's
    thread. Inside a running event loop use ActionRunner instead: calling this
    from async code raises rather than blocking that loop. Close it with
    ``close()`` (it closes the ledger) or use it as a context manager.
    """

    def __init__(
        self,
        ledger: Ledger,
        *,
        policy: RetryPolicy | None = None,
        lease: float | None = DEFAULT_LEASE,
        owner: str | None = None,
        namespace: str = "",
        clock: Clock | None = None,
        observers: Sequence[RunnerObserver] = (),
        max_request_bytes: int = DEFAULT_MAX_REQUEST_BYTES,
        max_metadata_bytes: int = DEFAULT_MAX_METADATA_BYTES,
        verifier_timeout: float | None = DEFAULT_VERIFIER_TIMEOUT,
    ) -> None:
        self._runner = ActionRunner(
            ledger,
            policy=policy,
            lease=lease,
            owner=owner,
            namespace=namespace,
            clock=clock,
            observers=observers,
            max_request_bytes=max_request_bytes,
            max_metadata_bytes=max_metadata_bytes,
            verifier_timeout=verifier_timeout,
        )
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(
            target=self._loop.run_forever, name="dataoad-sync-runner", daemon=True
        )
        self._thread.start()
        self._made_in = generation()
        self._closed = False
        # Set when close() begins: new calls are refused from then on.
        self._closing = False
        self._admit = threading.Lock()
        self._closer = threading.Lock()
        self._calls = InFlight()

    @property
    def runner(self) -> ActionRunner:
        """The async runner that does the work (on this facade's own loop)."""
        return self._runner

    @property
    def ledger(self) -> Ledger:
        """The ledger this runner records receipts in."""
        return self._runner.ledger

    @property
    def policy(self) -> RetryPolicy:
        """The default retry policy for ``execute``."""
        return self._runner.policy

    @property
    def owner(self) -> str:
        """This worker's name in the receipts it claims."""
        return self._runner.owner

    @property
    def lease(self) -> float | None:
        """Seconds a claim stays this runner's without renewal (None: no leases)."""
        return self._runner.lease

    @property
    def namespace(self) -> str:
        """The namespace this runner's keys and receipts belong to."""
        return self._runner.namespace

    def _run(self, coro: Coroutine[Any, Any, T]) -> T:
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            pass
        else:
            coro.close()
            raise DataoadError(
                "SyncActionRunner was called from inside a running event loop; it would block "
                "that loop. Use ActionRunner and await it instead"
            )
        if self._made_in != generation():
            # Its loop thread stayed in the parent: the call would wait forever.
            coro.close()
            raise DataoadError(
                f"this SyncActionRunner was made before this process forked: {FORKED_ADVICE}"
            )
        with self._admit:
            if self._closing:
                coro.close()
                raise DataoadError(
                    "this SyncActionRunner is closed"
                    if self._closed
                    else "this SyncActionRunner is closing: it takes no new call"
                )
            self._calls.enter()
        self._calls.enter_thread()
        try:
            return self._call(coro)
        finally:
            self._calls.leave_thread()
            self._calls.leave()

    def _call(self, coro: Coroutine[Any, Any, T]) -> T:
        inbox: _Inbox = queue.SimpleQueue()
        # The task copies this thread's context, placement included: its
        # blocking calls come back here to run.
        with placed(inbox.put):
            future = asyncio.run_coroutine_threadsafe(coro, self._loop)
        future.add_done_callback(lambda _: inbox.put(None))
        try:
            while (job := inbox.get()) is not None:
                job()
        except BaseException:
            # KeyboardInterrupt while waiting: stop the call rather than leave
            # it waiting for a thread that no longer listens. As for any
            # cancellation, an attempt whose operation's call had not ended
            # leaves its claim held (PENDING); one past it is recorded UNKNOWN.
            future.cancel()
            raise
        return future.result()

    @overload
    def execute(
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
        expires_after: float | None = ...,
    ) -> ActionResult[T]: ...

    @overload
    def execute(
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
        expires_after: float | None = ...,
    ) -> ActionResult[T]: ...

    def execute(
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
        expires_after: float | None = None,
    ) -> ActionResult[Any]:
        """Blocking ``ActionRunner.execute``: same arguments, same rules, same errors."""
        return self._run(
            self._runner.execute(
                action_name,
                operation,
                request=request,
                idempotency_key=idempotency_key,
                provider_reference=provider_reference,
                verifier=verifier,
                risk=risk,
                metadata=metadata,
                policy=policy,
                wait_in_progress=wait_in_progress,
                expires_after=expires_after,
            )
        )

    def reconcile(self, action_id: str, verifier: AnyVerifier) -> ActionResult[Any]:
        """Blocking ``ActionRunner.reconcile``."""
        return self._run(self._runner.reconcile(action_id, verifier))

    def recover_pending(
        self,
        action_id: str,
        verifier: AnyVerifier,
        *,
        operator: str | None = None,
        reason: str | None = None,
    ) -> ActionResult[Any]:
        """Blocking ``ActionRunner.recover_pending``."""
        return self._run(
            self._runner.recover_pending(action_id, verifier, operator=operator, reason=reason)
        )

    def recover_stale(
        self,
        verifier: AnyVerifier | None = None,
        *,
        limit: int = 100,
        operator: str | None = None,
        reason: str | None = None,
    ) -> list[ActionResult[Any]]:
        """Blocking ``ActionRunner.recover_stale``."""
        return self._run(
            self._runner.recover_stale(verifier, limit=limit, operator=operator, reason=reason)
        )

    def reopen(
        self, action_id: str, *, operator: str | None = None, reason: str | None = None
    ) -> None:
        """Blocking ``ActionRunner.reopen``."""
        self._run(self._runner.reopen(action_id, operator=operator, reason=reason))

    def release_unstarted(
        self, action_id: str, *, operator: str | None = None, reason: str | None = None
    ) -> None:
        """Blocking ``ActionRunner.release_unstarted``."""
        self._run(self._runner.release_unstarted(action_id, operator=operator, reason=reason))

    def receipt(self, action_id: str) -> ActionReceipt:
        """Blocking ``ActionRunner.receipt``."""
        return self._run(self._runner.receipt(action_id))

    def close(self, timeout: float = CLOSE_WAIT) -> None:
        """Close the ledger and stop the background loop. Safe to call twice.

        New calls are refused from the moment it begins. Calls already in
        flight (in other threads) are waited for, up to ``timeout`` seconds,
        so that every operation that ran records its outcome; if some are
        still running then, ``DataoadError`` says so and the ledger stays open
        for them (call ``close()`` again later). Called from inside one of
        this runner's own calls, it refuses at once rather than wait forever.
        """
        if self._closed:
            return
        if self._made_in != generation():
            # The parent's loop, thread and ledger: not this process's to stop
            # (and every call here is refused already).
            return
        if type(timeout) not in (int, float) or not 0 <= timeout <= 86_400:
            raise InvalidArgumentError(f"timeout must be seconds in [0, 86400], not {timeout!r}")
        if self._calls.holds_call():
            raise DataoadError(
                "SyncActionRunner.close() was called from inside one of its own calls; "
                "it would wait for itself. Close it after the call returns"
            )
        # One closer at a time: a second one waits for the first, then finds
        # the runner closed (two at once stopped the loop twice, or closed
        # the ledger on a loop already stopped and waited forever).
        with self._closer:
            if not self._closed:
                self._close(timeout)

    def _close(self, timeout: float) -> None:
        with self._admit:
            self._closing = True
        if not self._calls.wait_idle(timeout):
            raise DataoadError(
                f"{self._calls.count} call(s) of this SyncActionRunner are still running "
                f"after {timeout:g} s; the ledger stays open so they can record their "
                "outcomes (new calls are refused). Call close() again later"
            )
        close = getattr(self._runner.ledger, "close", None)
        if close is not None:
            closing = close()
            if inspect.isawaitable(closing):
                asyncio.run_coroutine_threadsafe(_awaited(closing), self._loop).result()
        self._closed = True
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join()
        self._loop.close()

    def __enter__(self) -> SyncActionRunner:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


async def _awaited(awaitable: Awaitable[object]) -> None:
    await awaitable
