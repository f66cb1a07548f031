"""Ledgers written before the operator audit gain it, keeping every receipt.

``tests/data/ledger-schema5.sqlite3`` was written by the last code before the
audit (``tests/data/make_v5_ledgers.py``): CONFIRMED, FAILED and UNKNOWN
receipts, one of namespace ``tenant`` and a stranded claim. The PostgreSQL
table is built with the schema steps of that code and filled with the same
rows.
"""

from __future__ import annotations

import contextlib
import shutil
import sqlite3
import uuid
from pathlib import Path
from typing import Any

from dataoad import ActionRunner, ActionStatus, PostgresLedger, SQLiteLedger
from dataoad.ledgers._codec import COLUMNS
from dataoad.ledgers.postgres import SCHEMA_VERSION as PG_SCHEMA
from dataoad.ledgers.sqlite import SCHEMA_VERSION
from dataoad.ledgers.sqlite_reader import SQLiteReader
from suite_support import confirmed, fixed_verifier, old_postgres_table
from suite_support.fixtures import read_only_fixture
from suite_support.services import postgres_dsn

V5 = Path(__file__).parents[1] / "data" / "ledger-schema5.sqlite3"


#: The columns of schema 5 and 6: all but each receipt's own operator records.
V5_COLUMNS = tuple(c for c in COLUMNS if c != "operator_records")


def v5_rows() -> list[dict[str, Any]]:
    with read_only_fixture(V5) as c:
        rows = c.execute(f"SELECT {', '.join(V5_COLUMNS)} FROM receipts").fetchall()
    return [dict(zip(V5_COLUMNS, row, strict=True)) for row in rows]


def test_the_fixture_is_what_schema_5_wrote() -> None:
    with read_only_fixture(V5) as c:
        assert c.execute("PRAGMA user_version").fetchone()[0] == 5
        tables = {row[0] for row in c.execute("SELECT name FROM sqlite_master")}
    assert "operator_audit" not in tables
    assert len(v5_rows()) == 5


async def _check_audited(ledger: Any, before: dict[tuple[str, str], Any]) -> None:
    after = {(r.namespace, r.idempotency_key): r for r in await ledger.receipts()}
    assert after == before
    assert await ledger.audit() == []
    lost = after[("", "lost")]
    result = await ActionRunner(ledger).recover_pending(
        lost.action_id, fixed_verifier(confirmed(ref="ref-3")), operator="ana", reason="migrated"
    )
    assert result.status is ActionStatus.CONFIRMED
    (record,) = await ledger.audit()
    assert (record.operator, record.verb, record.action_id) == ("ana", "recover", lost.action_id)
    settled = await ledger.get(lost.action_id)
    assert settled is not None
    assert settled.operator_records == (record,)


async def test_a_schema_5_sqlite_file_is_read_unchanged_then_gains_the_audit(
    tmp_path: Path,
) -> None:
    path = tmp_path / "ledger.sqlite3"
    shutil.copy(V5, path)
    reader = SQLiteReader(path)
    before = {(r.namespace, r.idempotency_key): r for r in await reader.receipts()}
    assert len(before) == 5
    assert await reader.audit() == []  # no audit yet, and reading wrote nothing
    await reader.close()
    with contextlib.closing(sqlite3.connect(path)) as c:
        assert c.execute("PRAGMA user_version").fetchone()[0] == 5
    async with SQLiteLedger(path) as ledger:
        await _check_audited(ledger, before)
    with contextlib.closing(sqlite3.connect(path)) as c:
        assert c.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION == 7
    reader = SQLiteReader(path)
    assert [r.operator for r in await reader.audit()] == ["ana"]  # read-only, too
    await reader.close()


async def test_a_schema_4_postgres_table_is_migrated_keeping_every_receipt() -> None:
    dsn = postgres_dsn()
    table = "t_" + uuid.uuid4().hex[:20]
    reader = SQLiteReader(V5)
    expected = {(r.namespace, r.idempotency_key): r for r in await reader.receipts()}
    await reader.close()
    ledger = PostgresLedger(dsn, table=table)
    try:
        pool = await ledger._raw_pool()
        async with pool.acquire() as conn:
            # Exactly what the schema-4 code's migrate() created, and its rows.
            await old_postgres_table(conn, table, (1, 2, 3, 4), v5_rows())
        assert await ledger.migrate() == 4
        assert await ledger.schema_version() == PG_SCHEMA == 6
        await _check_audited(ledger, expected)
    finally:
        pool = await ledger._raw_pool()
        for suffix in ("", "_schema", "_audit"):
            await pool.execute(f'DROP TABLE IF EXISTS "public"."{table}{suffix}"')
        await ledger.close()
