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
