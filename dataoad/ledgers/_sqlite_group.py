"""Group commit for the SQLite ledger: concurrent writes share one transaction and one sync.

Every write a ledger call makes is one conditional statement. Alone, each
is its own transaction, so each pays for the writer lock and a sync to disk
(``synchronous=FULL``), and concurrent calls queue behind each other's
syncs. Here each write is put in a queue, and a flush is put straight on
the connection thread's queue (no task in between, so no cancellation can
lose it) unless one is queued already: writes that arrive while the thread
is busy (syncing the previous group) are run together by the next flush,
under one hold of the writer lock, in one ``BEGIN IMMEDIATE`` ...
``COMMIT``, with the ledger's clock read once. The flush answers the whole
group with one wake-up of the event loop, after the commit that holds its
writes.

* Every statement keeps its own condition. A statement SQLite refuses (a
  constraint, a bad binding) fails alone: SQLite undoes a failed statement
  and keeps the transaction. So does one whose parameters Python cannot
  build or bind: SQLite never ran it. Any other error (I/O, a full disk, memory)
  fails the whole group, as SQLite's documentation advises.
* If the group cannot be committed, every write in it fails with that
  error. The caller then reads its receipt back (the proven-write rule),
  exactly as after any write whose acknowledgement was lost.
* If a failed group cannot even be rolled back, the connection is left
  inside a transaction whose uncommitted writes its own reads would see:
  the writer is then ``broken`` and the ledger refuses every later read and
  write on that connection, so nothing uncommitted is ever taken as stored.
* A caller that gives up before the group holding its write has the writer
  lock withdraws it: it never runs later, when nobody waits for it.
* The look-ups of a group's claims are one read: a statement per look-up
  cost the connection's thread a hand-over of the interpreter lock each,
  and at high concurrency those reads took as long as the group's writes.
  If that read fails, each look-up runs alone, so a failure stays its own.
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
from typing import Any, Final, TypeVar

import aiosqlite

from dataoad._errors import LedgerClosedError
from dataoad.ledgers import _sqlite_live as live
from dataoad.ledgers._statements import Statement
from dataoad.ledgers._writer_lock import WriterLock

__all__ = ["BrokenConnectionError", "GroupWriter", "QueuedWrite", "answer"]

T = TypeVar("T")

#: A statement's arguments, with the ledger's clock (read once per group).
Params = Callable[[Statement, dict[str, Any], datetime | None], tuple[Any, ...]]
#: The look-ups of many writes as one read: what each ``look_up_key`` finds
#: (None: nothing), in their order.
LookUpTogether = Callable[[sqlite3.Connection, list[Any]], list[Any]]

#: Errors of one statement that SQLite undoes alone, keeping the transaction,
#: and those Python raises building or binding its parameters, before SQLite
#: runs anything of it (a value too large for an INTEGER, a lone surrogate, a
#: lease that is not finite): one caller's bad value is never another's error.
_STATEMENT_ERRORS: Final = (
    sqlite3.IntegrityError,
    sqlite3.DataError,  # a value over SQLite's length limit (SQLITE_TOOBIG)
    sqlite3.ProgrammingError,
    sqlite3.InterfaceError,
    KeyError,  # a statement's parameter missing from its values
    OverflowError,
    ValueError,  # UnicodeEncodeError among them
    TypeError,
)


class BrokenConnectionError(sqlite3.OperationalError):
    """A failed group could not be rolled back: this connection serves nothing more."""


@dataclasses.dataclass(slots=True, eq=False)
class QueuedWrite:
    """One queued write; its rows (or error) once a flush has run it."""

    statement: Statement
    values: dict[str, Any]
    #: Set on the caller's loop once the group that held it is over (None: no waiter).
    done: asyncio.Future[None] | None = None
    rows: list[Any] | None = None
    error: BaseException | None = None
    #: "new", "queued", "taken" (by a flush waiting for the lock), "running"
    #: (the lock is held: it runs), "answered" (by its look-up: it never runs)
    #: or "withdrawn" (by its caller: it never runs).
    state: str = "new"
    #: A read run by the flush before the writer lock; what it finds (not None)
    #: answers the entry instead of its write, which then never runs.
    look_up: Callable[[sqlite3.Connection], Any] | None = None
    found: Any = None
    #: What ``look_up`` reads, for a group's ``look_up_together`` (None: read alone).
    look_up_key: Any = None


class GroupWriter:
    """The write queue of one SQLite connection, flushed as groups on its thread."""

    def __init__(
        self,
        writer: WriterLock,
        busy_timeout: float,
        params: Params,
        clock: Callable[[], datetime] | None = None,
        look_up_together: LookUpTogether | None = None,
    ) -> None:
        self._writer = writer
        self._look_up_together = look_up_together
        self._busy_timeout = busy_timeout
        self._params = params
        self._clock = clock
        self._queue: list[QueuedWrite] = []
        self._lock = threading.Lock()
        self._flush_queued = False
        #: Set when a failed group could not be rolled back (see the module's notes).
        self.broken: BrokenConnectionError | None = None
        #: Sizes of the groups run, for tests and benchmarks (the latest 1,000 or so).
        self.group_sizes: list[int] = []

    def new_entry(
        self,
        statement: Statement,
        values: dict[str, Any],
        look_up: Callable[[sqlite3.Connection], Any] | None = None,
        look_up_key: Any = None,
    ) -> QueuedWrite:
        """A write not queued yet, answered on the running loop (see ``QueuedWrite.look_up``)."""
        return QueuedWrite(
            statement,
            values,
            asyncio.get_running_loop().create_future(),
            look_up=look_up,
            look_up_key=look_up_key,
        )

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
            self.withdraw(entry)  # given up before its group had the lock: it never runs
            raise
        return answer(entry)

    def _schedule(self, conn: aiosqlite.Connection) -> None:
        with self._lock:
            if self._flush_queued or not self._queue:
                return  # the flush already queued takes whatever is queued now
            self._flush_queued = True
        try:
            live.queue_on_thread(conn, lambda: self._flush_on(conn))
        except Exception as exc:  # closed: nothing was queued, and no flush will come
            self._fail_queued(exc)

    def _flush_on(self, conn: aiosqlite.Connection) -> None:
        """The job queued on ``conn``'s thread: the flush, which answers its writes itself.

        The job has no future of its own: answering one would wake the
        caller's loop a second time for every flush, after the wake-up that
        answers the group.
        """
        try:
            self.flush(conn._conn)
        except BaseException:
            # It could not run (the connection went away under it): answer what waits.
            self._fail_queued(LedgerClosedError("the ledger's connection stopped"))

    def _fail_queued(self, exc: Exception) -> None:
        with self._lock:
            group, self._queue = self._queue, []
            self._flush_queued = False
            for entry in group:
                entry.state = "running"
        self._fail_all(group, exc)
        _settle(group)

    def withdraw(self, entry: QueuedWrite) -> bool:
        """Take ``entry`` back unless its group already holds the lock; whether it was.

        A caller that gives up (cancelled, or its connection stopped) must
        not leave a write behind to run later, when nobody is waiting for it.
        """
        with self._lock:
            if entry.state == "running":
                return False
            if entry.state == "queued":
                self._queue.remove(entry)
            entry.state = "withdrawn"  # a put on its way, or a flush, will skip it
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
            taken, self._queue = self._queue, []
            self._flush_queued = False
            for entry in taken:
                entry.state = "taken"
        if not taken:
            return  # an earlier flush took these writes
        group: list[QueuedWrite] = []
        try:
            if self._look_up(db, taken):
                with self._writer.hold(self._busy_timeout):
                    with self._lock:  # from here on a write runs: no caller takes it back
                        group = [e for e in taken if e.state == "taken"]
                        for entry in group:
                            entry.state = "running"
                    if group:
                        self._run(db, group)
        except BaseException as exc:  # no lock, a broken connection, or no commit
            group = [e for e in taken if e.state not in ("withdrawn", "answered")]
            self._fail_all(group, exc)
        else:
            if group:
                self.group_sizes.append(len(group))
            if len(self.group_sizes) > 1000:
                del self.group_sizes[:500]
        _settle(taken)

    def _look_up(self, db: sqlite3.Connection, taken: list[QueuedWrite]) -> bool:
        """Run the look-ups of ``taken`` outside the writer lock; whether any write is left.

        A replay finds its key held and is answered from this read: it takes
        no writer lock and writes nothing. A write whose look-up found nothing
        still runs under its own condition, so a key claimed between the read
        and the write is refused by the write, never overwritten.
        """
        # Before reading, or waiting for the lock: a connection left inside a
        # failed group would read its uncommitted writes, and serves nothing.
        self.check_usable()
        try:
            db.in_transaction  # noqa: B018 - raises once the connection is closed
        except sqlite3.ProgrammingError:
            # Closed under the queue (the ledger's close ran first): said as such,
            # not as a statement's error.
            raise LedgerClosedError("the ledger was closed before this write ran") from None
        together = self._read_together(db, taken)
        left = False
        for entry in taken:
            if entry.look_up is not None and entry.state == "taken":
                try:
                    entry.found = (
                        together[id(entry)] if id(entry) in together else entry.look_up(db)
                    )
                except Exception as exc:  # this read alone failed: so does its entry
                    entry.error = exc
                if entry.found is not None or entry.error is not None:
                    with self._lock:
                        if entry.state == "taken":  # else withdrawn meanwhile: nobody waits
                            entry.state, entry.rows = "answered", []
                    continue
            left = left or entry.state == "taken"
        return left

    def _read_together(self, db: sqlite3.Connection, taken: list[QueuedWrite]) -> dict[int, Any]:
        """What the look-ups of ``taken`` find, read as one, by entry id ({}: read each alone)."""
        if self._look_up_together is None:
            return {}
        reading = [
            e
            for e in taken
            if e.look_up is not None and e.look_up_key is not None and e.state == "taken"
        ]
        if len(reading) < 2:
            return {}  # one look-up: its own statement, prepared once, is cheaper
        try:
            found = self._look_up_together(db, [e.look_up_key for e in reading])
            return {id(e): f for e, f in zip(reading, found, strict=True)}
        except Exception:
            return {}  # each look-up runs alone, and a failure stays its own

    def check_usable(self) -> None:
        """BrokenConnectionError once a failed group could not be rolled back (reads too:
        they would see its uncommitted writes)."""
        if self.broken is not None:
            raise copy.copy(self.broken)

    def transaction(self, db: sqlite3.Connection, body: Callable[[], T]) -> T:
        """On the connection's thread: ``body`` as one transaction under the writer lock."""
        with self._writer.hold(self._busy_timeout):
            self._check_idle(db)
            db.execute("BEGIN IMMEDIATE")
            try:
                result = body()
                db.execute("COMMIT")
            except BaseException:
                self._roll_back(db)
                raise
        return result

    def _check_idle(self, db: sqlite3.Connection) -> None:
        if self.broken is None and db.in_transaction:
            self._roll_back(db)  # left open by someone else: never build on it
        self.check_usable()

    def _run(self, db: sqlite3.Connection, group: list[QueuedWrite]) -> None:
        self._check_idle(db)
        now = None if self._clock is None else self._clock()
        if len(group) == 1:
            entry = group[0]
            try:
                entry.rows = self._execute(db, entry, now)
            except Exception as exc:
                entry.error = exc
            return
        db.execute("BEGIN IMMEDIATE")
        try:
            for entry in group:
                try:
                    entry.rows = self._execute(db, entry, now)
                except _STATEMENT_ERRORS as exc:
                    entry.error = exc  # undone by SQLite alone; the others go on
                if not db.in_transaction:
                    raise entry.error or sqlite3.OperationalError("transaction rolled back")
            db.execute("COMMIT")
        except BaseException:
            self._roll_back(db)
            raise

    def _execute(self, db: sqlite3.Connection, entry: QueuedWrite, now: datetime | None) -> Any:
        params = self._params(entry.statement, entry.values, now)
        return db.execute(entry.statement.sql, params).fetchall()

    def _roll_back(self, db: sqlite3.Connection) -> None:
        with contextlib.suppress(Exception):  # the group's own error is the one to report
            if db.in_transaction:
                db.execute("ROLLBACK")
        if db.in_transaction:
            self.broken = BrokenConnectionError(
                "a failed group of writes could not be rolled back; this ledger's connection "
                "is unusable: close the ledger and open it again"
            )

    @staticmethod
    def _fail_all(group: list[QueuedWrite], exc: BaseException) -> None:
        # Nothing of the group is stored: a write that ran answers with the
        # error too, never with rows a rollback took back.
        for entry in group:
            entry.rows, entry.error = None, exc


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
    if entry.rows is None:
        raise LedgerClosedError("the write was never run: its ledger stopped")
    return entry.rows
