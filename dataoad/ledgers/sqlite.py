"""SQLiteLedger: durable local receipts on one host, shared safely by processes.

Design notes (the why):

* Every transition is a single conditional SQL statement (``INSERT ... ON
  CONFLICT DO NOTHING RETURNING``, ``UPDATE ... WHERE version = ? RETURNING``).
  Concurrent calls' statements are committed in groups (``_sqlite_group``):
  one transaction and one sync to disk for every write that arrived while
  the previous group was being synced, each statement still conditional,
  each caller answered after the commit that holds its write. A lone write
  is one statement in autocommit, one hop to aiosqlite's connection thread.
  A claim's look-up of its key is queued with its insert and run by the
  same flush, so no claim costs a hop of its own; a replay is answered by
  that read and takes no writer lock.
* Uniqueness of ``(action_name, idempotency_key)`` is a table constraint, never
  a read-then-write.
* SQLite's own busy handler is unfair across processes (a waiting process
  polls with growing sleeps and can starve). Writers therefore queue on a
  kernel lock (``flock``) on a sidecar ``<file>.lock``, taken and released
  on the connection's thread around each group of writes (never while
  other code runs), and waited for at most ``busy_timeout`` seconds
  (``_writer_lock``). SQLite's busy timeout stays as a backstop for writers
  that do not take the lock. Opening a current ledger never takes it.
* ``synchronous=FULL`` by default: a committed transition survives power loss.
  ``NORMAL`` survives a crash of the process but may lose the last
  transactions on power loss or an OS crash; choose it knowingly.
"""

from __future__ import annotations

import asyncio
import functools
import os
import sqlite3
import threading
import weakref
from collections.abc import Iterable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from types import TracebackType
from typing import Any, Final, Literal

import aiosqlite

from dataoad._clock import LedgerClock
from dataoad._errors import InvalidArgumentError, LedgerClosedError, LedgerUnusableError
from dataoad._forks import FORKED_ADVICE, generation
from dataoad._ledger_arguments import (
    check_claim,
    check_key,
    check_listing,
    check_receipt,
    checked_action_id,
    checked_count,
    checked_lease,
    checked_older_than,
    required_lease,
)
from dataoad._ledger_rules import check_ledger_clock
from dataoad._receipt import ActionReceipt
from dataoad._status import ActionStatus, ClaimState
from dataoad.ledgers import _sqlite_live as live
from dataoad.ledgers._codec import values_of
from dataoad.ledgers._durability import DurabilityReport, opened, sqlite_durability
from dataoad.ledgers._sqlite_audit import SQLiteAudit
from dataoad.ledgers._sqlite_file import (
    APPLICATION_ID as APPLICATION_ID,
)
from dataoad.ledgers._sqlite_file import (
    SCHEMA_VERSION,
    ClockTexts,
    LedgerFileError,
    clock_text,
    sqlite_clock,
)
from dataoad.ledgers._sqlite_group import GroupWriter
from dataoad.ledgers._sqlite_holders import holder, holders
from dataoad.ledgers._sqlite_holders import stored_receipt as _receipt_of
from dataoad.ledgers._sqlite_retention import SQLiteRetention
from dataoad.ledgers._sqlite_schema import MIGRATIONS as MIGRATIONS
from dataoad.ledgers._sqlite_setup import initialise, open_file
from dataoad.ledgers._statements import SQLITE, Statement, Statements
from dataoad.ledgers._writer_lock import LedgerBusyError, WriterLock

__all__ = ["SCHEMA_VERSION", "LedgerBusyError", "LedgerFileError", "SQLiteLedger"]


_SQL: Final = Statements("receipts", SQLITE)


Synchronous = Literal["FULL", "NORMAL", "EXTRA"]


def _utc_text(moment: datetime) -> str:
    # The listing orders and filters by this text: times in one zone only
    # sort like the times they are (a receipt a caller wrote at +05:00 too).
    return moment.astimezone(UTC).isoformat()


