"""One pooled connection kept checked out for the statements that find it free.

Checking a connection out of the asyncpg pool and back in costs about as
much per statement as a third of a loopback round trip (the release is a
shielded task of its own). A call whose statements follow one another,
the common case, finds this connection free and skips both; a statement
that arrives while it is busy takes a pool connection as before, so
concurrency never waits on it.

It is used only on a pool the ledger made itself (a given pool's owner may
close it while the ledger lives, and ``Pool.close`` waits for every
connection out) and never where it could starve the pool (a pool of one).
It goes back to the pool after any error, when the server has closed it
(checked before each use, as the pool checks at each checkout), after
``IDLE_SECONDS`` without a statement (a timer, so the pool's own
idle-connection policy applies to it again), and on ``close``; once
closing, it never takes another.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any, Final

__all__ = ["IDLE_SECONDS", "ConnectionLane", "no_reset"]

#: Seconds without a statement after which the held connection goes back.
IDLE_SECONDS: Final = 60.0


async def no_reset(connection: Any) -> None:
    """Pool release hook: the ledger leaves no session state, so skip the reset query."""


def _usable(conn: Any) -> bool:
    """Whether a held connection may still carry a statement."""
    try:
        return not conn.is_closed()
    except Exception:  # asyncpg detached it: the server ended it and the pool took it back
        return False


class ConnectionLane:
    """A connection of ``pool`` held for consecutive statements; busy or failed, the pool serves."""

    __slots__ = ("_busy", "_closing", "_conn", "_idle", "_last_used", "_timer", "enabled", "pool")

    def __init__(self, pool: Any, *, owned: bool = True) -> None:
        self.pool = pool
        size = getattr(pool, "get_max_size", None)
        self.enabled = owned and callable(size) and size() >= 2 and hasattr(pool, "acquire")
        self._conn: Any = None
        self._busy = False
        self._closing = False
        self._timer: asyncio.TimerHandle | None = None
        self._last_used = 0.0
        self._idle: asyncio.Task[None] | None = None  # kept: the loop holds tasks weakly

    async def fetch(self, sql: str, *args: Any) -> list[Any]:
        """Run one statement on the held connection if it is free, else on a pool connection."""
        if self._busy or self._closing or not self.enabled:
            return list(await self.pool.fetch(sql, *args))
        # One event loop: nothing runs between this check and the claim below.
        self._busy = True
        try:
            if self._conn is not None and not _usable(self._conn):
                await self._give_back()
            if self._conn is None:
                self._conn = await self.pool.acquire()
            rows = list(await self._conn.fetch(sql, *args))
            self._note_use()
            return rows
        except BaseException:
            # Broken, cancelled mid-statement or refused: let the pool judge it.
            # A closing pool may refuse it; the statement's own error is the news.
            with contextlib.suppress(Exception):
                await self._give_back()
            raise
        finally:
            self._busy = False
            if self._closing:
                await self._give_back()

    async def close(self) -> None:
        """Hand the connection back (now, or when the statement on it ends); take no other."""
        self._closing = True
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if not self._busy:
            await self._give_back()

    def _note_use(self) -> None:
        # One timer at a time, re-armed for what is left when it fires: a
        # TimerHandle per statement would cost every statement.
        loop = asyncio.get_running_loop()
        self._last_used = loop.time()
        if self._timer is None and not self._closing:
            self._timer = loop.call_later(IDLE_SECONDS, self._on_idle)

    def _on_idle(self) -> None:
        self._timer = None
        conn = self._conn
        if conn is None or self._closing:
            return
        loop = asyncio.get_running_loop()
        left = self._last_used + IDLE_SECONDS - loop.time()
        if self._busy or left > 0:
            self._timer = loop.call_later(max(left, 0.01), self._on_idle)
            return
        # Off the lane at once, so close() and the next statement never see it.
        self._conn = None

        async def give_back() -> None:
            with contextlib.suppress(Exception):  # a closing pool: nothing left to return
                await self.pool.release(conn)

        self._idle = loop.create_task(give_back())

    async def _give_back(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            # Pool.release is shielded: a cancellation cannot lose the connection.
            await self.pool.release(conn)
