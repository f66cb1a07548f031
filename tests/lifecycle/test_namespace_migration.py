"""Ledgers written before namespaces (SQLite schema 3, PostgreSQL schema 2) migrate whole.

``tests/data/ledger-schema3.sqlite3`` was written by the last code before
namespaces (``tests/data/make_v3_ledgers.py``): CONFIRMED, FAILED and
UNKNOWN receipts, leased claims stranded before and after their attempt
started, and one taken over under fencing token 2. The PostgreSQL table is
built with that code's schema steps and filled with the same rows.
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

from dataoad import ActionRunner, ActionStatus, PostgresLedger, SQLiteLedger
from dataoad.ledgers import sqlite as sqlite_module
from dataoad.ledgers.postgres import MIGRATIONS as PG_MIGRATIONS
from dataoad.ledgers.postgres import SCHEMA_VERSION as PG_SCHEMA
from dataoad.ledgers.sqlite import SCHEMA_VERSION
from dataoad.ledgers.sqlite_reader import SQLiteReader
from dataoad.testing import make_receipt
from suite_support.fixtures import read_only_fixture
from suite_support.services import postgres_dsn

V3 = Path(__file__).parents[1] / "data" / "ledger-schema3.sqlite3"
KEYS = {"done", "declined", "lost", "stranded", "taken", "unstarted"}


def v3_rows() -> list[tuple[Any, ...]]:
    with read_only_fixture(V3) as c:
        return c.execute("SELECT * FROM receipts ORDER BY idempotency_key").fetchall()


def test_the_fixture_is_what_schema_3_wrote() -> None:
    with read_only_fixture(V3) as c:
        assert c.execute("PRAGMA user_version").fetchone()[0] == 3
        columns = [row[1] for row in c.execute("PRAGMA table_info(receipts)")]
    assert len(columns) == 21
    assert "namespace" not in columns
    assert {r[2] for r in v3_rows()} == KEYS


async def _check_migrated(ledger: Any, before: dict[str, Any]) -> None:
    """Every receipt kept as it was, in the default namespace; the key rules hold."""
    after = {r.idempotency_key: r for r in await ledger.receipts()}
    assert after == before
    for receipt in after.values():
        assert receipt.namespace == ""
        assert receipt.retired_at is None
    assert after["taken"].fencing_token == 2
    assert after["taken"].owner == "worker-b"
    assert after["done"].final_status is ActionStatus.CONFIRMED
    # The old key is still held, in the default namespace only.
    for key in KEYS:
        stored, created = await ledger.claim(make_receipt(idempotency_key=key))
        assert not created
        assert stored == after[key]
    elsewhere, created = await ledger.claim(make_receipt(idempotency_key="done", namespace="t"))
    assert created
    assert elsewhere.namespace == "t"
    # A definitive receipt written before namespaces can be reopened, and stays readable.
    runner = ActionRunner(ledger, lease=None)
    await runner.reopen(after["declined"].action_id)
    again = await runner.execute(
        "charge", lambda: "ok", request={"n": 2}, idempotency_key="declined"
    )
    assert again.status is ActionStatus.CONFIRMED
    assert not again.replayed
    old = await ledger.get(after["declined"].action_id)
    assert old is not None
    assert old.retired_at is not None
    assert old.final_status is ActionStatus.FAILED


async def test_a_schema_3_sqlite_file_is_read_unchanged_then_migrated(tmp_path: Path) -> None:
    path = tmp_path / "ledger.sqlite3"
    shutil.copy(V3, path)

    reader = SQLiteReader(path)
    before = {r.idempotency_key: r for r in await reader.receipts()}
    assert set(before) == KEYS
    assert {r.namespace for r in before.values()} == {""}
    assert await reader.receipts(namespace="t") == []
    await reader.close()
    with contextlib.closing(sqlite3.connect(path)) as c:
        assert c.execute("PRAGMA user_version").fetchone()[0] == 3  # reading wrote nothing
    async with SQLiteLedger(path) as ledger:
        await _check_migrated(ledger, before)
    with contextlib.closing(sqlite3.connect(path)) as c:
        assert c.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
        indexes = {row[1] for row in c.execute("PRAGMA index_list(receipts)")}
    assert {"receipts_by_key", "receipts_by_age"} <= indexes


async def test_a_failed_migration_leaves_the_schema_3_file_as_it_was(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "ledger.sqlite3"
    shutil.copy(V3, path)
    broken = (*sqlite_module.MIGRATIONS[4][:-1], "CREATE INDEX broken ON nowhere (x)")
    monkeypatch.setitem(sqlite_module.MIGRATIONS, 4, broken)

    with pytest.raises(sqlite3.OperationalError):
        async with SQLiteLedger(path):
            pass
    with contextlib.closing(sqlite3.connect(path)) as c:
        assert c.execute("PRAGMA user_version").fetchone()[0] == 3
        assert c.execute("SELECT * FROM receipts ORDER BY idempotency_key").fetchall() == (
            v3_rows()
        )


@pytest.mark.parametrize("name_length", [20, 48])
async def test_a_schema_2_postgres_table_is_migrated_keeping_every_receipt(
    tmp_path: Path, name_length: int
) -> None:
    dsn = postgres_dsn()
    # The longest table name allowed: PostgreSQL shortened its constraint's name.
    table = ("t_" + uuid.uuid4().hex * 2)[:name_length]
    path = tmp_path / "ledger.sqlite3"
    shutil.copy(V3, path)

    reader = SQLiteReader(path)
    expected = {r.idempotency_key: r for r in await reader.receipts()}
    await reader.close()
    ledger = PostgresLedger(dsn, table=table)
    try:
        pool = await ledger._raw_pool()
        qualified = f'"public"."{table}"'
        async with pool.acquire() as conn:
            # Exactly what the schema-2 code's migrate() created, and its rows.
            for step in (1, 2):
                for statement in PG_MIGRATIONS[step]:
                    await conn.execute(statement.format(table=qualified))
            await conn.execute(
                f'CREATE TABLE "public"."{table}_schema" (version integer PRIMARY KEY, '
                "applied_at timestamptz NOT NULL DEFAULT now())"
            )
            await conn.execute(f'INSERT INTO "public"."{table}_schema" (version) VALUES (1), (2)')
            for row in v3_rows():
                values = list(row)
                for index in (16, 17, 20):
                    if values[index] is not None:
                        values[index] = datetime.fromisoformat(str(values[index]))
                placeholders = ", ".join(f"${i + 1}" for i in range(21))
                await conn.execute(f"INSERT INTO {qualified} VALUES ({placeholders})", *values)
        assert await ledger.migrate() == 2
        assert await ledger.schema_version() == PG_SCHEMA
        await _check_migrated(ledger, expected)
        assert await ledger.migrate() == PG_SCHEMA  # twice is harmless
    finally:
        pool = await ledger._raw_pool()
        await pool.execute(f'DROP TABLE IF EXISTS "public"."{table}"')
        await pool.execute(f'DROP TABLE IF EXISTS "public"."{table}_schema"')
        await ledger.close()
