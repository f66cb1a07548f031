"""PostgresLedger's schema handling, its arguments and the missing-extra error.

Each schema test runs straight to the server and through PgBouncer in
transaction mode (the ``route`` fixture): migrations hold a transaction-level
advisory lock, so they must apply once through a pooler too.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
from collections.abc import Callable
from typing import Any

import pytest

from dataoad import (
    ActionPersistenceError,
    ActionRunner,
    ActionStatus,
    InvalidArgumentError,
    LedgerSchemaError,
    PostgresLedger,
)
from dataoad.ledgers.postgres import SCHEMA_VERSION as PG_SCHEMA
from suite_support import REQUEST, CountingOperation
from suite_support.services import PostgresRoute, postgres_dsn, unique_table


async def fresh_ledger(route: PostgresRoute, **options: Any) -> Any:
    options.setdefault("table", unique_table())
    ledger = route.ledger(**options)
    await ledger.migrate()
    return ledger


# -- schema ---------------------------------------------------------------------------------


async def test_ledger_refuses_a_database_without_the_schema(route: PostgresRoute) -> None:

    ledger = route.ledger(table=unique_table())
    op = CountingOperation("ok")
    with pytest.raises(LedgerSchemaError, match="ledger migrate"):
        await ledger.find("a", "k")
    with pytest.raises(ActionPersistenceError, match="ledger migrate") as info:
        await ActionRunner(ledger).execute("a", op, request=REQUEST, idempotency_key="k")
    assert isinstance(info.value.__cause__, LedgerSchemaError)
    assert op.calls == 0
    assert await ledger.schema_version() is None  # nothing was created
    await ledger.close()


async def test_concurrent_migrations_from_many_clients_apply_once(route: PostgresRoute) -> None:
    table = unique_table()

    ledgers = [route.ledger(table=table) for _ in range(8)]
    found = await asyncio.gather(*(ledger.migrate() for ledger in ledgers))
    assert sorted(found) == [0] + [PG_SCHEMA] * 7
    assert await ledgers[0].schema_version() == PG_SCHEMA
    assert await ledgers[0].migrate() == PG_SCHEMA  # idempotent
    for ledger in ledgers:
        await ledger.close()


async def test_newer_schema_is_refused_and_left_alone(route: PostgresRoute) -> None:

    ledger = await fresh_ledger(route)
    pool = await ledger._raw_pool()
    await pool.execute(f'INSERT INTO "public"."{ledger.table}_schema" (version) VALUES (99)')
    other = route.ledger(table=ledger.table)
    with pytest.raises(LedgerSchemaError, match="newer"):
        await other.find("a", "k")
    with pytest.raises(LedgerSchemaError, match="newer"):
        await other.migrate()
    assert await other.schema_version() == 99
    await other.close()
    await ledger.close()


async def test_schema_and_table_names_isolate_ledgers(route: PostgresRoute) -> None:

    schema = unique_table()
    a = await fresh_ledger(route, schema=schema, table="receipts")
    b = await fresh_ledger(route, table=unique_table())
    op = CountingOperation("ok")
    await ActionRunner(a).execute("a", op, request=REQUEST, idempotency_key="k")
    await ActionRunner(b).execute("a", op, request=REQUEST, idempotency_key="k")
    assert op.calls == 2
    assert len(await a.receipts()) == len(await b.receipts()) == 1
    await a.close()
    await b.close()


async def test_given_pool_is_used_and_not_closed() -> None:
    dsn = postgres_dsn()
    route = PostgresRoute("direct", dsn, dsn)

    import asyncpg

    await (await fresh_ledger(route, table="given_pool_table")).close()
    pool = await asyncpg.create_pool(dsn, min_size=1, max_size=2)
    async with PostgresLedger(pool=pool, table="given_pool_table") as ledger:
        result = await ActionRunner(ledger).execute(
            "a", CountingOperation("ok"), request=REQUEST, idempotency_key=unique_table()
        )
        assert result.status is ActionStatus.CONFIRMED
    assert await pool.fetchval("SELECT 1") == 1
    await pool.close()


@pytest.mark.parametrize(
    "kwargs",
    [
        {},
        {"dsn": ""},
        {"dsn": "postgresql://x", "pool": object()},
        {"dsn": "postgresql://x", "table": "Bad-Name"},
        {"dsn": "postgresql://x", "schema": 'x"; DROP TABLE y; --'},
        {"dsn": "postgresql://x", "min_size": 5, "max_size": 2},
        {"dsn": "postgresql://x", "statement_timeout": 0},
        {"dsn": "postgresql://x", "statement_timeout": 0.000999},  # "0" to the server: no limit
        {"dsn": "postgresql://x", "statement_timeout": 86_400.001},
        {"dsn": "postgresql://x", "serialization_retries": -1},
        {"dsn": "postgresql://x", "transaction_pooling": "yes"},
        {"dsn": "postgresql://x", "transaction_pooling": True, "statement_timeout": 5},
    ],
)
def test_bad_arguments_are_refused(kwargs: dict[str, Any]) -> None:
    with pytest.raises(InvalidArgumentError):
        PostgresLedger(**kwargs)


@pytest.mark.parametrize("seconds", [0.001, 86_400])
def test_a_statement_timeout_at_either_bound_is_taken(seconds: float) -> None:
    PostgresLedger("postgresql://x", statement_timeout=seconds)


def test_without_the_extra_import_works_and_the_error_names_the_extra() -> None:
    code = (
        "import sys; sys.modules['asyncpg'] = None\n"
        "import dataoad\n"
        "try:\n"
        "    dataoad.PostgresLedger('postgresql://localhost/x')\n"
        "except dataoad.MissingExtraError as exc:\n"
        "    print(exc)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
    )
    assert "'postgres' extra" in done.stdout
    assert 'pip install -e ".[postgres]"' in done.stdout


async def test_each_step_is_one_autocommit_statement_and_commits_are_synchronous(
    route: PostgresRoute, monkeypatch: pytest.MonkeyPatch
) -> None:
    """README: one autocommit statement per ledger step, no BEGIN/COMMIT; synchronous_commit never lowered."""
    import asyncpg

    calls: list[tuple[str, str]] = []
    connection = asyncpg.connection.Connection

    def recorded(name: str) -> Callable[..., Any]:
        real = getattr(connection, name)

        def call(self: Any, *args: Any, **kwargs: Any) -> Any:
            calls.append((name, args[0] if args and isinstance(args[0], str) else ""))
            return real(self, *args, **kwargs)

        return call

    ledger = await fresh_ledger(route)
    runner = ActionRunner(ledger)
    await runner.execute("charge", CountingOperation("ok"), request=REQUEST, idempotency_key="w")
    # Whatever reaches the server goes through one of these.
    for name in ("fetch", "fetchrow", "fetchval", "execute", "executemany", "transaction"):
        monkeypatch.setattr(connection, name, recorded(name))
    try:
        await runner.execute(
            "charge", CountingOperation("ok"), request=REQUEST, idempotency_key="k"
        )
    finally:
        monkeypatch.undo()
    assert {name for name, _ in calls} == {"fetch"}, calls
    statements = [sql.lstrip().split(None, 1)[0].upper() for _, sql in calls]
    # Two writes now: the claim (a data-modifying WITH, with the key's lookup
    # folded in) counting attempt 1, and the outcome; no lookup before them.
    assert statements == ["WITH", "UPDATE"], statements
    assert "INSERT INTO" in calls[0][1]
    assert not {"BEGIN", "COMMIT", "START", "SET"} & set(statements), statements
    pool = await ledger._raw_pool()
    assert await pool.fetchval("SHOW synchronous_commit") == "on"
    await ledger.close()
