"""One pooled connection kept checked out for the statements that find it free.

Checking a connection out of the asyncpg pool and back in costs about as
much per statement as a third of a loopback round trip (the release is a
shielded task of its own). A call whose statements follow one another,
the common case, finds this connection free and skips both; a statement
that arrives while it is busy takes a pool connection as before, so
concurrency never waits on it.

It is used only on a pool the ledger made itself (a given pool's owner may
close it while the ledger lives) and never where it could starve the pool
(a pool of one); it goes
back to the pool after any error (the pool then checks or replaces it) and
after a minute idle (so the pool's own idle-connection policy still
applies to it), and ``close`` hands it back.
"""

from __future__ import annotations

import contextlib
import time
from typing import Any, Final

__all__ = ["ConnectionLane", "no_reset"]

#: Seconds idle after which the lane's connection goes back to the pool.
IDLE_SECONDS: Final = 60.0


async def no_reset(connection: Any) -> None:
    """Pool release hook: the ledger leaves no session state, so skip the reset query."""


class ConnectionLane:
    """A connection of ``pool`` held for consecutive statements; busy or failed, the pool serves."""

    __slots__ = ("_busy", "_closing", "_conn", "_last_used", "enabled", "pool")

    def __init__(self, pool: Any, *, owned: bool = True) -> None:
        self.pool = pool
        size = getattr(pool, "get_max_size", None)
        # Holding the only connection of a pool of one would starve every
        # other caller; and a pool the ledger was given is its owner's to
        # close at any time (``Pool.close`` waits for every connection out).
        self.enabled = owned and callable(size) and size() >= 2 and hasattr(pool, "acquire")
        self._conn: Any = None
        self._busy = False
        self._closing = False
        self._last_used = 0.0

    async def fetch(self, sql: str, *args: Any) -> list[Any]:
        """Run one statement on the lane if it is free, else on a pool connection."""
        if self._busy or self._closing or not self.enabled:
            return list(await self.pool.fetch(sql, *args))
        # Single event loop: nothing runs between this check and the claim below.
        self._busy = True
        try:
            if self._conn is not None and time.monotonic() - self._last_used > IDLE_SECONDS:
                await self._give_back()
            if self._conn is None:
                self._conn = await self.pool.acquire()
            rows = list(await self._conn.fetch(sql, *args))
            self._last_used = time.monotonic()
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
        """Hand the connection back (now, or when the statement on it ends)."""
        self._closing = True
        if not self._busy:
            await self._give_back()

    async def _give_back(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            # Pool.release is shielded: a cancellation cannot lose the connection.
            await self.pool.release(conn)
