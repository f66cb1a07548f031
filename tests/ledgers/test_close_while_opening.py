"""``close()`` while a ledger's first call is still opening it: the ledger is closed.

The first call opens the file or the pool lazily. A ``close()`` that ran
meanwhile found nothing to close; the opening then finished, and the
"closed" ledger went on serving reads and writes on a connection nobody
would close. Now the opening call fails with LedgerClosedError, leaves
nothing open and writes nothing.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest

from dataoad import LedgerClosedError, PostgresLedger, SQLiteLedger
from dataoad.testing import unstarted_claim
from suite_support.services import PostgresTestTable


@pytest.fixture(params=["sqlite", "postgres"])
async def make_ledger(
    request: pytest.FixtureRequest, tmp_path: Path
) -> AsyncIterator[Callable[[], Any]]:
    if request.param == "sqlite":
        yield lambda: SQLiteLedger(tmp_path / "ledger.sqlite3")
        return
    table = PostgresTestTable()
    await table.create()
    try:
        yield table.client
    finally:
        await table.drop()


async def test_a_ledger_closed_while_its_first_call_opens_it_serves_nothing(
    make_ledger: Callable[[], Any],
) -> None:
    ledger = make_ledger()
    claim = asyncio.create_task(ledger.claim(unstarted_claim("charge", "k", {"amount": 1})))
    await asyncio.sleep(0)  # the claim is opening the file, or making the pool
    await ledger.close()
    with pytest.raises(LedgerClosedError):
        await claim
    with pytest.raises(LedgerClosedError):
        await ledger.find("charge", "k")
    if isinstance(ledger, SQLiteLedger):
        assert ledger._conn is None
    else:
        assert isinstance(ledger, PostgresLedger)
        assert ledger._pool is None
    async with make_ledger() as other:
        assert await other.find("charge", "k") is None  # nothing written
