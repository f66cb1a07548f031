"""Ending the server backend of a write left in doubt, before anyone reads the write back.

A statement whose client gave up on it (its time limit, a broken
transport) may still be running on the server: waiting for a lock, or for
a synchronous standby to confirm its commit. Closing the client's socket
does not stop it, and it may commit long after. A read-back made meanwhile
finds the old state and takes the write for absent, then the write
appears (a claim stranded with its attempt counted, a takeover its taker
was told it lost). So before a write's error goes up to the proven-write
read-back, the backend that ran it is ended (``pg_terminate_backend``)
and waited for: a statement still waiting is rolled back, a commit that
waited for a standby becomes visible, and the read-back sees the outcome
for good.

A backend is named by its process id and start time, read when its
connection was made, so a process id since reused by another session (or
on another server, after a failover) is never ended. A cancelled caller
does not wait: its backend is ended in the background. Behind a
transaction pooler, or on a pool the ledger was given, the client cannot
name its backend, and nothing is ended.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from datetime import datetime
from typing import Any, Final

__all__ = ["Backends"]

_log = logging.getLogger("dataoad")

#: This session's process id and start time, on the server's clock.
_WHO: Final = "SELECT pid, backend_start FROM pg_stat_activity WHERE pid = pg_backend_pid()"
_END: Final = (
    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE pid = $1 AND backend_start = $2"
)
_ALIVE: Final = "SELECT count(*) FROM pg_stat_activity WHERE pid = $1 AND backend_start = $2"
#: How many connections' names are kept (a pool's connections come and go).
_KEPT: Final = 4096
#: Seconds between looks at whether an ended backend has gone.
_POLL: Final = 0.005


class Backends:
    """The server backends of one pool's connections, by the process id each was given."""

    __slots__ = ("_ending", "_limit", "_started")

    def __init__(self, limit: float) -> None:
        self._started: dict[int, datetime] = {}
        self._ending: set[asyncio.Task[bool]] = set()  # held: the loop keeps tasks weakly
        #: Seconds the naming query may take: it is part of connecting.
        self._limit = limit

    async def note(self, conn: Any) -> None:
        """Pool ``init`` hook: remember the new connection's backend."""
        try:
            row = await conn.fetchrow(_WHO, timeout=self._limit)
        except BaseException:
            # The driver ends a connection whose init failed politely, with no
            # time limit of its own: after a partition that wait would hold the
            # call (and its cancellation) for good. Drop it at once instead.
            with contextlib.suppress(Exception):
                conn.terminate()
            raise
        if row is None:  # pragma: no cover - a session always sees its own row
            return
        if len(self._started) >= _KEPT:
            del self._started[next(iter(self._started))]  # the oldest name goes
        self._started[row[0]] = row[1]

    def named(self, conn: Any) -> tuple[int, datetime] | None:
        """The backend ``conn`` talks to, if it was noted (None: unknown)."""
        try:
            pid = conn.get_server_pid()
        except Exception:  # detached from its pool: nothing to name
            return None
        started = self._started.get(pid)
        return None if started is None else (pid, started)

    async def end(
        self, pool: Any, backend: tuple[int, datetime], limit: float | None, *, wait: bool
    ) -> None:
        """End ``backend`` and, with ``wait``, wait (within ``limit``) until it has gone.

        Never raises: when the end cannot be confirmed, the write's own
        error stands and the read-back judges as well as it can.
        """
        self._started.pop(backend[0], None)
        if not wait:
            task = asyncio.get_running_loop().create_task(self._ended(pool, backend, limit))
            self._ending.add(task)
            task.add_done_callback(self._ending.discard)
            return
        if not await self._ended(pool, backend, limit):
            _log.warning(
                "dataoad: the server backend (pid %s) of a PostgreSQL write left in doubt could "
                "not be seen to end within %s s; its read-back may see the write before it "
                "settles",
                backend[0],
                limit,
            )

    async def _ended(self, pool: Any, backend: tuple[int, datetime], limit: float | None) -> bool:
        # All of it within ``limit``: in a partition nothing can be confirmed,
        # and the write's caller must still be answered in bounded time.
        try:
            async with asyncio.timeout(limit):
                return await self._end_and_watch(pool, backend, limit)
        except Exception:  # TimeoutError among them
            return False

    @staticmethod
    async def _end_and_watch(pool: Any, backend: tuple[int, datetime], limit: float | None) -> bool:
        conn = await pool.acquire(timeout=limit)
        try:
            await conn.fetch(_END, *backend, timeout=limit)
            # The server tells no one when a backend is gone: look until it is.
            while await conn.fetchval(_ALIVE, *backend, timeout=limit):  # noqa: ASYNC110
                await asyncio.sleep(_POLL)
            return True
        except BaseException:
            with contextlib.suppress(Exception):
                conn.terminate()  # in doubt itself: never reused
            raise
        finally:
            with contextlib.suppress(Exception):
                await pool.release(conn)

    async def close(self) -> None:
        """Wait for the backends still being ended in the background."""
        if self._ending:
            await asyncio.gather(*self._ending, return_exceptions=True)
