"""The ledger contract on PostgreSQL, under READ COMMITTED and SERIALIZABLE.

Every test gets its own table on the shared test server; peers are separate
pools (separate connections), as contenders on separate hosts would be.
"""

from __future__ import annotations

import asyncio

import pytest

from dataoad import (
    ActionPersistenceError,
    ActionRunner,
    InvalidArgumentError,
    Ledger,
    PostgresLedger,
)
from dataoad.testing import DurableLedgerContract, LeaseContract, LifecycleContract, ManualClock
from suite_support import REQUEST, CountingOperation
from suite_support.services import postgres_dsn, unique_table


class TestPostgresLedger(DurableLedgerContract, LeaseContract, LifecycleContract):
    """PostgresLedger at the server's default isolation, READ COMMITTED."""

    isolation = "read committed"

    @pytest.fixture(autouse=True)
    def _table(self) -> None:
        dsn = postgres_dsn()
        self.dsn = f"{dsn}?default_transaction_isolation={self.isolation.replace(' ', '%20')}"
        self.table = unique_table()

        async def create() -> None:
            async with PostgresLedger(self.dsn, table=self.table) as ledger:
                await ledger.migrate()

        asyncio.run(create())

    def make_ledger(self) -> Ledger:
        return PostgresLedger(self.dsn, table=self.table, min_size=1, max_size=4)

    def peer(self, ledger: Ledger) -> Ledger:
        return PostgresLedger(self.dsn, table=self.table, min_size=1, max_size=2)

    def reopen(self, ledger: Ledger) -> Ledger:
        return self.make_ledger()

    # Tests only: the statements read this clock instead of the server's.
    def make_leasing_ledger(self, clock: ManualClock) -> PostgresLedger:
        return PostgresLedger(self.dsn, table=self.table, min_size=1, max_size=4, clock=clock)

    def leasing_peer(self, ledger: object, clock: ManualClock) -> PostgresLedger:
        return PostgresLedger(self.dsn, table=self.table, min_size=1, max_size=2, clock=clock)


class TestPostgresLedgerSerializable(TestPostgresLedger):
    """The same contract when every statement runs SERIALIZABLE."""

    isolation = "serializable"


class TestPostgresLedgerThroughPgBouncer(TestPostgresLedger):
    """The whole contract through PgBouncer in transaction pooling mode: each transaction
    may get another server connection, so nothing may live in a session. The ledgers
    are built with the default options: they find the pooler themselves."""

    @pytest.fixture(autouse=True)
    def _table(self, pgbouncer: str) -> None:
        # PgBouncer drops the isolation startup setting: the server's default runs.
        self.dsn = pgbouncer
        self.table = unique_table()

        async def create() -> None:
            async with self.make_ledger() as ledger:
                await ledger.migrate()

        asyncio.run(create())

    def _ledger(self, size: int, clock: ManualClock | None = None) -> PostgresLedger:
        return PostgresLedger(
            self.dsn,
            table=self.table,
            min_size=1,
            max_size=size,
            clock=clock,
        )

    def make_ledger(self) -> PostgresLedger:
        return self._ledger(4)

    def peer(self, ledger: Ledger) -> Ledger:
        return self._ledger(2)

    def make_leasing_ledger(self, clock: ManualClock) -> PostgresLedger:
        return self._ledger(4, clock)

    def leasing_peer(self, ledger: object, clock: ManualClock) -> PostgresLedger:
        return self._ledger(2, clock)


async def test_a_ledger_told_there_is_no_pooler_breaks_behind_pgbouncer(
    pgbouncer: str,
) -> None:
    """Why the ledger looks: asyncpg's named prepared statements meet other sessions."""
    table = unique_table()
    async with PostgresLedger(pgbouncer, table=table, transaction_pooling=True) as ledger:
        await ledger.migrate()
    failures: list[BaseException] = []
    plain = PostgresLedger(
        pgbouncer, table=table, min_size=4, max_size=8, transaction_pooling=False
    )
    async with plain:
        for _ in range(20):
            results = await asyncio.gather(
                *[plain.find("charge", f"k{i}") for i in range(16)], return_exceptions=True
            )
            failures += [r for r in results if isinstance(r, BaseException)]
    assert failures, "named prepared statements survived transaction pooling"
    assert any("prepared statement" in str(f) for f in failures), failures[:3]


async def session_names(ledger: PostgresLedger, server_dsn: str) -> list[str]:
    """The application_name of the server sessions that ran the ledger's statements."""
    import asyncpg

    await ledger.find("charge", "k")
    conn = await asyncpg.connect(server_dsn)
    try:
        rows = await conn.fetch(
            "SELECT application_name FROM pg_stat_activity WHERE query LIKE $1",
            f"%{ledger.table}%",
        )
    finally:
        await conn.close()
    return [row["application_name"] for row in rows]


async def test_the_ledger_finds_pgbouncer_and_keeps_no_session_state_behind_it(
    pgbouncer: str,
) -> None:
    """Straight to the server it keeps its startup setting and prepared statements;
    behind PgBouncer it finds the pooler by itself and keeps neither."""
    server = postgres_dsn()
    async with PostgresLedger(server, table=unique_table()) as direct:
        await direct.migrate()
        assert "dataoad" in await session_names(direct, server)
        assert direct._transaction_pooling is False
    table = unique_table()
    async with PostgresLedger(pgbouncer, table=table, min_size=4, max_size=8) as pooled:
        await pooled.migrate()
        assert pooled._transaction_pooling is True
        # The concurrency that breaks a ledger told there is no pooler.
        for _ in range(20):
            await asyncio.gather(*[pooled.find("charge", f"k{i}") for i in range(16)])


async def test_a_session_setting_behind_a_pooler_is_refused_before_any_write(
    pgbouncer: str,
) -> None:
    table = unique_table()
    async with PostgresLedger(pgbouncer, table=table) as setup:
        await setup.migrate()
    ledger = PostgresLedger(pgbouncer, table=table, statement_timeout=5)
    op = CountingOperation("ok")
    with pytest.raises(ActionPersistenceError, match="ALTER ROLE") as info:
        await ActionRunner(ledger).execute("charge", op, request=REQUEST, idempotency_key="k")
    assert isinstance(info.value.__cause__, InvalidArgumentError)
    assert op.calls == 0
    await ledger.close()
    async with PostgresLedger(pgbouncer, table=table) as check:
        assert await check.find("charge", "k") is None  # nothing was written
    with pytest.raises(InvalidArgumentError, match="ALTER ROLE"):
        PostgresLedger(pgbouncer, statement_timeout=5, transaction_pooling=True)
