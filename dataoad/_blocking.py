"""Where a sync operation or verifier runs: never on the event loop.

A blocking call on the loop stops every other task (and, on SQLite, used to
keep the cross-process writer lock held). The runner therefore hands every
callable that is not a coroutine function to :func:`call_blocking`, which
runs it on a worker thread with a copy of the caller's context variables and
awaits the result without blocking the loop.

Two placements exist:

* the default: a daemon worker thread from a small pool that grows on demand
  (so N concurrent blocking calls take about as long as one, and a call that
  never returns cannot keep the interpreter from exiting);
* ``SyncActionRunner``: the thread that called it, which is blocked waiting
  anyway, so the call runs with that thread's own thread-locals and context.

A value that turns out to be awaitable (``lambda: client.charge(...)``
returning a coroutine) is awaited on the loop by the caller of this module.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import inspect
import os
import queue
import threading
import types
from collections.abc import Callable, Iterator
from typing import Any, Final, TypeVar

__all__ = [
    "Interrupted",
    "Placement",
    "call_blocking",
    "call_maybe_async",
    "caller_cancelled",
    "is_async_callable",
    "placed",
    "storable_in_a_future",
]

T = TypeVar("T")

#: An idle worker thread exits after this many seconds without work.
IDLE_SECONDS: Final = 30.0

#: Where blocking calls go: a function that runs ``fn`` off the loop and
#: resolves the future when done. ``None``: the shared worker pool.
Placement = Callable[[Callable[[], None]], None]

_placement: contextvars.ContextVar[Placement | None] = contextvars.ContextVar(
    "dataoad_blocking_placement", default=None
)


def is_async_callable(fn: object) -> bool:
    """Whether calling ``fn`` only creates a coroutine (so it may run on the loop)."""
    # The common case, a plain ``async def``, without inspect's unwrapping.
    if type(fn) is types.FunctionType and fn.__code__.co_flags & inspect.CO_COROUTINE:
        return True
    if inspect.iscoroutinefunction(fn):
        return True
    call = getattr(fn, "__call__", None)  # noqa: B004 - an async __call__ is what we look for
    return call is not None and inspect.iscoroutinefunction(call)


class _WorkerPool:
    """Daemon threads that run submitted jobs; one more is started when none is idle.

    Not ``concurrent.futures.ThreadPoolExecutor``: its workers are joined at
    interpreter exit (one stuck provider call would hang the exit) and its
    cap of ``cpu + 4`` threads would serialise blocking calls beyond it.
    """

    def __init__(self) -> None:
        self._jobs: queue.SimpleQueue[Callable[[], None]] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._idle = 0

    def start_after_fork(self) -> None:
        """In a forked child: no worker of the parent's is here to take a job."""
        self._jobs = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._idle = 0

    def submit(self, job: Callable[[], None]) -> None:
        with self._lock:
            self._jobs.put(job)
            if self._idle:
                self._idle -= 1
                return
        threading.Thread(target=self._work, name="dataoad-blocking", daemon=True).start()

    def _work(self) -> None:
        while True:
            try:
                job = self._jobs.get(timeout=IDLE_SECONDS)
            except queue.Empty:
                with self._lock:
                    # Every queued job has a worker reserved for it; exit only
                    # when nothing is queued, so no reserved job is stranded.
                    if self._jobs.empty() and self._idle:
                        self._idle -= 1
                        return
                continue
            job()
            with self._lock:
                self._idle += 1


_POOL: Final = _WorkerPool()
if hasattr(os, "register_at_fork"):  # a job queued to the parent's idle workers would wait forever
    os.register_at_fork(after_in_child=_POOL.start_after_fork)


def _settle(future: asyncio.Future[Any], value: object, exc: BaseException | None) -> None:
    if future.done():
        return  # the caller was cancelled; the thread's result has no one to go to
    if exc is None:
        future.set_result(value)
    else:
        future.set_exception(storable_in_a_future(exc))


def storable_in_a_future(exc: BaseException) -> BaseException:
    """``exc``, or a RuntimeError caused by it where a future refuses it.

    A future refuses StopIteration (it would end a generator's iteration
    silently), and the refusal left the future pending for good: a sync
    ``next(iter([]))`` in an operation hung its call, its lease renewed
    forever. Python turns one raised in a coroutine into a RuntimeError
    (PEP 479); so does this, for one raised on a thread.
    """
    if not isinstance(exc, StopIteration):
        return exc
    wrapped = RuntimeError(f"{type(exc).__name__} raised by a call made on a thread")
    wrapped.__cause__ = exc
    return wrapped


class Interrupted(Exception):
    """``fn`` raised ``original`` off the loop, not an Exception (KeyboardInterrupt, SystemExit).

    On the loop it is an ordinary failure of ``fn``: the attempt it ran in is
    recorded like any other that failed mid-way, and the loop lives on.
    """

    def __init__(self, original: BaseException) -> None:
        super().__init__(type(original).__name__)
        self.original = original


async def call_blocking(fn: Callable[[], T], *, on_pool: bool = False) -> T:
    """Run ``fn()`` off the event loop, with a copy of the caller's context.

    Cancelling the await does not stop the thread: a blocking call cannot be
    interrupted, which is why an attempt cancelled while its thread still
    runs leaves its claim held (``_attempts.run_attempts``).
    ``on_pool``: on the shared worker pool whatever the placement (a call
    the loop may stop waiting for must not hold the caller's thread).
    """
    loop = asyncio.get_running_loop()
    future: asyncio.Future[T] = loop.create_future()
    context = contextvars.copy_context()
    place = None if on_pool else _placement.get()

    def job() -> None:
        value: object = None
        error: BaseException | None = None
        try:
            value = context.run(fn)
        except BaseException as exc:
            error = exc
        interrupt = None
        if error is not None and not isinstance(error, Exception):
            # Raised into the loop, KeyboardInterrupt or SystemExit would stop
            # it: every call it serves would hang and every lease it renews
            # would run out under an operation still running.
            interrupt, error = error, Interrupted(error)
        # A closed loop means its caller is gone: nobody to tell.
        with contextlib.suppress(RuntimeError):
            loop.call_soon_threadsafe(_settle, future, value, error)
        if isinstance(interrupt, KeyboardInterrupt | SystemExit) and place is not None:
            raise interrupt  # on the caller's own thread, the caller stops as well

    (_POOL.submit if place is None else place)(job)
    return await future


@contextlib.contextmanager
def placed(place: Placement) -> Iterator[None]:
    """Within this block (and tasks started in it), blocking calls go to ``place``."""
    token = _placement.set(place)
    try:
        yield
    finally:
        _placement.reset(token)


def caller_cancelled() -> bool:
    """Whether the running task itself was asked to stop.

    A ``CancelledError`` that an operation or verifier raises while its
    caller was not cancelled (it awaited a future that someone else
    cancelled, a closed client's) is that callable's failure, judged like
    any other; only the caller's own cancellation goes through as one.
    """
    task = asyncio.current_task()
    return task is None or task.cancelling() > 0


async def call_maybe_async(fn: Callable[[], Any]) -> Any:
    """Call ``fn`` where it belongs and await what it returns if that is awaitable."""
    value = fn() if is_async_callable(fn) else await call_blocking(fn)
    if inspect.isawaitable(value):
        value = await value
    return value
