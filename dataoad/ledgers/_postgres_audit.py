"""The PostgreSQL ledger's operator audit (a table beside the receipts), as a mixin.

Kept apart so the ledger module stays one concept: its reads and writes go
through the ledger's own connection handling.
"""

from __future__ import annotations

import dataclasses
from datetime import datetime
from typing import Any

from dataoad._operator import OperatorRecord
from dataoad.ledgers._audit import (
    AuditStatements,
    check_audit_filters,
    check_new_record,
    insert_values,
    record_of,
)

__all__ = ["PostgresAudit"]


def _same(moment: Any) -> datetime:
    return moment  # type: ignore[no-any-return]


class PostgresAudit:
    """``append_audit`` and ``audit`` over the ledger's ``_read``/``_write_rows``."""

    _audit_sql: AuditStatements

    def _now(self) -> datetime | None:
        raise NotImplementedError

    async def _read(self, sql: str, *args: Any) -> list[Any]:
        raise NotImplementedError

    async def _write_rows(self, sql: str, *args: Any, conditional: bool = True) -> list[Any]:
        raise NotImplementedError

    async def append_audit(self, record: OperatorRecord) -> OperatorRecord:
        """Append ``record`` to the audit, and to its receipt's records, by the server's clock.

        Never run twice: an append has no condition that a second run would
        fail, so one whose acknowledgement was lost is reported, not repeated.
        """
        insert = self._audit_sql.insert_and_append
        values = {**insert_values(check_new_record(record)), "now": self._now()}
        rows = await self._write_rows(insert.sql, *insert.bind(values), conditional=False)
        return dataclasses.replace(record, at=rows[0][0])

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
        statement, values = self._audit_sql.listing(
            since=since, operator=operator, namespace=namespace, action_id=action_id, limit=limit
        )
        rows = await self._read(statement.sql, *statement.bind(values))
        return [record_of(row, _same) for row in rows]
