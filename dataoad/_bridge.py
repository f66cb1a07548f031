"""Sync callers of the async core: one private event loop that runs their calls.

A framework that calls a tool or node synchronously (LangGraph's ``invoke``)
has no event loop to await the runner on. Its calls go to one loop running
on a daemon thread of this process, created on first use, so a ledger whose
connections belong to one loop (asyncpg's pool) keeps that loop for every
sync call. A sync call from a thread that runs an event loop would block
that loop: it is refused.
"""

from __future__ import annotations

import asyncio
import os
import threading
from collections.abc import Awaitable, Callable
from typing import TypeVar

from dataoad._errors import DataoadError

__all__ = ["run_blocking"]

T = TypeVar("T")

_LOCK = threading.Lock()
_LOOP: asyncio.AbstractEventLoop | None = None


def _loop() -> asyncio.AbstractEventLoop:
    global _LOOP
    with _LOCK:
        if _LOOP is None:
            loop = asyncio.new_event_loop()
            threading.Thread(
                target=loop.run_forever, name="dataoad-sync-bridge", daemon=True
            ).start()
            _LOOP = loop
        return _LOOP


def _after_fork_in_child() -> None:
    # The bridge's thread stayed in the parent: the child starts its own
    # loop on first use (and its lock may have been held at the fork).
    global _LOCK, _LOOP
    _LOCK, _LOOP = threading.Lock(), None


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


def run_blocking(make: Callable[[], Awaitable[T]], *, caller: str) -> T:
    """Run the coroutine ``make()`` builds on the bridge loop and wait for its result.

    ``caller`` names the sync entry point in the error raised when the
    calling thread runs an event loop (a blocking wait there would stall it).
    """
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        pass
    else:
        raise DataoadError(
            f"{caller} was called synchronously from inside a running event loop; it would "
            "block that loop. Use the async entry point (ainvoke / astream) instead"
        )
    loop = _loop()
    if threading.current_thread().name == "dataoad-sync-bridge":
        raise DataoadError(f"{caller} was called synchronously from Dataoad's own bridge loop")

    async def call() -> T:
        return await make()

    return asyncio.run_coroutine_threadsafe(call(), loop).result()
