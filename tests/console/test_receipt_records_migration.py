"""Ledgers written when only the audit held operator records give each receipt its own.

``tests/data/ledger-schema6.sqlite3`` was written by the last code before
receipts kept their operator records (``tests/data/make_v6_ledgers.py``): a
reopened FAILED receipt, a refused reopen of an UNKNOWN one, a recovered
stranded claim, a refused reopen of a receipt pruned afterwards, and the
prune. The PostgreSQL table is built with the schema steps of that code and
filled with the same rows and audit.
"""

from __future__ import annotations

import contextlib
import shutil
import sqlite3
import uuid
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

from dataoad import ActionRunner, PostgresLedger, RecoveryRefusedError, SQLiteLedger
from dataoad.ledgers._audit import AUDIT_FIELDS
from dataoad.ledgers._codec import COLUMNS
from dataoad.ledgers.sqlite_reader import SQLiteReader
from suite_support import old_postgres_table
from suite_support.fixtures import read_only_fixture
from suite_support.services import postgres_dsn

V6 = Path(__file__).parents[1] / "data" / "ledger-schema6.sqlite3"
V6_COLUMNS = tuple(c for c in COLUMNS if c != "operator_records")


def _read_v6(sql: str) -> list[Any]:
    with read_only_fixture(V6) as c:
        return c.execute(sql).fetchall()


def v6_rows() -> list[dict[str, Any]]:
    rows = _read_v6(f"SELECT {', '.join(V6_COLUMNS)} FROM receipts")
    return [dict(zip(V6_COLUMNS, row, strict=True)) for row in rows]


def v6_audit() -> list[tuple[Any, ...]]:
    return _read_v6(f"SELECT {', '.join(AUDIT_FIELDS)}, at FROM operator_audit ORDER BY seq")


def test_the_fixture_is_what_schema_6_wrote() -> None:
    assert _read_v6("PRAGMA user_version") == [(6,)]
    assert len(v6_rows()) == 4  # the tenant's receipt was pruned
    assert [(r[2], r[0]) for r in v6_audit()] == [
        ("reopen", "ana"),
        ("reopen", "bo"),
        ("reopen", "bo"),
        ("recover", "ana"),
        ("prune", "cy"),
    ]


async def _check_records(ledger: Any) -> None:
    """Each receipt holds exactly the audit's records naming it, oldest first."""
    audit = list(reversed(await ledger.audit()))
    assert len(audit) == 5
    by_key = {r.idempotency_key: r for r in await ledger.receipts()}
    assert set(by_key) == {"done", "declined", "lost", "stranded"}
    for key, verbs in (
        ("done", []),
        ("declined", [("reopen", "ana", "reopened")]),
        ("lost", [("reopen", "bo", "refused")]),
        ("stranded", [("recover", "ana", "UNKNOWN")]),
    ):
        receipt = by_key[key]
        own = [r for r in audit if r.action_id == receipt.action_id]
        assert list(receipt.operator_records) == own
        assert [(r.verb, r.operator, r.outcome.split(":")[0]) for r in own] == verbs
    for record in by_key["declined"].operator_records:
        assert type(record.at) is datetime
        assert record.at.tzinfo is not None
        assert record.reason == "card replaced"


async def _check_appends(ledger: Any) -> None:
    lost = (await ledger.receipts(idempotency_key="lost"))[0]
    with pytest.raises(RecoveryRefusedError):  # UNKNOWN: refused, and recorded
        await ActionRunner(ledger).reopen(lost.action_id, operator="dee", reason="again")
    after = await ledger.get(lost.action_id)
    assert [r.operator for r in after.operator_records] == ["bo", "dee"]
    assert after.operator_records[-1] == (await ledger.audit(limit=1))[0]
    assert after.version == lost.version  # a record is not a new version of the receipt


async def test_a_schema_6_sqlite_file_reads_its_records_then_keeps_them(tmp_path: Path) -> None:
    path = tmp_path / "ledger.sqlite3"
    shutil.copy(V6, path)
    reader = SQLiteReader(path)
    await _check_records(reader)  # rebuilt from the audit, writing nothing
    await reader.close()
    with contextlib.closing(sqlite3.connect(path)) as c:
        assert c.execute("PRAGMA user_version").fetchone()[0] == 6
    async with SQLiteLedger(path) as ledger:
        await _check_records(ledger)
        await _check_appends(ledger)
    with contextlib.closing(sqlite3.connect(path)) as c:
        assert c.execute("PRAGMA user_version").fetchone()[0] == 7
        stored = dict(c.execute("SELECT idempotency_key, operator_records FROM receipts"))
    assert stored["done"] == "[]"


async def test_a_schema_5_postgres_table_gives_its_receipts_their_records() -> None:
    dsn = postgres_dsn()
    table = "t_" + uuid.uuid4().hex[:20]
    ledger = PostgresLedger(dsn, table=table)
    try:
        pool = await ledger._raw_pool()
        async with pool.acquire() as conn:
            await old_postgres_table(conn, table, (1, 2, 3, 4, 5), v6_rows())
            for row in v6_audit():
                *fields, at = row
                await conn.execute(
                    f'INSERT INTO "public"."{table}_audit" ({", ".join(AUDIT_FIELDS)}, at) '
                    "VALUES ($1, $2, $3, $4, $5, $6, $7, $8)",
                    *fields,
                    datetime.fromisoformat(at),
                )
        assert await ledger.migrate() == 5
        await _check_records(ledger)
        await _check_appends(ledger)
    finally:
        pool = await ledger._raw_pool()
        for suffix in ("", "_schema", "_audit"):
            await pool.execute(f'DROP TABLE IF EXISTS "public"."{table}{suffix}"')
        await ledger.close()
