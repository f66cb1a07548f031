"""Group commit for the SQLite ledger: concurrent writes share one transaction and one sync.

Every write a ledger call makes is one conditional statement. Alone, each
is its own transaction, so each pays for the writer lock and a sync to disk
(``synchronous=FULL``), and concurrent calls queue behind each other's
syncs. Here each write is put in a queue, and a flush is queued on the
connection's thread unless one is queued already: writes that arrive while
the thread is busy (syncing the previous group) are run together by the
next flush, under one hold of the writer lock, in one ``BEGIN IMMEDIATE``
... ``COMMIT``, with the ledger's clock read once. The flush answers the
whole group with one wake-up of the event loop, after the commit that holds
its writes.

* Every statement keeps its own condition. A statement that raises fails
  alone: SQLite undoes a failed statement and keeps the transaction (an
  error that ends the transaction fails the group, below); one whose
  condition does not hold changes nothing, as before.
* If the group cannot be committed (or an error rolls the whole
  transaction back), every write in it fails with that error. The caller
  then reads its receipt back (the proven-write rule), exactly as after
  any write whose acknowledgement was lost.
* A lone write runs as before: one statement in autocommit.
* The writer lock is held for the whole group, waited for at most
  ``busy_timeout`` seconds; a group that cannot have it fails as a whole
  with LedgerBusyError and writes nothing.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import dataclasses
import sqlite3
import threading
from collections.abc import Callable
from datetime import datetime
from typing import Any

import aiosqlite

from dataoad.ledgers import _sqlite_live as live
from dataoad.ledgers._statements import Statement
from dataoad.ledgers._writer_lock import WriterLock

__all__ = ["GroupWriter", "QueuedWrite", "answer"]

#: A statement's arguments, with the ledger's clock (read once per group).
Params = Callable[[Statement, dict[str, Any], datetime | None], tuple[Any, ...]]


@dataclasses.dataclass(slots=True, eq=False)
class QueuedWrite:
    """One queued write; its rows (or error) once a flush has run it."""

    statement: Statement
    values: dict[str, Any]
    #: Set on the caller's loop once the group that held it is over (None: no waiter).
    done: asyncio.Future[None] | None = None
    rows: list[Any] | None = None
    error: BaseException | None = None
    #: "new", "queued", "taken" (by a flush) or "withdrawn" (by its caller).
    state: str = "new"


class GroupWriter:
    """The write queue of one SQLite connection, flushed as groups on its thread."""

    def __init__(
        self,
        writer: WriterLock,
        busy_timeout: float,
        params: Params,
        clock: Callable[[], datetime] | None = None,
    ) -> None:
        self._writer = writer
        self._busy_timeout = busy_timeout
        self._params = params
        self._clock = clock
        self._queue: list[QueuedWrite] = []
        self._lock = threading.Lock()
        self._flush_queued = False
        self._flushers: set[asyncio.Future[Any]] = set()
        #: Sizes of the groups run, for tests and benchmarks (the latest 1,000 or so).
        self.group_sizes: list[int] = []

    def new_entry(self, statement: Statement, values: dict[str, Any]) -> QueuedWrite:
        """A write not queued yet, answered on the running loop."""
        return QueuedWrite(statement, values, asyncio.get_running_loop().create_future())

    async def write(
        self, conn: aiosqlite.Connection, statement: Statement, values: dict[str, Any]
    ) -> list[Any]:
        """Run ``statement`` in the next group; its rows once that group committed."""
        return await self.flushed(conn, self.put(self.new_entry(statement, values)))

    async def flushed(self, conn: aiosqlite.Connection, entry: QueuedWrite) -> list[Any]:
        """``entry``'s rows once the group that holds it committed (its error if not)."""
        assert entry.done is not None
        self._schedule(conn)
        try:
            await entry.done
        except BaseException:
            self.withdraw(entry)  # given up before a flush took it: it must never run
            raise
        return answer(entry)

    def _schedule(self, conn: aiosqlite.Connection) -> None:
        with self._lock:
            if self._flush_queued or not self._queue:
                return  # the flush already queued takes whatever is queued now
            self._flush_queued = True
        flusher = asyncio.ensure_future(self._flush_on_thread(conn))
        self._flushers.add(flusher)
        flusher.add_done_callback(self._flushers.discard)

    async def _flush_on_thread(self, conn: aiosqlite.Connection) -> None:
        try:
            await live.on_thread(conn, lambda: self.flush(conn._conn))
        except BaseException as exc:  # the thread is gone (closed, stopped): nothing ran
            with self._lock:
                group, self._queue = self._queue, []
                self._flush_queued = False
                for entry in group:
                    entry.state = "taken"
            self._fail_all(group, exc)
            _settle(group)
            if not isinstance(exc, Exception):
                raise

    def withdraw(self, entry: QueuedWrite) -> bool:
        """Take ``entry`` out of the queue unless a flush took it; whether it was withdrawn.

        A caller that gives up (cancelled, or its connection stopped) must
        not leave a write behind to run later, when nobody is waiting for it.
        """
        with self._lock:
            if entry.state == "taken":
                return False
            if entry.state == "queued":
                self._queue.remove(entry)
            entry.state = "withdrawn"  # and a put still on its way will not queue it
            return True

    def enqueue(self, statement: Statement, values: dict[str, Any]) -> QueuedWrite:
        """Queue a write with no waiter for the next ``flush`` (``answer(entry)`` after it)."""
        return self.put(QueuedWrite(statement, values))

    def put(self, entry: QueuedWrite) -> QueuedWrite:
        """Queue ``entry`` for the next flush (unless its caller already withdrew it)."""
        with self._lock:
            if entry.state == "new":
                entry.state = "queued"
                self._queue.append(entry)
        return entry

    def flush(self, db: sqlite3.Connection) -> None:
        """On the connection's thread: run every queued write as one group, then answer it."""
        with self._lock:
            group, self._queue = self._queue, []
            self._flush_queued = False
            for entry in group:
                entry.state = "taken"
        if not group:
            return  # an earlier flush took these writes
        try:
            with self._writer.hold(self._busy_timeout):
                now = None if self._clock is None else self._clock()
                if len(group) == 1:
                    self._run_alone(db, group[0], now)
                else:
                    self._run_group(db, group, now)
        except BaseException as exc:  # no lock, or the group not committed
            self._fail_all(group, exc)
        else:
            self.group_sizes.append(len(group))
            if len(self.group_sizes) > 1000:
                del self.group_sizes[:500]
        _settle(group)

    @staticmethod
    def _fail_all(group: list[QueuedWrite], exc: BaseException) -> None:
        # Nothing of the group is stored: a write that ran answers with the
        # error too, never with rows a rollback took back.
        for entry in group:
            entry.rows, entry.error = None, exc

    def _run_alone(self, db: sqlite3.Connection, entry: QueuedWrite, now: datetime | None) -> None:
        try:
            entry.rows = db.execute(
                entry.statement.sql, self._params(entry.statement, entry.values, now)
            ).fetchall()
        except Exception as exc:
            entry.error = exc

    def _run_group(
        self, db: sqlite3.Connection, group: list[QueuedWrite], now: datetime | None
    ) -> None:
        db.execute("BEGIN IMMEDIATE")
        try:
            for entry in group:
                self._run_alone(db, entry, now)  # a failed statement is undone by SQLite
                if not db.in_transaction:
                    # SQLite rolled the whole transaction back (a full disk,
                    # an I/O error): nothing of the group is stored.
                    raise entry.error or sqlite3.OperationalError("transaction rolled back")
            db.execute("COMMIT")
        except BaseException:
            if db.in_transaction:
                db.execute("ROLLBACK")
            raise


def _settle(group: list[QueuedWrite]) -> None:
    """Wake the callers of ``group``: one call into each of their loops."""
    by_loop: dict[asyncio.AbstractEventLoop, list[asyncio.Future[None]]] = {}
    for entry in group:
        if entry.done is not None:
            by_loop.setdefault(entry.done.get_loop(), []).append(entry.done)
    for loop, futures in by_loop.items():
        with contextlib.suppress(RuntimeError):  # that loop is closed: nobody waits any more
            loop.call_soon_threadsafe(_set_all, futures)


def _set_all(futures: list[asyncio.Future[None]]) -> None:
    for future in futures:
        if not future.done():  # a cancelled caller's is done already
            future.set_result(None)


def answer(entry: QueuedWrite) -> list[Any]:
    """The rows of a flushed write, or its error (a copy of the group's, chained to it)."""
    if entry.error is not None:
        # One group's error may answer many callers: each raises its own copy.
        raise copy.copy(entry.error) from entry.error
    assert entry.rows is not None
    return entry.rows
