"""PostgreSQL figures: PostgresLedger against a raw asyncpg loop and pgbench.

The server is ``DATAOAD_BENCH_POSTGRES_DSN`` when set, otherwise a throwaway
one started from the local binaries with fsync on (the durability the
ledger's users get). Without either, every figure says why it is skipped.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import subprocess
import tempfile
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

from dataoad import ActionRunner, PostgresLedger
from dataoad.testing._postgres_server import PostgresServer, PostgresUnavailableError

BODY = '{"attempts":[{"number":1,"started_at":"2026-11-30T00:00:00+00:00"}]}'
FLOOR_TABLE = """
CREATE TABLE IF NOT EXISTS bench_floor (
    id text PRIMARY KEY, name text NOT NULL, key text NOT NULL,
    state text NOT NULL, version integer NOT NULL, body text NOT NULL,
    UNIQUE (name, key)
)
"""
CLAIM = (
    "INSERT INTO bench_floor (id, name, key, state, version, body) VALUES ($1, 'charge', $2, "
    "'PENDING', 1, $3) ON CONFLICT (name, key) DO NOTHING RETURNING id"
)
START = "UPDATE bench_floor SET version = 2, body = $2 WHERE id = $1 AND version = 1 RETURNING id"
FINISH = (
    "UPDATE bench_floor SET version = 3, state = 'COMPLETED', body = $2 WHERE id = $1 "
    "AND version = 2 RETURNING id"
)


@contextlib.asynccontextmanager
async def server() -> AsyncIterator[tuple[str | None, PostgresServer | None, str]]:
    """(dsn, local server or None, why skipped)."""
    if dsn := os.environ.get("DATAOAD_BENCH_POSTGRES_DSN"):
        yield dsn, None, ""
        return
    try:
        import asyncpg  # noqa: F401
    except ImportError:
        yield (
            None,
            None,
            "skipped: asyncpg not installed (the postgres extra: pip install -e '.[postgres]')",
        )
        return
    try:
        local = PostgresServer(durable=True).start()
    except (PostgresUnavailableError, OSError) as exc:
        yield None, None, f"skipped: no server ({exc})"
        return
    try:
        yield local.dsn, local, ""
    finally:
        local.cleanup()


def durability_verdict(fsync: str, synchronous_commit: str) -> str:
    """What a server's settings make of its commits, as the report prints it.

    A server that does not sync (the test suite's runs with fsync off)
    makes every synchronous committer, Powertools above all, look several
    times faster, so ratios against them mean nothing on it.
    """
    settings = f"fsync={fsync}, synchronous_commit={synchronous_commit}"
    if fsync == "on" and synchronous_commit != "off":
        return f"{settings}: commits are durable"
    return f"{settings}: NOT durable; ratios against synchronous peers mean nothing here"


async def server_durability(dsn: str) -> str:
    """``durability_verdict`` of the server at ``dsn``, read from its own settings."""
    import asyncpg

    conn = await asyncpg.connect(dsn)
    try:
        fsync = await conn.fetchval("SHOW fsync")
        synchronous_commit = await conn.fetchval("SHOW synchronous_commit")
    finally:
        await conn.close()
    return durability_verdict(str(fsync), str(synchronous_commit))


async def raw_floor(dsn: str) -> tuple[Callable[[int], Awaitable[None]], Callable[[], Any]]:
    """The three statements on one asyncpg connection, no Dataoad."""
    import asyncpg

    conn = await asyncpg.connect(dsn)
    await conn.execute(FLOOR_TABLE)

    async def step(n: int) -> None:
        ident = uuid.uuid4().hex
        await conn.fetch(CLAIM, ident, ident, BODY)
        await conn.fetch(START, ident, BODY)
        await conn.fetch(FINISH, ident, BODY)

    return step, conn.close


def pgbench_rate(local: PostgresServer | None, dsn: str, seconds: int, clients: int = 1) -> Any:
    """Actions per second of pgbench running the same three statements, or a reason."""
    found = shutil.which("pgbench")
    binary = local.bindir / "pgbench" if local is not None else (Path(found) if found else None)
    if binary is None or not binary.exists():
        return "skipped: pgbench not found"
    k = "'b' || :client_id || '-' || :k"
    script = (
        "\\set k random(1, 1000000000)\n"
        + CLAIM.replace("$1", k).replace("$2", k).replace("$3", f"'{BODY}'")
        + ";\n"
        + START.replace("$1", k).replace("$2", f"'{BODY}'")
        + ";\n"
        + FINISH.replace("$1", k).replace("$2", f"'{BODY}'")
        + ";\n"
    )
    with tempfile.NamedTemporaryFile("w", suffix=".sql", delete=False) as handle:
        handle.write(script)
    try:
        done = subprocess.run(
            [
                str(binary),
                "-n",
                "-c",
                str(clients),
                "-j",
                str(min(clients, 2)),
                "-T",
                str(seconds),
                "-M",
                "prepared",
                "-f",
                handle.name,
                dsn,
            ],
            capture_output=True,
            text=True,
            check=False,
            timeout=seconds + 60,
        )
    finally:
        os.unlink(handle.name)
    match = re.search(r"tps = ([0-9.]+)", done.stdout)
    return float(match.group(1)) if match else f"skipped: pgbench failed: {done.stderr[-200:]}"


async def ledger(dsn: str, **options: Any) -> PostgresLedger:
    """A migrated PostgresLedger on a fresh table."""
    table = f"bench_{uuid.uuid4().hex[:12]}"
    created = PostgresLedger(dsn, table=table, **options)
    await created.migrate()
    return created


def runner_step(runner: ActionRunner, prefix: str) -> Callable[[int], Awaitable[Any]]:
    async def noop() -> None:
        return None

    async def step(n: int) -> Any:
        return await runner.execute(
            "charge", noop, request={"n": 1}, idempotency_key=f"{prefix}{n}"
        )

    return step


async def fill(ledger: PostgresLedger, rows: int, receipt: Callable[[int], Any]) -> None:
    """Insert ``rows`` receipts in bulk (COPY), as if they had accumulated."""
    from dataoad.ledgers._codec import WRITTEN, row_of

    pool = await ledger._ready_pool()
    async with pool.acquire() as conn:
        await conn.copy_records_to_table(
            ledger.table,
            schema_name=ledger.schema,
            columns=list(WRITTEN),
            records=[row_of(receipt(n)) for n in range(rows)],
        )
        # The server stamps stored_at on every write; rows that accumulated
        # were stored when they last changed (prune judges age by it).
        await conn.execute(f'UPDATE "{ledger.schema}"."{ledger.table}" SET stored_at = updated_at')


async def drop(ledger: PostgresLedger) -> None:
    """Drop a benchmark's table and close its ledger."""
    pool = await ledger._ready_pool()
    await pool.execute(f'DROP TABLE IF EXISTS "{ledger.schema}"."{ledger.table}"')
    await pool.execute(f'DROP TABLE IF EXISTS "{ledger.schema}"."{ledger.table}_schema"')
    await ledger.close()
