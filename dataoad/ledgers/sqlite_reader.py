"""SQLiteReader: read-only inspection of a ledger file, for operators.

``receipts list`` and ``receipts show`` must work for someone who may only
read the file and its folder, must never write a byte (no schema on an
empty file, no writer lock, no journal files they can avoid) and must never
call a permission problem corruption. So the file is opened with SQLite's
read-only URI: ``immutable=1`` when no write-ahead log is present (every
committed receipt is then in the main file, and SQLite creates nothing),
plain ``mode=ro`` while a writer's log exists (its shared-memory file is
then there to read through).
"""

from __future__ import annotations

import asyncio
import os
import sqlite3
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Final

from dataoad._errors import InvalidArgumentError
from dataoad._lifecycle import DEFAULT_PRUNE_STATUSES
from dataoad._operator import OperatorRecord
from dataoad._receipt import ActionReceipt
from dataoad._status import ActionStatus
from dataoad.ledgers._audit import (
    AuditStatements,
    check_audit_filters,
    record_of,
    sqlite_receipt_records,
)
from dataoad.ledgers._codec import NO_OPERATOR_RECORDS, receipt_of
from dataoad.ledgers._pruning import DEFAULT_BATCH_SIZE, DeleteExact, NextBatch
from dataoad.ledgers._pruning import prune as run_prune
from dataoad.ledgers._sqlite_file import (
    APPLICATION_ID,
    SCHEMA_VERSION,
    LedgerFileError,
    clock_text,
    sqlite_clock,
)
from dataoad.ledgers._statements import SQLITE, Statement, Statements

__all__ = ["SQLiteReader"]

_SQL: Final = Statements("receipts", SQLITE)
#: A file written before the ledger's own time of storing (schema 4), before
#: namespaces (schema 3) or before leases too (schema 2) is read as if
#: migrated: it never is, since the reader writes nothing. Migration gives
#: such rows their ``updated_at`` as the time of storing, and so does this.
_NO_RECORDS: Final = f"'{NO_OPERATOR_RECORDS}' AS operator_records"
#: A file of schema 6 keeps its operator records in the audit alone: each
#: receipt's are rebuilt from it, as the migration to schema 7 does.
_SQL_BEFORE_RECEIPT_RECORDS: Final = Statements(
    "(SELECT *, "
    f"{sqlite_receipt_records('operator_audit', 'receipts.action_id')} AS operator_records "
    "FROM receipts)",
    SQLITE,
)
_SQL_BEFORE_AUDIT: Final = Statements(f"(SELECT *, {_NO_RECORDS} FROM receipts)", SQLITE)
_SQL_BEFORE_STORED_AT: Final = Statements(
    f"(SELECT *, updated_at AS stored_at, {_NO_RECORDS} FROM receipts)", SQLITE
)
_SQL_BEFORE_NAMESPACES: Final = Statements(
    "(SELECT *, '' AS namespace, NULL AS retired_at, updated_at AS stored_at, "
    f"{_NO_RECORDS} FROM receipts)",
    SQLITE,
)
_SQL_BEFORE_LEASES: Final = Statements(
    "(SELECT *, NULL AS owner, 1 AS fencing_token, NULL AS lease_expires_at, "
    f"'' AS namespace, NULL AS retired_at, updated_at AS stored_at, {_NO_RECORDS} "
    "FROM receipts)",
    SQLITE,
)
#: The first schemas with leases, with namespaces, and with ``stored_at``.
_LEASES: Final = 3
_NAMESPACES: Final = 4
_STORED_AT: Final = 5
#: The first schema with the operator audit.
_AUDIT_SCHEMA: Final = 6
#: The first schema that keeps each receipt's operator records with it.
_RECEIPT_RECORDS: Final = 7
_AUDIT: Final = AuditStatements("operator_audit", SQLITE, "receipts")


