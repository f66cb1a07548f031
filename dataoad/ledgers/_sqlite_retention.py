"""The SQLite ledger's retention (``prune``) over the shared batching loop, as a mixin.

Kept apart so the ledger module stays one concept: its reads and deletes go
through the ledger's own statements, connection and writer lock.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from datetime import datetime
from typing import Any

import aiosqlite

from dataoad._lifecycle import DEFAULT_PRUNE_STATUSES
from dataoad._receipt import ActionReceipt
from dataoad._status import ActionStatus
from dataoad.ledgers._codec import COLUMNS, receipt_of
from dataoad.ledgers._pruning import (
    DEFAULT_BATCH_SIZE,
    BeforeDelete,
    DeleteExact,
    NextBatch,
    prune,
)
from dataoad.ledgers._sqlite_file import clock_text
from dataoad.ledgers._statements import Statement, Statements

__all__ = ["SQLiteRetention"]

_STORED_AT = COLUMNS.index("stored_at")


class SQLiteRetention:
    """``prune`` over the ledger's ``_sql``, ``_read``, ``_write`` and clock."""

    _sql: Statements
    #: The ledger's clock (judges the cut-off of ``older_than``).
    _now: Callable[[], datetime]

    async def _connection(self) -> aiosqlite.Connection:
        raise NotImplementedError

    async def _read(self, sql: str, params: Any) -> list[Any]:
        raise NotImplementedError

    async def _write(self, statement: Statement, values: dict[str, Any]) -> list[Any]:
        raise NotImplementedError

    async def prune(
        self,
        *,
        completed_before: datetime | None = None,
        older_than: float | None = None,
        statuses: Sequence[ActionStatus] = DEFAULT_PRUNE_STATUSES,
        namespace: str | None = None,
        batch_size: int = DEFAULT_BATCH_SIZE,
        dry_run: bool = False,
        before_delete: BeforeDelete | None = None,
        operator: str | None = None,
        reason: str | None = None,
    ) -> int:
        """Delete completed receipts in ``statuses`` stored before the cut-off.

        The cut-off is ``completed_before``, or ``older_than`` seconds before
        now by the ledger's own clock; either is held against the time the
        ledger stored each receipt (``stored_at``), never a writer's clock.

        In batches of ``batch_size``, each one write statement under the
        writer lock, and each receipt only at the version it was read at;
        returns how many were deleted (with ``dry_run``, how many would be).
        A prune that deletes is audited: ``operator`` (default: the OS
        user) and ``reason`` go into its OperatorRecord.
        """
        return await prune(
            self._prune_steps,
            completed_before=completed_before,
            older_than=older_than,
            ledger_now=self._ledger_now,
            statuses=statuses,
            namespace=namespace,
            batch_size=batch_size,
            dry_run=dry_run,
            before_delete=before_delete,
            operator=operator,
            reason=reason,
            audit_to=self,
        )

    async def _ledger_now(self) -> datetime:
        """The ledger's clock, read for a prune's cut-off."""
        await self._connection()  # the file exists and is a ledger before its clock is read
        return self._now()

    def _prune_steps(
        self, before: datetime, chosen: tuple[ActionStatus, ...], scope: str | None
    ) -> tuple[NextBatch, DeleteExact]:

        # The cursor is the last row's stored text itself: re-encoding its
        # time would not match a row stored without microseconds (a file
        # from before stored_at was written with them), nor the reverse, and
        # a row-value comparison on text would read rows again or skip them.
        stored_texts: dict[tuple[datetime, str], str] = {}

        async def next_batch(after: tuple[datetime, str] | None, limit: int) -> list[ActionReceipt]:
            statement, values = self._sql.prune_batch(
                statuses=chosen,
                namespace=scope,
                completed_before=clock_text(before),
                after=None
                if after is None
                else (stored_texts.get(after) or clock_text(after[0]), after[1]),
                limit=limit,
            )
            rows = await self._read(statement.sql, statement.bind(values))
            batch = [receipt_of(row, datetime.fromisoformat) for row in rows]
            stored_texts.clear()
            if batch:
                last = batch[-1]
                assert last.stored_at is not None  # every stored receipt has one
                stored_texts[(last.stored_at, last.action_id)] = rows[-1][_STORED_AT]
            return batch

        async def delete_exact(batch: Sequence[ActionReceipt]) -> int:
            statement, values = self._sql.delete_exact([(r.action_id, r.version) for r in batch])
            return len(await self._write(statement, values))

        return next_batch, delete_exact
