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

Every statement, held or pooled, has a client-side time limit: a server
that stops answering (a silent partition) cannot hold a call, or its
cancellation, past it. A connection whose statement timed out, was
cancelled or lost its transport is terminated at once, never waited on and
never reused: nobody knows what state its session is in. A write's server
backend is then ended as well (``_postgres_backend``), so that nobody reads
the write back while it can still commit, and every later statement waits
first for a commit that settles it (``settled``): one a synchronous standby
holds too.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
from collections.abc import Callable
from typing import Any, Final

from dataoad.ledgers._postgres_backend import Backends

__all__ = [
    "IDLE_SECONDS",
    "ConnectionLane",
    "fetch_bounded",
    "no_reset",
    "read_once_more",
    "write_conditionally",
]

#: Seconds without a statement after which the held connection goes back.
IDLE_SECONDS: Final = 60.0
#: Seconds between looks, while closing, at whether statements are still under way.
_QUIET_POLL: Final = 0.005


async def no_reset(connection: Any) -> None:
    """Pool release hook: the ledger leaves no session state, so skip the reset query."""


def _fatal(exc: BaseException) -> bool:
    """Whether a statement's error leaves its connection in an unknown state.

    A server's answer (a constraint, a serialization failure) leaves it fine;
    a time-out, a cancellation or a broken transport does not.
    """
    if isinstance(exc, TimeoutError | asyncio.CancelledError | OSError):
        return True
    module = type(exc).__module__ or ""
    if not module.startswith("asyncpg"):
        return True  # not the server's answer: trust nothing about the session
    name = type(exc).__name__
    return name in _FATAL_DRIVER_ERRORS or "Connection" in name


#: asyncpg errors after which a connection is not reused (besides "...Connection...").
_FATAL_DRIVER_ERRORS: Final = frozenset(
    {"InterfaceError", "InternalClientError", "AdminShutdownError", "CannotConnectNowError"}
)


async def fetch_bounded(
    pool: Any,
    sql: str,
    args: tuple[Any, ...],
    limit: float | None,
    backends: Backends | None = None,
    *,
    settling: Backends | None = None,
) -> list[Any]:
    """One statement on a pool connection, bounded; a connection left in doubt is terminated.

    ``backends``: the statement writes, and the server backend of a
    connection left in doubt is ended before the error goes up (see
    ``_postgres_backend``). ``settling``: the ledger's backends, settled
    once the connection is had, before the statement goes.
    """
    conn = await acquire_settled(pool, limit, settling)
    try:
        rows = list(await conn.fetch(sql, *args, timeout=limit))
    except BaseException as exc:
        await _return(pool, conn, exc, limit, backends)
        raise
    await pool.release(conn)
    return rows


async def _return(
    pool: Any, conn: Any, exc: BaseException, limit: float | None, backends: Backends | None
) -> None:
    """Give ``conn`` back after ``exc``: terminated first when it is in doubt.

    A write's backend is then ended too, and waited for unless the caller
    was cancelled: no read-back of the write may run while it still can
    commit.
    """
    if not _fatal(exc):
        with contextlib.suppress(Exception):
            await pool.release(conn)
        return
    backend = None if backends is None else backends.named(conn)
    with contextlib.suppress(Exception):
        conn.terminate()  # at once: closing politely would wait on a silent server
    with contextlib.suppress(Exception):  # a closing pool: the statement's error is the news
        await pool.release(conn)
    if backend is not None and backends is not None:
        cancelled = isinstance(exc, asyncio.CancelledError)
        await backends.end(pool, backend, limit, wait=not cancelled)


async def acquire_settled(pool: Any, limit: float | None, settling: Backends | None) -> Any:
    """A pool connection, had only once no backend ended in doubt is unsettled.

    Waiting for a connection (a busy pool, a new one to make) may take long
    enough for another statement's write to be ended in doubt meanwhile: a
    statement checked before that wait would then run past the doubt.
    """
    conn = await pool.acquire(timeout=limit)
    while settling is not None and settling.unsettled:
        await pool.release(conn)  # nothing ran on it
        await settling.settle(pool, limit)
        conn = await pool.acquire(timeout=limit)
    return conn


def _usable(conn: Any) -> bool:
    """Whether a held connection may still carry a statement."""
    try:
        return not conn.is_closed()
    except Exception:  # asyncpg detached it: the server ended it and the pool took it back
        return False