def _missing_permission(path: Path) -> str | None:
    """What this user may not do that reading ``path`` needs, or None."""
    if not os.access(path.parent, os.X_OK):
        return f"no search (x) permission on the folder {path.parent}"
    if not os.access(path, os.R_OK):
        return f"no read permission on {path}"
    return None


class SQLiteReader:
    """A read-only view of a SQLite ledger: the Inspection protocol, and nothing that writes."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        if not isinstance(path, str | os.PathLike) or str(path) in ("", ":memory:"):
            raise InvalidArgumentError("SQLiteReader needs the path of a ledger file")
        self.path = Path(path)
        self._conn: sqlite3.Connection | None = None
        self._sql = _SQL
        self._user_version = 0
        self._lock = asyncio.Lock()
        #: The clock every writer of the file reads (see ``SQLiteLedger``).
        self._now = sqlite_clock()

    def __repr__(self) -> str:
        return f"SQLiteReader({str(self.path)!r})"

    def _open(self) -> sqlite3.Connection:
        path = self.path
        if path.is_dir():
            raise LedgerFileError(f"{path} is a folder, not a ledger file")
        if not path.exists():
            raise LedgerFileError(f"no ledger file at {path}")
        if problem := _missing_permission(path):
            raise LedgerFileError(f"{path}: cannot read the ledger: {problem}")
        if path.stat().st_size == 0:
            raise LedgerFileError(f"{path} is empty: no ledger has been written there yet")
        wal = path.with_name(path.name + "-wal")
        # Without a log, committed receipts are all in the main file: read it
        # as immutable, so SQLite creates no -shm or -wal file of its own.
        mode = "mode=ro" if wal.exists() else "mode=ro&immutable=1"
        try:
            conn = sqlite3.connect(
                f"{path.resolve().as_uri()}?{mode}", uri=True, check_same_thread=False
            )
        except sqlite3.Error as exc:
            raise LedgerFileError(f"{path}: cannot be opened read-only: {exc}") from exc
        try:
            self._check(conn)
        except BaseException:
            conn.close()
            raise
        return conn

    def _check(self, conn: sqlite3.Connection) -> None:
        path = self.path
        try:
            application_id = conn.execute("PRAGMA application_id").fetchone()[0]
            user_version = conn.execute("PRAGMA user_version").fetchone()[0]
        except sqlite3.OperationalError as exc:
            # Not corruption: SQLite could not get at a file it needs.
            raise LedgerFileError(
                f"{path}: cannot be read: {exc} (a writer's -shm file may be unreadable "
                "to this user)"
            ) from exc
        except sqlite3.DatabaseError as exc:
            raise LedgerFileError(f"{path}: not a SQLite database, or corrupt: {exc}") from exc
        if application_id != APPLICATION_ID:
            raise LedgerFileError(
                f"{path}: not a Dataoad ledger (application_id {application_id:#x})"
            )
        if user_version > SCHEMA_VERSION:
            raise LedgerFileError(
                f"{path}: written with ledger schema {user_version}, newer than the "
                f"{SCHEMA_VERSION} this Dataoad understands; upgrade Dataoad to read it"
            )
        self._user_version = user_version
        if user_version >= _RECEIPT_RECORDS:
            self._sql = _SQL
        elif user_version >= _AUDIT_SCHEMA:
            self._sql = _SQL_BEFORE_RECEIPT_RECORDS
        elif user_version >= _STORED_AT:
            self._sql = _SQL_BEFORE_AUDIT
        elif user_version >= _NAMESPACES:
            self._sql = _SQL_BEFORE_STORED_AT
        elif user_version >= _LEASES:
            self._sql = _SQL_BEFORE_NAMESPACES
        else:
            self._sql = _SQL_BEFORE_LEASES

    async def _statements(self) -> Statements:
        async with self._lock:
            if self._conn is None:
                self._conn = await asyncio.to_thread(self._open)
            return self._sql

    async def _rows(self, statement: Statement, values: Mapping[str, Any]) -> list[Any]:
        async with self._lock:
            conn = self._conn
            assert conn is not None
            params = statement.bind(values)
            return await asyncio.to_thread(lambda: conn.execute(statement.sql, params).fetchall())

    async def get(self, action_id: str) -> ActionReceipt | None:
        """The receipt with this action id, or None."""
        get = (await self._statements())["get"]
        rows = await self._rows(get, {"action_id": action_id})
        return receipt_of(rows[0], datetime.fromisoformat) if rows else None

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
        """Stored receipts, oldest first, filtered like every ledger's listing.

        ``stale`` is judged by the clock a writing ``SQLiteLedger`` reads:
        SQLite's own, the host's.
        """
        listing, values = (await self._statements()).listing(
            final_status=final_status,
            pending=pending,
            stale=stale,
            now=clock_text(self._now()),
            namespace=namespace,
            action_name=action_name,
            idempotency_key=idempotency_key,
            action_id_prefix=action_id_prefix,
            since=None if since is None else since.astimezone(UTC).isoformat(),
            limit=limit,
            newest_first=newest_first,
        )
        rows = await self._rows(listing, values)
        return [receipt_of(row, datetime.fromisoformat) for row in rows]

    async def _ledger_now(self) -> datetime:
        return self._now()

    async def prune(
        self,
        *,
        completed_before: datetime | None = None,
        older_than: float | None = None,
        statuses: Sequence[ActionStatus] = DEFAULT_PRUNE_STATUSES,
        namespace: str | None = None,
        batch_size: int = DEFAULT_BATCH_SIZE,
        dry_run: bool = True,
    ) -> int:
        """How many receipts ``SQLiteLedger.prune`` would delete; a reader deletes nothing.

        Only ``dry_run=True`` is accepted (a reader never writes).
        """
        if dry_run is not True:
            raise InvalidArgumentError(
                "a SQLiteReader deletes nothing: only prune(dry_run=True) counts; "
                "open the file with SQLiteLedger to delete"
            )

        def steps(
            before: datetime, chosen: tuple[ActionStatus, ...], scope: str | None
        ) -> tuple[NextBatch, DeleteExact]:
            async def next_batch(
                after: tuple[datetime, str] | None, limit: int
            ) -> list[ActionReceipt]:
                statement, values = (await self._statements()).prune_batch(
                    statuses=chosen,
                    namespace=scope,
                    completed_before=before.astimezone(UTC).isoformat(),
                    after=None if after is None else (after[0].isoformat(), after[1]),
                    limit=limit,
                )
                rows = await self._rows(statement, values)
                return [receipt_of(row, datetime.fromisoformat) for row in rows]

            async def delete_nothing(batch: Sequence[ActionReceipt]) -> int:
                raise AssertionError("a dry run deletes nothing")  # pragma: no cover

            return next_batch, delete_nothing

        return await run_prune(
            steps,
            completed_before=completed_before,
            older_than=older_than,
            ledger_now=self._ledger_now,
            statuses=statuses,
            namespace=namespace,
            batch_size=batch_size,
            dry_run=True,
            before_delete=None,
        )

    async def audit(
        self,
        *,
        since: datetime | None = None,
        operator: str | None = None,
        namespace: str | None = None,
        action_id: str | None = None,
        limit: int | None = None,
    ) -> list[OperatorRecord]:
        """The operator records, newest first, filtered; pruning receipts keeps them."""
        check_audit_filters(since, operator, namespace, action_id, limit)
        await self._statements()
        if self._user_version < _AUDIT_SCHEMA:
            return []  # written before the audit: it holds no record
        statement, values = _AUDIT.listing(
            since=None if since is None else clock_text(since),
            operator=operator,
            namespace=namespace,
            action_id=action_id,
            limit=limit,
        )
        rows = await self._rows(statement, values)
        return [record_of(row, datetime.fromisoformat) for row in rows]

    async def close(self) -> None:
        """Close the file. Safe to call more than once."""
        conn, self._conn = self._conn, None
        if conn is not None:
            conn.close()
