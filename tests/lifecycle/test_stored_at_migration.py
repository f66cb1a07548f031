"""Ledgers written before the ledger stamped its own time of storing migrate whole.

``tests/data/ledger-schema4.sqlite3`` was written by the last code before
``stored_at`` (``tests/data/make_v4_ledgers.py``): CONFIRMED, FAILED and
UNKNOWN receipts and one of namespace ``tenant``. The PostgreSQL table is
built with the schema steps of that code and filled with the same rows.
Rows written before carry their ``updated_at`` as their time of storing.
"""

from __future__ import annotations

import contextlib
import shutil
import sqlite3
import uuid
from pathlib import Path
from typing import Any

from dataoad import ActionRunner, ActionStatus, PostgresLedger, SQLiteLedger
from dataoad._clock import utc_now
from dataoad.ledgers._codec import COLUMNS
from dataoad.ledgers.postgres import SCHEMA_VERSION as PG_SCHEMA
from dataoad.ledgers.sqlite import SCHEMA_VERSION
from dataoad.ledgers.sqlite_reader import SQLiteReader
from suite_support import old_postgres_table
from suite_support.fixtures import read_only_fixture
from suite_support.services import postgres_dsn

V4 = Path(__file__).parents[1] / "data" / "ledger-schema4.sqlite3"
V4_COLUMNS = [c for c in COLUMNS if c not in ("stored_at", "operator_records")]


def v4_rows() -> list[dict[str, Any]]:
    with read_only_fixture(V4) as c:
        rows = c.execute(f"SELECT {', '.join(V4_COLUMNS)} FROM receipts").fetchall()
    return [dict(zip(V4_COLUMNS, row, strict=True)) for row in rows]


def test_the_fixture_is_what_schema_4_wrote() -> None:
    with read_only_fixture(V4) as c:
        assert c.execute("PRAGMA user_version").fetchone()[0] == 4
        columns = {row[1] for row in c.execute("PRAGMA table_info(receipts)")}
    assert columns == set(V4_COLUMNS)
    assert len(v4_rows()) == 4


async def _check_migrated(ledger: Any, before: dict[tuple[str, str], Any]) -> None:
    after = {(r.namespace, r.idempotency_key): r for r in await ledger.receipts()}
    assert after == before
    for receipt in after.values():
        # The best time such a row has: the writer's updated_at.
        assert receipt.stored_at == receipt.updated_at
    # Ages are now the ledger's: an expiry a day longer than the receipt's age still
    # replays, a second's frees the key. The fixture's receipts were stored when it was
    # written (2026-12-03), so the day is added to their age, not taken as the age: a
    # fixed day's expiry turned this test red a day after the fixture was made. (This
    # host's clock stands in for the ledger's here: both are this machine's.)
    runner = ActionRunner(ledger, lease=None)
    done = after[("", "done")]
    age = (utc_now() - done.stored_at).total_seconds()
    kept = await runner.execute(
        "charge",
        lambda: "again",
        request={"n": 1},
        idempotency_key="done",
        expires_after=age + 86_400,
    )
    assert kept.replayed
    assert kept.receipt.action_id == done.action_id
    fresh = await runner.execute(
        "charge", lambda: "again", request={"n": 1}, idempotency_key="done", expires_after=1
    )
    assert not fresh.replayed
    old = await ledger.get(done.action_id)
    assert old is not None
    assert old.retired_at is not None
    assert old.stored_at is not None
    assert old.stored_at > done.stored_at  # the retirement was stamped by the ledger
    # UNKNOWN never expires, however old.
    lost = await runner.execute(
        "charge", lambda: "x", request={"n": 3}, idempotency_key="lost", expires_after=0
    )
    assert lost.replayed
    assert lost.status is ActionStatus.UNKNOWN


async def test_a_schema_4_sqlite_file_is_read_unchanged_then_migrated(tmp_path: Path) -> None:
    path = tmp_path / "ledger.sqlite3"
    shutil.copy(V4, path)

    reader = SQLiteReader(path)
    before = {(r.namespace, r.idempotency_key): r for r in await reader.receipts()}
    assert len(before) == 4
    assert all(r.stored_at == r.updated_at for r in before.values())
    await reader.close()
    with contextlib.closing(sqlite3.connect(path)) as c:
        assert c.execute("PRAGMA user_version").fetchone()[0] == 4  # reading wrote nothing
    async with SQLiteLedger(path) as ledger:
        await _check_migrated(ledger, before)
    with contextlib.closing(sqlite3.connect(path)) as c:
        assert c.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
        by_age = [row[2] for row in c.execute("PRAGMA index_info(receipts_by_age)")]
    assert by_age == ["claim_state", "stored_at", "action_id"]


async def test_a_schema_3_postgres_table_is_migrated_keeping_every_receipt(tmp_path: Path) -> None:
    dsn = postgres_dsn()
    table = "t_" + uuid.uuid4().hex[:20]
    path = tmp_path / "ledger.sqlite3"
    shutil.copy(V4, path)

    reader = SQLiteReader(path)
    expected = {(r.namespace, r.idempotency_key): r for r in await reader.receipts()}
    await reader.close()
    ledger = PostgresLedger(dsn, table=table)
    qualified = f'"public"."{table}"'
    try:
        pool = await ledger._raw_pool()
        async with pool.acquire() as conn:
            # Exactly what the schema-3 code's migrate() created, and its rows.
            await old_postgres_table(conn, table, (1, 2, 3), v4_rows())
        assert await ledger.migrate() == 3
        assert await ledger.schema_version() == PG_SCHEMA
        await _check_migrated(ledger, expected)
    finally:
        pool = await ledger._raw_pool()
        await pool.execute(f"DROP TABLE IF EXISTS {qualified}")
        await pool.execute(f'DROP TABLE IF EXISTS "public"."{table}_schema"')
        await ledger.close()