class ConnectionLane:
    """A connection of ``pool`` held for consecutive statements; busy or failed, the pool serves."""

    __slots__ = (
        "_busy",
        "_closing",
        "_conn",
        "_idle",
        "_last_used",
        "_statements",
        "_timer",
        "backends",
        "enabled",
        "pool",
        "timeout",
    )

    def __init__(
        self,
        pool: Any,
        *,
        owned: bool = True,
        timeout: float | None = None,
        backends: Backends | None = None,
    ) -> None:
        self.pool = pool
        #: Seconds each statement may take, on the client's side (None: no limit).
        self.timeout = timeout
        #: The pool's server backends, by name (None: they cannot be named).
        self.backends = backends
        size = getattr(pool, "get_max_size", None)
        self.enabled = owned and callable(size) and size() >= 2 and hasattr(pool, "acquire")
        self._conn: Any = None
        self._busy = False
        self._closing = False
        self._timer: asyncio.TimerHandle | None = None
        self._last_used = 0.0
        self._idle: asyncio.Task[None] | None = None  # kept: the loop holds tasks weakly
        #: Statements under way (``read_once_more``, ``write_conditionally``).
        self._statements = 0

    async def fetch(self, sql: str, *args: Any, writes: bool = False) -> list[Any]:
        """Run one statement on the held connection if it is free, else on a pool connection.

        ``writes``: a write, whose server backend is ended when it is left in doubt.
        """
        await self.settled()
        backends = self.backends if writes else None
        if self._busy or self._closing or not self.enabled:
            return await fetch_bounded(
                self.pool, sql, args, self.timeout, backends, settling=self.backends
            )
        # One event loop: nothing runs between this check and the claim below.
        self._busy = True
        try:
            if self._conn is not None and not _usable(self._conn):
                await self._give_back()
            if self._conn is None:
                self._conn = await acquire_settled(self.pool, self.timeout, self.backends)
            rows = list(await self._conn.fetch(sql, *args, timeout=self.timeout))
            self._note_use()
            return rows
        except BaseException as exc:
            # Broken, cancelled mid-statement or refused: off the lane, and
            # terminated first when its session is in doubt.
            conn, self._conn = self._conn, None
            if conn is not None:
                await _return(self.pool, conn, exc, self.timeout, backends)
            raise
        finally:
            self._busy = False
            if self._closing:
                await self._give_back()

    async def settled(self) -> None:
        """Return once no backend ended in doubt can leave a commit only this server holds.

        Every statement asks first, a read as well as a write: after a
        backend's end, either could otherwise answer from a commit a
        failover would lose (``_postgres_backend``). A comparison unless a
        backend was ended.
        """
        backends = self.backends
        if backends is not None and backends.unsettled:
            await backends.settle(self.pool, self.timeout)

    async def close(self) -> None:
        """Hand the connection back (now, or when the statement on it ends); take no other.

        Returns once no statement is under way: a write cancelled or timed out
        just before starts the end of its backend in its error handler, and the
        ledger's close must find that end (and wait for it) before the pool
        goes, or the write could still commit, unended, after the close.
        """
        self._closing = True
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if not self._busy:
            await self._give_back()
        while self._statements:  # noqa: ASYNC110 - only on close; each is bounded by its limit
            await asyncio.sleep(_QUIET_POLL)

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


class _UnderWay:
    """Counts a statement under way on ``lane`` for its whole life, handlers included."""

    __slots__ = ("_lane",)

    def __init__(self, lane: ConnectionLane) -> None:
        self._lane = lane

    def __enter__(self) -> None:
        self._lane._statements += 1

    def __exit__(self, *exc_info: object) -> None:
        self._lane._statements -= 1


#: Connection failures after which a read is retried on a fresh connection.
_RETRYABLE_READ_ERRORS: Final = (OSError, ConnectionError, asyncio.TimeoutError)


async def read_once_more(
    lane: ConnectionLane, sql: str, args: tuple[Any, ...], limit: float | None, driver: Any
) -> list[Any]:
    """A read; after a broken connection, once more on a fresh one (a read changes nothing)."""
    with _UnderWay(lane):
        # Settled first, outside the retry: a settling commit that timed out is not
        # a broken connection, and waiting for it twice would double the time limit.
        await lane.settled()
        try:
            return await lane.fetch(sql, *args)
        except (
            *_RETRYABLE_READ_ERRORS,
            driver.PostgresConnectionError,
            driver.AdminShutdownError,
            driver.InterfaceError,
        ):
            await lane.settled()  # the broken statement may have been a write's, ended since
            return await fetch_bounded(lane.pool, sql, args, limit, settling=lane.backends)


async def write_conditionally(
    lane: ConnectionLane,
    sql: str,
    args: tuple[Any, ...],
    limit: float | None,
    driver: Any,
    serialization_retries: int,
    *,
    conditional: bool = True,
    rerun_proves: Callable[[list[Any]], bool] | None = None,
) -> list[Any]:
    """A write, re-run only where that is known to be safe.

    ``conditional=False``: a write that would apply twice if run twice (an
    audit append), never re-run after its connection broke.
    ``rerun_proves``: whether the rows of a re-run after a broken connection
    answer for this write; where they do not, the first error stands (a
    claim's re-run that finds its own claim changed since the first run
    committed it).
    """
    with _UnderWay(lane):
        retries = serialization_retries
        await lane.settled()  # outside the retries: a settle that timed out is not a broken write
        while True:
            try:
                return await lane.fetch(sql, *args, writes=True)
            except (TimeoutError, asyncio.CancelledError):
                raise  # in doubt, and a second try would only wait as long again
            except (
                driver.PostgresConnectionError,
                driver.InterfaceError,
                driver.InternalClientError,
                OSError,
            ) as broken:
                if not conditional:
                    raise  # the first run may have committed: a second would append again
                # The connection was gone (the server ended it, the loop had not
                # read that yet): usually nothing reached the server. Every
                # statement is conditional, so it runs once more on a fresh
                # connection. Rows back: it is done now. None: the first run may
                # have committed it, so the first error stands and the
                # proven-write rule reads back to find out.
                await lane.settled()  # a write of the first run may have been ended in doubt
                rows = await fetch_bounded(
                    lane.pool, sql, args, limit, lane.backends, settling=lane.backends
                )
                if not rows or (rerun_proves is not None and not rerun_proves(rows)):
                    raise broken from None
                return rows
            except (driver.SerializationError, driver.DeadlockDetectedError):
                # The server rolled the statement back and said so: nothing was
                # written, so running the conditional statement again is safe (it
                # re-checks the version). Unlike a lost acknowledgement.
                if retries <= 0:
                    raise
                retries -= 1
                await asyncio.sleep(random.uniform(0, 0.002))
