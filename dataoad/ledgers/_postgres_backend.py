"""Ending the server backend of a write left in doubt, before anyone reads the write back.

A statement whose client gave up on it (its time limit, a broken
transport) may still be running on the server: waiting for a lock, or for
a synchronous standby to confirm its commit. Closing the client's socket
does not stop it, and it may commit long after. A read-back made meanwhile
finds the old state and takes the write for absent, then the write
appears (a claim stranded with its attempt counted, a takeover its taker
was told it lost). So before a write's error goes up to the proven-write
read-back, the backend that ran it is ended (``pg_terminate_backend``)
and waited for: a statement still waiting is rolled back, and a commit
that waited for a standby becomes visible.

Visible is not yet durable. Ended while it waited for a synchronous
standby, a commit is kept on this server alone ("committed locally, might
not have been replicated"): a failover to the standby loses it. Read back
then, the write looks proven, the runner invokes, and after the failover
the key is free again: the operation runs twice. So once a backend has
been ended in doubt, every statement of the ledger first waits for a
*settling* commit (``settle``): a transaction that writes to the
write-ahead log and commits, whose commit waits, like any write's, for the
synchronous standbys the server names. Its log position is past the ended
backend's commit, so once it returns, that commit has reached them too.
Until one returns (a partition), every statement fails as the write did,
and the read-back proves nothing. Without synchronous replication in
force a local commit is all there is: nothing needs settling, and no
settling commit is made.

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

from dataoad._errors import LedgerUnusableError

__all__ = ["Backends"]

_log = logging.getLogger("dataoad")

#: This session's process id and start time, on the server's clock.
_WHO: Final = "SELECT pid, backend_start FROM pg_stat_activity WHERE pid = pg_backend_pid()"
_END: Final = (
    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE pid = $1 AND backend_start = $2"
)
_ALIVE: Final = "SELECT count(*) FROM pg_stat_activity WHERE pid = $1 AND backend_start = $2"
#: A transactional message: the smallest statement that writes to the log
#: (an id alone writes nothing, and its commit waits for no standby), on any
#: ``wal_level``, for any role, with no table of its own.
_SETTLE: Final = "SELECT pg_logical_emit_message(true, 'dataoad', 'settle')"
#: Where that function is not granted: a temporary table's catalog rows are logged too.
_SETTLE_WITHOUT_MESSAGES: Final = "CREATE TEMPORARY TABLE dataoad_settle () ON COMMIT DROP"
#: The server's answers to ``_SETTLE`` that mean "not here", not "not now".
_NOT_GRANTED: Final = frozenset({"InsufficientPrivilegeError", "UndefinedFunctionError"})
#: Whether commits wait for standbys at all: without, a local commit is all there is.
_REPLICATION: Final = (
    "SELECT current_setting('synchronous_standby_names'), current_setting('synchronous_commit')"
)
#: How many connections' names are kept (a pool's connections come and go).
_KEPT: Final = 4096
#: Seconds between looks at whether an ended backend has gone.
_POLL: Final = 0.005


class Backends:
    """The server backends of one pool's connections, by the process id each was given."""

    __slots__ = ("_doubts", "_ending", "_limit", "_settled", "_started", "_unconfirmed")

    def __init__(self, limit: float) -> None:
        self._started: dict[int, datetime] = {}
        self._ending: set[asyncio.Task[bool]] = set()  # held: the loop keeps tasks weakly
        #: Seconds the naming query may take: it is part of connecting.
        self._limit = limit
        #: Backends ended in doubt so far, and how many of them a settling commit covers.
        self._doubts = 0
        self._settled = 0
        #: Backends ended whose end was not seen: each is ended again before settling
        #: (named by process id and start: a reused process id is another backend).
        self._unconfirmed: set[tuple[int, datetime]] = set()

    @property
    def unsettled(self) -> bool:
        """Whether a backend was ended in doubt since the last settling commit."""
        return self._settled < self._doubts

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
        # Counted, and its end listed, before anything awaits: a settle that
        # counts this doubt waits for this end too, an end waited for inline
        # as well (it would otherwise settle with the backend still running).
        self._doubts += 1
        task = asyncio.get_running_loop().create_task(self._ended(pool, backend, limit))
        self._ending.add(task)
        task.add_done_callback(self._ending.discard)
        task.add_done_callback(
            lambda done: None if not done.cancelled() and done.result() else self._lost(backend)
        )
        if not wait:
            return
        # Shielded: a caller cancelled meanwhile leaves the end running, as without ``wait``.
        if not await asyncio.shield(task):
            _log.warning(
                "dataoad: the server backend (pid %s) of a PostgreSQL write left in doubt could "
                "not be seen to end within %s s; its read-back may see the write before it "
                "settles",
                backend[0],
                limit,
            )

    def _lost(self, backend: tuple[int, datetime]) -> None:
        self._unconfirmed.add(backend)

    async def settle(self, pool: Any, limit: float | None) -> None:
        """Wait for a settling commit past every backend ended in doubt (see the module notes).

        Raises (TimeoutError, or the driver's error) when none can be had in
        ``limit``, or an ended backend cannot be seen gone: the statement
        that asked must not run, as its answer could rest on a commit no
        standby holds. The next statement tries again.
        """
        doubts = self._doubts
        if self._settled >= doubts:
            return
        if self._ending:  # every end under way comes first, and must be over
            _, pending = await asyncio.wait(set(self._ending), timeout=limit)
            if pending:
                raise TimeoutError(
                    "a server backend of a PostgreSQL write left in doubt is still being "
                    "ended; nothing is read or written until it is gone"
                )
        for backend in list(self._unconfirmed):
            if not await self._ended(pool, backend, limit):
                raise TimeoutError(
                    f"the server backend (pid {backend[0]}) of a PostgreSQL write left in doubt "
                    "could not be seen to end; nothing is read or written until it is"
                )
            self._unconfirmed.discard(backend)  # that one exactly, never one named alike
        conn = await pool.acquire(timeout=limit)
        try:
            names, commit = await conn.fetchrow(_REPLICATION, timeout=limit)
            if names.strip() and commit not in ("off", "local"):
                await _settling_commit(conn, limit)
        except BaseException:
            # Waiting for a standby still: ended, or it would hold a server
            # connection until the standby is back (one per statement tried).
            settling = self.named(conn)
            with contextlib.suppress(Exception):
                conn.terminate()
            if settling is not None:
                self._started.pop(settling[0], None)
                task = asyncio.get_running_loop().create_task(self._ended(pool, settling, limit))
                self._ending.add(task)
                task.add_done_callback(self._ending.discard)
            raise
        finally:
            with contextlib.suppress(Exception):
                await pool.release(conn)
        self._settled = max(self._settled, doubts)

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

    async def close(self, pool: Any, limit: float | None) -> None:
        """Wait for the backends still being ended in the background; end once more,
        on ``pool`` before it goes, each whose end was not seen.

        No statement comes after a close to end them again (as ``settle``
        does), and a write whose backend runs on may still commit: a claim
        stranded after its caller was told nothing was written.
        """
        if self._ending:
            await asyncio.gather(*self._ending, return_exceptions=True)
        # Together: in a partition each waits out ``limit``, and a close must stay bounded.
        unconfirmed = list(self._unconfirmed)
        ended = await asyncio.gather(*(self._ended(pool, b, limit) for b in unconfirmed))
        for backend, gone in zip(unconfirmed, ended, strict=True):
            if gone:
                self._unconfirmed.discard(backend)
                continue
            _log.warning(
                "dataoad: the server backend (pid %s) of a PostgreSQL write left in doubt could "
                "not be seen to end before the ledger closed; the write may still commit",
                backend[0],
            )


async def _settling_commit(conn: Any, limit: float | None) -> None:
    """Commit a transaction that wrote to the log, as ``conn``'s role may; its commit
    waits for the synchronous standbys."""
    try:
        await conn.fetchval(_SETTLE, timeout=limit)
        return
    except Exception as exc:
        if type(exc).__name__ not in _NOT_GRANTED:
            raise
    try:
        await conn.execute(_SETTLE_WITHOUT_MESSAGES, timeout=limit)
    except Exception as exc:
        if type(exc).__name__ not in _NOT_GRANTED:
            raise
        raise LedgerUnusableError(
            "a PostgreSQL write was left in doubt under synchronous replication, and this "
            "role may neither call pg_logical_emit_message nor create a temporary table, so "
            "no commit can show the standbys have it: nothing is read or written until one "
            "can. Grant one: GRANT EXECUTE ON FUNCTION pg_logical_emit_message(boolean, "
            "text, text) TO <role>, or GRANT TEMPORARY ON DATABASE <db> TO <role>"
        ) from exc
