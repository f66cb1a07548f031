"""Calling an attempt's operation, and what its call proves: step 5 of the protocol.

Classified by evidence only: a ``DefinitiveFailure`` is FAILED, any other
exception UNKNOWN (the effect may have happened), a plain return CONFIRMED
without a verifier and UNKNOWN pending read-back with one. A sync
operation runs on a worker thread; if it returns a coroutine, the call
starts only when that is awaited, so the claim is checked again first.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
from collections.abc import Callable
from typing import Any

from dataoad._blocking import call_blocking, caller_cancelled, is_async_callable
from dataoad._completing import Execution
from dataoad._events import EventSink
from dataoad._failure import DefinitiveFailure
from dataoad._leases import Tenure, renewed_for_the_call, young_enough
from dataoad._proven import ProvenLedger
from dataoad._receipt import ActionReceipt, bounded_error
from dataoad._status import ActionStatus

__all__ = ["Acting", "invoke"]


class Acting:
    """Whether an operation whose caller was cancelled may still act.

    Cancelling the caller stops neither a sync operation's worker thread
    nor a thread or request an async operation handed its work to
    (``asyncio.to_thread``, a request already sent), so what it started may
    still reach the provider after any read at the claim's fencing token:
    such a claim must stay held until a takeover raises the fence (see
    ``run_attempts``). Only a sync operation's thread is seen to end.
    """

    __slots__ = ("may_act",)

    def __init__(self) -> None:
        self.may_act = False


def _watched(operation: Callable[[], Any], acting: Acting) -> Callable[[], Any]:
    def run() -> Any:
        try:
            return operation()
        finally:
            acting.may_act = False  # the thread is done with it

    return run


def _retryable(failure: DefinitiveFailure) -> bool:
    """Whether the failure says a retry is safe; one whose flag cannot be read says no."""
    try:
        return failure.retryable is True
    except Exception:
        # A subclass whose ``retryable`` raises: still a definitive failure,
        # but no evidence that repeating it is safe.
        return False


class _LeaseLapsedBeforeAwait(Exception):
    """A sync operation returned an awaitable after its claim's lease could not be kept."""


def _close(awaitable: object) -> None:
    """Close an awaitable that will never be awaited (a coroutine: no warning, no effect)."""
    close = getattr(awaitable, "close", None)
    if callable(close):
        with contextlib.suppress(Exception):
            close()


async def invoke(
    operation: Callable[[], Any],
    *,
    verifying: bool,
    store: ProvenLedger,
    held: ActionReceipt,
    tenure: Tenure,
    events: EventSink,
    sent: float,
    acting: Acting | None = None,
) -> Execution:
    """Call ``operation`` once and classify what the call proves.

    ``acting``: whether the operation may still act if the caller is
    cancelled during the call (see :class:`Acting`).
    """
    if acting is not None:
        acting.may_act = True  # before a thread can start, so never set after it ended
    try:
        if is_async_callable(operation):
            value = operation()
        else:
            # A sync operation runs on a worker thread, never on the loop.
            value = await call_blocking(
                operation if acting is None else _watched(operation, acting)
            )
            if (
                inspect.isawaitable(value)
                and not isinstance(value, asyncio.Future)  # a Future or Task has started
                and not young_enough(tenure, sent)
            ):
                # ``lambda: client.charge(...)``: the call starts only when what
                # it returned is awaited, and the loop ran other tasks meanwhile
                # (a stall past the lease lets another worker take over).
                try:
                    kept = await renewed_for_the_call(store, held, tenure, events)
                except BaseException:
                    _close(value)
                    raise
                if kept is not True:
                    _close(value)
                    raise _LeaseLapsedBeforeAwait(
                        "the claim's lease could not be kept while the operation's sync part "
                        "ran (the event loop stalled), so what it returned was never awaited; "
                        "the sync part did run"
                    )
        if inspect.isawaitable(value):
            if acting is not None:
                acting.may_act = True  # what the sync part returned acts once awaited
            value = await value
    except DefinitiveFailure as exc:
        return Execution(ActionStatus.FAILED, error=bounded_error(exc), retryable=_retryable(exc))
    except Exception as exc:
        # Timeouts, resets, malformed responses: the effect may have happened.
        return Execution(ActionStatus.UNKNOWN, error=bounded_error(exc))
    except asyncio.CancelledError as exc:
        if caller_cancelled():
            raise
        # Raised by something the operation awaited, not by its caller: the
        # operation failed mid-way, and the effect may have happened.
        return Execution(ActionStatus.UNKNOWN, error=bounded_error(exc))
    if verifying:
        # A return proves only that execution finished; read-back decides.
        return Execution(ActionStatus.UNKNOWN, value=value)
    return Execution(ActionStatus.CONFIRMED, value=value)
