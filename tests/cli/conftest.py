"""The ledger every operator-command test runs against."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest

from dataoad import ActionRunner, SQLiteLedger
from dataoad.testing import ChargeFault, FakePaymentProvider
from suite_support import unstarted
from suite_support.cli import VERIFIER, Store
from suite_support.services import PostgresTestTable


@pytest.fixture(params=["sqlite", "postgres"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Store]:
    """A ledger with one UNKNOWN charge, one CONFIRMED one and one stranded claim."""
    table: PostgresTestTable | None = None
    if request.param == "postgres":
        table = PostgresTestTable()
        asyncio.run(table.create())
        url = table.dsn
        env = {"DATAOAD_LEDGER": url, "DATAOAD_LEDGER_TABLE": table.table}
    else:
        path = tmp_path / "ledger.sqlite3"
        url = f"sqlite:///{path}"
        env = {"DATAOAD_LEDGER": url}

    async def build() -> None:
        provider = FakePaymentProvider(charge_faults=[ChargeFault.TIMEOUT_AFTER_COMMIT])
        ledger = table.client() if table is not None else SQLiteLedger(tmp_path / "ledger.sqlite3")
        async with ledger:
            runner = ActionRunner(ledger)
            for key in ("order-1", "order-2"):
                await runner.execute(
                    "charge",
                    lambda key=key: provider.charge(
                        customer_id="c", amount_cents=1, client_reference=key
                    ),
                    request={"key": key},
                    idempotency_key=key,
                    provider_reference=key,
                )
            # A claim whose attempt never started (as a v0.1 runner left one).
            await unstarted(
                ledger, "order-3", action_name="refund", request={}, provider_reference=None
            )

    asyncio.run(build())
    (tmp_path / "ops_verifier.py").write_text(VERIFIER)
    yield Store(url, env, tmp_path)
    if table is not None:
        asyncio.run(table.drop())
