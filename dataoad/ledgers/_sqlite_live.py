"""The live SQLite connections of this process, and how each is stopped exactly once.

aiosqlite runs each connection on a worker thread that is not a daemon and
that outlives a collected Connection (it holds only its queue). An unclosed
ledger would then hang the interpreter at exit. Each connection's thread is
made a daemon, stopped when its ledger is collected, and stopped cleanly at
exit (before non-daemon threads are joined) while its ledger is alive.

Whoever takes a connection out of the live set stops (or closes) it, once:
aiosqlite's ``close()`` after ``stop()`` can queue its work behind a thread
that has ended and wait for it forever (a close in an ``atexit`` handler,
after the exit hook).

Work for the thread is answered by this module, never through aiosqlite's
own futures: aiosqlite hands each result to the caller's loop, and when
that loop has closed meanwhile (``asyncio.run`` returned while a read was
queued behind a group waiting for the writer lock) the hand-over raises on
the worker thread and ends it. Every later call of the ledger would queue
work nobody runs, and wait for good. Here an answer for a closed loop is
dropped (nobody waits for it), and work is never queued for a thread that
has ended: that connection is reported closed.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import threading
import warnings
from collections.abc import Callable
from typing import Any, TypeVar

import aiosqlite

from dataoad._blocking import storable_in_a_future
from dataoad._errors import LedgerClosedError
from dataoad._in_flight import EXIT_WAIT, wait_for_calls

__all__ = [
    "abandon",
    "alive",
    "close",
    "connect",
    "on_thread",
    "queue_on_thread",
    "stop",
    "stop_live_connections",
    "take",
]

T = TypeVar("T")

_LIVE: set[aiosqlite.Connection] = set()
_LOCK = threading.Lock()


async def connect(path: str, busy_timeout: float) -> aiosqlite.Connection:
    """Open ``path`` on a daemon worker thread and count the connection as live."""
    # Used on its own thread only (all work is queued there); not checked, so
    # that one whose thread has ended can still be closed from another
    # (``abandon``): left open, it is reported unclosed when collected.
    pending = aiosqlite.connect(
        path, isolation_level=None, timeout=busy_timeout, check_same_thread=False
    )
    thread = getattr(pending, "_thread", None)
    if isinstance(thread, threading.Thread):
        thread.daemon = True  # never keeps the interpreter from exiting
    conn = await pending
    with _LOCK:
        _LIVE.add(conn)
    return conn


def take(conn: aiosqlite.Connection) -> bool:
    """Take ``conn`` out of the live set; whether it was still there (then the taker ends it)."""
    with _LOCK:
        if conn not in _LIVE:
            return False
        _LIVE.discard(conn)
        return True


async def on_thread(conn: aiosqlite.Connection, fn: Callable[[], T]) -> T:
    """Run ``fn`` on the connection's own thread, in order with its statements.

    Raises LedgerClosedError when the connection is closed or its thread
    has ended (nothing was queued). A caller that gives up does not stop
    ``fn``.
    """
    loop = asyncio.get_running_loop()
    answered: asyncio.Future[T] = loop.create_future()

    def run() -> None:
        try:
            outcome: tuple[bool, Any] = (True, fn())
        except BaseException as exc:  # the caller's to see, never the thread's end
            outcome = (False, exc)
        with contextlib.suppress(RuntimeError):  # that loop has closed: nobody waits
            loop.call_soon_threadsafe(_answer, answered, outcome)

    queue_on_thread(conn, run)
    return await answered


def _answer(future: asyncio.Future[Any], outcome: tuple[bool, Any]) -> None:
    if future.done():  # its caller gave up
        return
    succeeded, value = outcome
    if succeeded:
        future.set_result(value)
    else:
        future.set_exception(storable_in_a_future(value))


def queue_on_thread(conn: aiosqlite.Connection, fn: Callable[[], None]) -> None:
    """Queue ``fn`` on the connection's thread now, without a task or a future.

    What ``on_thread`` does before it awaits, done at once: work queued here
    runs even if whoever asked for it is cancelled a moment later. Nobody
    is told when it has run, and what it raises goes nowhere: ``fn`` answers
    whoever waits for it. Raises LedgerClosedError when the connection is
    closed or its thread has ended (nothing was queued).
    """
    if not getattr(conn, "_running", False) or getattr(conn, "_connection", None) is None:
        # Stopped by the exit hook, or closed under a call already past the ledger's check.
        raise LedgerClosedError("the ledger's SQLite connection is closed")
    if not alive(conn):
        raise LedgerClosedError(
            "the ledger's SQLite connection stopped (its thread has ended); close the ledger "
            "and open it again"
        )
    conn._tx.put_nowait((None, fn))


def alive(conn: aiosqlite.Connection) -> bool:
    """Whether the connection's thread is still there to run what is queued for it."""
    thread = getattr(conn, "_thread", None)
    return not isinstance(thread, threading.Thread) or thread.is_alive()


async def close(conn: aiosqlite.Connection) -> None:
    """Close a connection taken out of the live set: politely while its thread runs."""
    if alive(conn):
        await conn.close()
    else:  # nobody is left to run its close: waiting would be for good
        abandon(conn)


def abandon(conn: aiosqlite.Connection) -> None:
    """Give up a connection whose thread has ended: nothing can be queued for it any more."""
    conn._running = False
    db, conn._connection = conn._connection, None
    if db is not None:
        with contextlib.suppress(Exception):  # the thread may have died mid-statement
            db.close()


def stop(conn: aiosqlite.Connection) -> None:
    """Stop ``conn``'s thread unless someone has already taken it (no loop needed)."""
    if not take(conn):
        return
    # ``stop`` builds a future on the calling thread's event loop, if it has
    # one, for nobody to await; had that loop closed before the worker set
    # the future, the worker would die with "Event loop is closed". Asked
    # from a thread with no loop, it builds none.
    stopper = threading.Thread(target=_stop_now, args=(conn,), daemon=True)
    stopper.start()
    stopper.join()


def _stop_now(conn: aiosqlite.Connection) -> None:
    with contextlib.suppress(Exception), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        conn.stop()


def stop_live_connections() -> None:
    """The exit hook: stop every live connection once no runner call is in flight."""
    if not _LIVE:
        return
    # Exit runs this before it joins the threads that are still working: a
    # call in one of them may be inside its operation, and must still record
    # its outcome. So the connections are stopped only once no runner call
    # is in flight (bounded: a call that never ends cannot hold exit for good).
    wait_for_calls(EXIT_WAIT)
    with _LOCK:
        live = list(_LIVE)
    for conn in live:
        stop(conn)


def _after_fork_in_child() -> None:
    # The parent's connections are the parent's (their threads stayed there):
    # the child's exit must neither wait for them nor stop them.
    global _LOCK
    _LOCK = threading.Lock()
    _LIVE.clear()


if hasattr(threading, "_register_atexit"):
    threading._register_atexit(stop_live_connections)
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)
