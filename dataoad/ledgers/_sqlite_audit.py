"""The SQLite ledger's operator audit (a table beside the receipts), as a mixin.

A record that names a receipt is inserted and appended to that receipt's
own operator records in one transaction, under the writer lock: a crash
leaves both or neither. Kept apart so the ledger module stays one concept.
"""

from __future__ import annotations

import dataclasses
import sqlite3
from datetime import datetime
from typing import Any, Final

import aiosqlite

from dataoad._operator import OperatorRecord
from dataoad.ledgers import _sqlite_live as live
from dataoad.ledgers._audit import (
    AuditStatements,
    check_audit_filters,
    check_new_record,
    insert_values,
    record_of,
)
from dataoad.ledgers._codec import with_operator_record
from dataoad.ledgers._sqlite_file import clock_text
from dataoad.ledgers._sqlite_group import GroupWriter
from dataoad.ledgers._statements import SQLITE, Statement

__all__ = ["SQLiteAudit"]

_AUDIT: Final = AuditStatements("operator_audit", SQLITE, "receipts")


class SQLiteAudit:
    """``append_audit`` and ``audit`` over the ledger's connection and writer lock."""

    _group: GroupWriter

    async def _connection(self) -> aiosqlite.Connection:
        raise NotImplementedError

    async def _read(self, sql: str, params: Any) -> list[Any]:
        raise NotImplementedError

    def _params(self, statement: Statement, values: dict[str, Any]) -> tuple[Any, ...]:
        raise NotImplementedError

    async def append_audit(self, record: OperatorRecord) -> OperatorRecord:
        """Append ``record`` to the audit, and to its receipt's records, by the ledger's clock."""
        check_new_record(record)
        conn = await self._connection()
        return await live.on_thread(conn, lambda: self._append_now(conn._conn, record))

    def _append_now(self, db: sqlite3.Connection, record: OperatorRecord) -> OperatorRecord:
        def insert_and_append() -> OperatorRecord:
            values = {**insert_values(record), "now": 0}  # _params reads the clock
            at = db.execute(_AUDIT.insert.sql, self._params(_AUDIT.insert, values)).fetchone()
            stored = dataclasses.replace(record, at=datetime.fromisoformat(at[0]))
            if record.action_id is not None:
                self._append_to_receipt(db, stored)
            return stored

        return self._group.transaction(db, insert_and_append)

    @staticmethod
    def _append_to_receipt(db: sqlite3.Connection, stored: OperatorRecord) -> None:
        key = {"action_id": stored.action_id}
        found = db.execute(_AUDIT.receipt_records.sql, _AUDIT.receipt_records.bind(key)).fetchone()
        if found is None:
            return  # the receipt is gone (pruned or released): the audit alone keeps it
        records = with_operator_record(found[0], stored)
        update = _AUDIT.set_receipt_records
        db.execute(update.sql, update.bind({**key, "records": records}))

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
        statement, values = _AUDIT.listing(
            since=None if since is None else clock_text(since),
            operator=operator,
            namespace=namespace,
            action_id=action_id,
            limit=limit,
        )
        rows = await self._read(statement.sql, statement.bind(values))
        return [record_of(row, datetime.fromisoformat) for row in rows]