def _values_of(receipt: ActionReceipt) -> dict[str, Any]:
    return values_of(receipt, _utc_text)


_holders: Final = functools.partial(holders, _SQL)


class SQLiteLedger(SQLiteAudit, SQLiteRetention):
    """A durable ledger in one SQLite file (WAL journal), safe across processes.

    ``SQLiteLedger(path)`` opens lazily on first use, so it can be handed to
    an ActionRunner directly; use ``async with`` or ``await ledger.close()``
    to release it. A new file is created readable by its owner only. A file
    that is not a Dataoad ledger, is corrupt, or has a newer schema raises
    LedgerFileError and is not modified. One instance serves one event loop.

    ``synchronous`` is ``"FULL"`` (default: commits survive power loss) or
    ``"NORMAL"`` (survives process crashes, may lose the latest commits on
    power loss). ``busy_timeout`` (seconds) bounds waits on writers that do
    not use Dataoad's writer queue.

    The ledger's clock judges every age (leases, ``expires_after``,
    retention). By default it is the clock SQLite itself reads (``'now'``),
    read once per group of writes while it holds the file's writer lock.
    Every process writing a WAL file runs on one host and reads that one
    clock, and no patch of Python's ``time`` or ``datetime`` reaches it, so
    none can take over a live lease or expire a fresh receipt because its
    own clock was made to run fast. ``clock`` (for tests) replaces it.
    """

    _sql = _SQL

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        synchronous: Synchronous = "FULL",
        busy_timeout: float = 5.0,
        clock: LedgerClock | None = None,
    ) -> None:
        if not isinstance(path, str | os.PathLike):
            raise InvalidArgumentError(f"path must be a str or PathLike, not {type(path).__name__}")
        if str(path) in ("", ":memory:"):
            raise InvalidArgumentError("SQLiteLedger needs a file path; use InMemoryLedger instead")
        if synchronous not in ("FULL", "NORMAL", "EXTRA"):
            raise InvalidArgumentError("synchronous must be 'FULL', 'NORMAL' or 'EXTRA'")
        if type(busy_timeout) not in (int, float) or not 0 <= busy_timeout <= 3600:
            raise InvalidArgumentError("busy_timeout must be a number of seconds in [0, 3600]")
        self.path = Path(path)
        self._now = sqlite_clock() if clock is None else check_ledger_clock(clock)
        self.synchronous: Synchronous = synchronous
        self.busy_timeout = float(busy_timeout)
        self._conn: aiosqlite.Connection | None = None
        self._open_locks: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, asyncio.Lock] = (
            weakref.WeakKeyDictionary()
        )
        self._installing = threading.Lock()
        self._writer = WriterLock(self.path.with_name(self.path.name + ".lock"))
        self._group = GroupWriter(
            self._writer, self.busy_timeout, self._params, self._now, look_up_together=_holders
        )
        self._closed = False
        self._finalizer: weakref.finalize[Any, Any] | None = None
        self._clock_texts = ClockTexts(None)  # read on the connection's thread only
        self._opened_in = generation()

    def __repr__(self) -> str:
        state = "closed" if self._closed else ("open" if self._conn else "not yet opened")
        return f"SQLiteLedger({str(self.path)!r}, synchronous={self.synchronous!r}, {state})"

    async def __aenter__(self) -> SQLiteLedger:
        await self._connection()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    # -- lifecycle -----------------------------------------------------------

    async def _connection(self) -> aiosqlite.Connection:
        if self._conn is not None:
            if self._opened_in != generation():
                raise LedgerUnusableError(
                    f"{self!r} was opened before this process forked: {FORKED_ADVICE}"
                )
            return self._conn
        if self._closed:
            raise LedgerClosedError(f"{self!r} is closed")
        # One opener per event loop at a time. An asyncio.Lock belongs to one
        # loop: shared by two (a sync runner's and the application's), the
        # loop that waited on it was never woken. Loops that open at once
        # each open a connection; the first installed serves, the rest close.
        async with self._opening_lock(asyncio.get_running_loop()):
            if self._conn is None:
                if self._closed:
                    raise LedgerClosedError(f"{self!r} is closed")
                conn, finalizer = await self._open()
                with self._installing:
                    installed = self._conn is None and not self._closed
                    if installed:
                        self._conn, self._finalizer = conn, finalizer
                        self._opened_in = generation()
                if not installed:
                    finalizer.detach()
                    if live.take(conn):
                        await live.close(conn)
                if self._closed:
                    # close() ran while the file was opening and found nothing
                    # to close: a closed ledger serves nothing, so this is closed.
                    raise LedgerClosedError(f"{self!r} was closed while it opened")
        serving = self._conn
        if serving is None:  # closed from another loop's thread since
            raise LedgerClosedError(f"{self!r} is closed")
        return serving

    def _opening_lock(self, loop: asyncio.AbstractEventLoop) -> asyncio.Lock:
        with self._installing:
            try:
                lock = self._open_locks.get(loop)
                if lock is None:
                    lock = self._open_locks[loop] = asyncio.Lock()
            except TypeError:  # a loop no weak reference can name: its callers each open
                lock = asyncio.Lock()
            return lock

    async def _open(self) -> tuple[aiosqlite.Connection, weakref.finalize[Any, Any]]:
        if not self.path.parent.is_dir():
            raise LedgerFileError(f"{self.path}: folder {self.path.parent} does not exist")
        version = await open_file(self.path, self._writer, self.busy_timeout)
        conn = await live.connect(str(self.path), self.busy_timeout)
        finalizer = weakref.finalize(self, live.stop, conn)
        try:
            if version != SCHEMA_VERSION:
                await live.on_thread(
                    conn,
                    functools.partial(
                        initialise, conn._conn, self.path, self._writer, self.busy_timeout
                    ),
                )
            busy = int(self.busy_timeout * 1000)
            settings = f"PRAGMA synchronous = {self.synchronous}; PRAGMA busy_timeout = {busy}"
            await live.on_thread(conn, lambda: conn._conn.executescript(settings))
        except BaseException:
            finalizer.detach()
            if live.take(conn):
                await live.close(conn)
            raise
        return conn, finalizer

    async def _let_go(self, conn: aiosqlite.Connection | None) -> None:
        """Close ``conn`` now, and never again when the ledger is collected."""
        if self._finalizer is not None:
            self._finalizer.detach()
        if conn is not None and live.take(conn):
            await live.close(conn)

    @classmethod
    async def open(
        cls, path: str | os.PathLike[str], *, require_durable: bool = False, **options: Any
    ) -> SQLiteLedger:
        """``SQLiteLedger(path, **options)``, opened; with ``require_durable``,
        LedgerDurabilityError (the ledger closed) unless ``durability()`` is safe."""
        return await opened(cls(path, **options), require_durable)  # type: ignore[no-any-return]

    async def durability(self) -> DurabilityReport:
        """Whether the file keeps every claim it acknowledged, through a crash or a power
        loss: the journal mode, ``synchronous`` and the file system."""
        return await sqlite_durability(lambda sql: self._read(sql, ()), self.path)

    async def close(self) -> None:
        """Close the connection. Safe to call more than once."""
        with self._installing:
            self._closed = True
            conn, self._conn = self._conn, None
        if conn is not None and self._opened_in != generation():
            # The parent's connection: its thread is not here to end it, and
            # the parent still uses it. Left alone, as the clock's is.
            if self._finalizer is not None:
                self._finalizer.detach()
            live.take(conn)
            return
        await self._let_go(conn)

    # -- statements ----------------------------------------------------------

    async def _read(self, sql: str, params: Iterable[Any]) -> list[Any]:
        conn = await self._connection()
        args = tuple(params)
        return await live.on_thread(conn, lambda: self._read_now(conn._conn, sql, args))

    def _read_now(self, db: sqlite3.Connection, sql: str, args: tuple[Any, ...]) -> list[Any]:
        # Checked on the thread, after any group queued before: a connection
        # left inside a failed transaction would show its uncommitted writes.
        self._group.check_usable()
        return db.execute(sql, args).fetchall()

    async def _write(self, statement: Statement, values: dict[str, Any]) -> list[Any]:
        conn = await self._connection()
        return await self._group.write(conn, statement, values)

    def _params(
        self, statement: Statement, values: dict[str, Any], now: datetime | None = None
    ) -> tuple[Any, ...]:
        """The statement's arguments, with the ledger's clock (``now``, or read now).

        Called under the writer lock, so a lease judged or granted here is
        judged at the moment the write happens, not when it was queued (a
        group reads the clock once: its writes commit at one moment).
        """
        if "now" in values:
            now = self._now() if now is None else now
            texts = self._clock_texts
            if texts.now is not now:  # the next group's clock (a group's writes share one)
                texts = self._clock_texts = ClockTexts(now)
            lease = values.get("lease")
            older_than = values.get("older_than")
            # The write's own dict, made for it by its caller: filled in, not copied.
            values["now"] = texts.text
            values["lease_end"] = None if lease is None else texts.after(lease)
            values["cutoff"] = (
                None if older_than is None else clock_text(now - timedelta(seconds=older_than))
            )
        return statement.bind(values)

    # -- the Ledger protocol -------------------------------------------------------

    async def claim(
        self, receipt: ActionReceipt, *, lease: float | None = None
    ) -> tuple[ActionReceipt, bool]:
        """Look the key up and claim it only if nobody holds it.

        The look-up and the conditional insert are queued together and run by the next
        flush, with concurrent callers': a held key is answered from the read (a replay
        takes no write lock and writes nothing); a free one is inserted in the group's commit.
        """
        check_claim(receipt)
        values = {**_values_of(receipt), "now": None, "lease": checked_lease(lease)}
        find = _SQL["find"]
        look_up = functools.partial(holder, find.sql, find.bind(values))
        while True:
            # Again on each try: the ledger may have been closed since the last.
            conn = await self._connection()
            entry = self._group.new_entry(
                _SQL["claim"],
                values,
                look_up,
                (receipt.namespace, receipt.action_name, receipt.idempotency_key),
            )
            made = await self._group.flushed(conn, self._group.put(entry))
            if entry.found is not None:
                return entry.found, False
            if made:
                _, expires, stored = made[0]
                return receipt.evolve(
                    lease_expires_at=None if expires is None else datetime.fromisoformat(expires),
                    stored_at=datetime.fromisoformat(stored),
                ), True
            # Claimed since the look (or claimed and released): look again.

    async def get(self, action_id: str) -> ActionReceipt | None:
        """The receipt with this action id, or None."""
        checked_action_id(action_id)
        rows = await self._read(_SQL["get"].sql, _SQL["get"].bind({"action_id": action_id}))
        return _receipt_of(rows[0]) if rows else None

    async def find(
        self, action_name: str, idempotency_key: str, namespace: str = ""
    ) -> ActionReceipt | None:
        """The receipt holding this key in ``namespace``, or None."""
        check_key(action_name, idempotency_key, namespace)
        find = _SQL["find"]
        rows = await self._read(
            find.sql,
            find.bind(
                {
                    "namespace": namespace,
                    "action_name": action_name,
                    "idempotency_key": idempotency_key,
                }
            ),
        )
        return _receipt_of(rows[0]) if rows else None

    async def _run(self, statement: Statement, values: dict[str, Any]) -> bool:
        return bool(await self._write(statement, values))

    async def _transition(
        self, statement: Statement, receipt: ActionReceipt, **condition: Any
    ) -> bool:
        values = _values_of(receipt)
        values.update(previous_version=receipt.version - 1, **condition)
        return await self._run(statement, values)

    async def start_attempt(self, receipt: ActionReceipt, *, lease: float | None = None) -> bool:
        """Store the next attempt (restarting the lease) if the stored claim allows that step."""
        check_receipt(receipt)
        lease = checked_lease(lease)
        if receipt.claim_state is not ClaimState.PENDING or len(receipt.attempt_records) != (
            receipt.attempts
        ):
            return False
        return await self._transition(
            _SQL["start_attempt"],
            receipt,
            previous_attempts=receipt.attempts - 1,
            now=None,
            lease=lease,
        )

    async def record(self, receipt: ActionReceipt) -> bool:
        """Store the next version if the stored claim allows exactly that step."""
        check_receipt(receipt)
        if len(receipt.attempt_records) != receipt.attempts:
            return False
        return await self._transition(_SQL["record"], receipt, now=None)

    async def take_over(self, receipt: ActionReceipt, *, lease: float) -> bool:
        """Hand an expired claim to ``receipt.owner`` under the next fencing token."""
        check_receipt(receipt)
        lease = required_lease(lease)
        if receipt.claim_state is not ClaimState.PENDING:
            return False
        return await self._transition(_SQL["take_over"], receipt, now=None, lease=lease)

    async def renew(self, action_id: str, fencing_token: int, lease: float) -> bool:
        """Restart the lease of a PENDING claim still held under ``fencing_token``."""
        checked_action_id(action_id)
        checked_count("fencing_token", fencing_token, 1)
        lease = required_lease(lease)
        return await self._run(
            _SQL["renew"],
            {"action_id": action_id, "fencing_token": fencing_token, "now": None, "lease": lease},
        )

    async def release(self, action_id: str, version: int) -> bool:
        """Delete an unstarted PENDING claim at exactly ``version``."""
        checked_action_id(action_id)
        checked_count("version", version, 1)
        return await self._run(_SQL["release"], {"action_id": action_id, "version": version})

    async def retire(self, receipt: ActionReceipt, *, older_than: float | None = None) -> bool:
        """Free the key of a definitive receipt at exactly the previous version.

        With ``older_than``, only if it was stored at least that many seconds
        ago by the ledger's clock (an expiry).
        """
        check_receipt(receipt)
        older_than = checked_older_than(older_than)
        if receipt.retired_at is None:
            return False
        return await self._transition(_SQL["retire"], receipt, now=None, older_than=older_than)

    # -- inspection ------------------------------------------------------------

    async def receipts(
        self,
        *,
        final_status: ActionStatus | None = None,
        pending: bool | None = None,
        stale: bool | None = None,
        action_name: str | None = None,
        idempotency_key: str | None = None,
        action_id_prefix: str | None = None,
        since: datetime | None = None,
        limit: int | None = None,
        namespace: str | None = None,
        newest_first: bool = False,
    ) -> list[ActionReceipt]:
        """Stored receipts, oldest first, optionally filtered (``since``: created at or after)."""
        check_listing(
            final_status=final_status,
            pending=pending,
            stale=stale,
            action_name=action_name,
            idempotency_key=idempotency_key,
            action_id_prefix=action_id_prefix,
            since=since,
            limit=limit,
            namespace=namespace,
            newest_first=newest_first,
        )
        listing, values = _SQL.listing(
            namespace=namespace,
            final_status=final_status,
            pending=pending,
            stale=stale,
            now=clock_text(self._now()),
            action_name=action_name,
            idempotency_key=idempotency_key,
            action_id_prefix=action_id_prefix,
            # Stored times are UTC ISO 8601 text, which sorts like the times.
            since=None if since is None else since.astimezone(UTC).isoformat(),
            limit=limit,
            newest_first=newest_first,
        )
        return [_receipt_of(row) for row in await self._read(listing.sql, listing.bind(values))]
