"""The ledger contract on PostgreSQL, under READ COMMITTED and SERIALIZABLE.

Every test gets its own table on the shared test server; peers are separate
pools (separate connections), as contenders on separate hosts would be.
"""

from __future__ import annotations

import asyncio

import pytest

from dataoad import Ledger, PostgresLedger
from dataoad.testing import DurableLedgerContract, LeaseContract, LifecycleContract, ManualClock
from stateful_tests.services import postgres_dsn, unique_table


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
    may get another server connection, so nothing may live in a session."""

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
            transaction_pooling=True,
        )

    def make_ledger(self) -> PostgresLedger:
        return self._ledger(4)

    def peer(self, ledger: Ledger) -> Ledger:
        return self._ledger(2)

    def make_leasing_ledger(self, clock: ManualClock) -> PostgresLedger:
        return self._ledger(4, clock)

    def leasing_peer(self, ledger: object, clock: ManualClock) -> PostgresLedger:
        return self._ledger(2, clock)


async def test_a_ledger_without_transaction_pooling_breaks_behind_pgbouncer(
    pgbouncer: str,
) -> None:
    """Why the option exists: asyncpg's named prepared statements meet other sessions."""
    table = unique_table()
    async with PostgresLedger(pgbouncer, table=table, transaction_pooling=True) as ledger:
        await ledger.migrate()
    failures: list[BaseException] = []
    async with PostgresLedger(pgbouncer, table=table, min_size=4, max_size=8) as plain:
        for _ in range(20):
            results = await asyncio.gather(
                *[plain.find("charge", f"k{i}") for i in range(16)], return_exceptions=True
            )
            failures += [r for r in results if isinstance(r, BaseException)]
    assert failures, "named prepared statements survived transaction pooling"
    assert any("prepared statement" in str(f) for f in failures), failures[:3]
