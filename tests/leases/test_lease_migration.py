"""Ledgers written by v0.1 (before leases) open, migrate and keep every receipt.

``tests/data/ledger-v0.1.sqlite3`` was written by v0.1's own code
(``tests/data/make_v01_ledgers.py``): CONFIRMED, FAILED and UNKNOWN
receipts, a PENDING claim stranded after its attempt started and one that
never started. The PostgreSQL table is built with v0.1's schema step and
filled with those same rows.
"""

from __future__ import annotations

import contextlib
import shutil
import sqlite3
from datetime import datetime
from pathlib import Path
from typing import cast

import pytest

from dataoad import (
    ActionInProgressError,
    ActionRunner,
    ActionStatus,
    PostgresLedger,
    SQLiteLedger,
)
from dataoad.ledgers.postgres import MIGRATIONS as PG_MIGRATIONS
from dataoad.ledgers.postgres import SCHEMA_VERSION as PG_SCHEMA
from dataoad.ledgers.sqlite import SCHEMA_VERSION
from dataoad.ledgers.sqlite_reader import SQLiteReader
from suite_support.fixtures import read_only_fixture
from suite_support.services import postgres_dsn, unique_table

V01 = Path(__file__).parents[1] / "data" / "ledger-v0.1.sqlite3"
KEYS = ["done", "declined", "lost", "stranded", "unstarted"]


def v01_rows() -> list[tuple[object, ...]]:
    with read_only_fixture(V01) as c:
        return c.execute("SELECT * FROM receipts ORDER BY idempotency_key").fetchall()


def test_the_fixture_is_what_v01_wrote() -> None:
    with read_only_fixture(V01) as c:
        assert c.execute("PRAGMA user_version").fetchone()[0] == 2
        columns = [row[1] for row in c.execute("PRAGMA table_info(receipts)")]
    assert len(columns) == 18
    assert "owner" not in columns
    # Column 2 is the idempotency key, a TEXT column.
    assert sorted(cast(str, r[2]) for r in v01_rows()) == sorted(KEYS)


async def test_a_v01_sqlite_file_is_read_unchanged_then_migrated(tmp_path: Path) -> None:
    path = tmp_path / "ledger.sqlite3"
    shutil.copy(V01, path)

    reader = SQLiteReader(path)
    before = {r.idempotency_key: r for r in await reader.receipts()}
    assert await reader.receipts(stale=True) == []  # no claim of v0.1 has a lease
    await reader.close()
    with contextlib.closing(sqlite3.connect(path)) as c:
        assert c.execute("PRAGMA user_version").fetchone()[0] == 2  # reading wrote nothing
    async with SQLiteLedger(path) as ledger:
        after = {r.idempotency_key: r for r in await ledger.receipts()}
        assert after == before
        for receipt in after.values():
            assert receipt.owner is None
            assert receipt.fencing_token == 1
            assert receipt.lease_expires_at is None
        assert after["done"].final_status is ActionStatus.CONFIRMED
        assert after["declined"].final_status is ActionStatus.FAILED
        assert after["lost"].final_status is ActionStatus.UNKNOWN
        assert after["stranded"].is_pending
        assert after["stranded"].attempts == 1
        # An unleased claim is never taken over: it waits for an operator, as in v0.1.
        runner = ActionRunner(ledger)
        with pytest.raises(ActionInProgressError):
            await runner.execute(
                "charge", lambda: "x", request={"n": 4}, idempotency_key="stranded"
            )
        await runner.release_unstarted(after["unstarted"].action_id)
        fresh = await runner.execute("charge", lambda: "y", request={}, idempotency_key="new")
        assert fresh.receipt.owner == runner.owner
    with contextlib.closing(sqlite3.connect(path)) as c:
        assert c.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION


async def test_a_v01_postgres_table_is_migrated_keeping_every_receipt(tmp_path: Path) -> None:
    dsn, table = postgres_dsn(), unique_table()
    path = tmp_path / "ledger.sqlite3"
    shutil.copy(V01, path)

    async with SQLiteLedger(path) as lite:
        expected = {r.idempotency_key: r for r in await lite.receipts()}
    ledger = PostgresLedger(dsn, table=table)
    try:
        pool = await ledger._raw_pool()
        qualified = f'"public"."{table}"'
        async with pool.acquire() as conn:
            # Exactly what v0.1's migrate() created, and its rows.
            for statement in PG_MIGRATIONS[1]:
                await conn.execute(statement.format(table=qualified))
            await conn.execute(
                f'CREATE TABLE "public"."{table}_schema" (version integer PRIMARY KEY, '
                "applied_at timestamptz NOT NULL DEFAULT now())"
            )
            await conn.execute(f'INSERT INTO "public"."{table}_schema" (version) VALUES (1)')
            for row in v01_rows():
                values = list(row)
                values[16] = datetime.fromisoformat(str(values[16]))
                values[17] = datetime.fromisoformat(str(values[17]))
                placeholders = ", ".join(f"${i + 1}" for i in range(18))
                await conn.execute(f"INSERT INTO {qualified} VALUES ({placeholders})", *values)
        assert await ledger.migrate() == 1
        assert await ledger.schema_version() == PG_SCHEMA
        stored = {r.idempotency_key: r for r in await ledger.receipts()}
        assert stored == expected
        assert all(r.fencing_token == 1 and r.owner is None for r in stored.values())
        assert await ledger.receipts(stale=True) == []
    finally:
        pool = await ledger._raw_pool()
        await pool.execute(f'DROP TABLE IF EXISTS "public"."{table}"')
        await pool.execute(f'DROP TABLE IF EXISTS "public"."{table}_schema"')
        await ledger.close()
