"""A write that meets a connection the server ended is re-run on a live one.

After ``pg_terminate_backend`` while the event loop was busy, the ledger's
held connection looks open until the loop reads its end; the next statement
then fails on the client's side, though nothing reached the server. Every
statement is conditional (a claim on a fresh action id, a transition on
the exact version), so it is re-run once on a fresh connection: a first
run that did commit makes the second change nothing, and the proven-write
rule reads back either way. Outcomes are recorded, not lost.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import AsyncIterator
from typing import Any

import asyncpg
import pytest

from dataoad import ActionRunner, ActionStatus, PostgresLedger
from suite_support.services import PostgresTestTable


@pytest.fixture
async def ledger() -> AsyncIterator[PostgresLedger]:
    table = PostgresTestTable()
    await table.create()
    client = table.client(min_size=1, max_size=4)
    try:
        yield client
    finally:
        await client.close()
        await table.drop()


def _terminate_held_connection(ledger: Any, dsn: str | None) -> None:
    """End the ledger's held connection on the server while this loop is kept busy."""
    assert dsn is not None, "the ledger was opened without a DSN"
    held = ledger._lane._conn
    assert held is not None, "the ledger holds no connection (the test needs its pool of 2+)"
    pid = held.get_server_pid()

    async def terminate() -> None:
        admin = await asyncpg.connect(dsn)
        try:
            assert await admin.fetchval("SELECT pg_terminate_backend($1)", pid)
        finally:
            await admin.close()

    # On another thread with a loop of its own: this loop never runs meanwhile,
    # so the held connection's end is not read before the next statement.
    worker = threading.Thread(target=asyncio.run, args=(terminate(),))
    worker.start()
    worker.join()
    time.sleep(0.3)  # the server has closed the socket by now


async def test_the_claim_after_the_server_ended_the_held_connection(
    ledger: PostgresLedger,
) -> None:
    runner = ActionRunner(ledger)
    assert (await runner.execute("charge", lambda: 1, request={}, idempotency_key="a")).status is (
        ActionStatus.CONFIRMED
    )
    _terminate_held_connection(ledger, ledger._dsn)
    done = await runner.execute("charge", lambda: 2, request={}, idempotency_key="b")
    assert done.status is ActionStatus.CONFIRMED
    assert not done.replayed


async def test_the_outcome_after_the_server_ended_the_held_connection(
    ledger: PostgresLedger,
) -> None:
    runner = ActionRunner(ledger)
    await runner.execute("charge", lambda: 1, request={}, idempotency_key="a")
    calls: list[int] = []

    async def charge() -> str:
        calls.append(1)
        _terminate_held_connection(ledger, ledger._dsn)
        return "ch_2"

    for key in ("b", "c", "d"):
        done = await runner.execute("charge", charge, request={}, idempotency_key=key)
        assert done.status is ActionStatus.CONFIRMED, done
        stored = await ledger.find("charge", key)
        assert stored is not None
        assert stored.final_status is ActionStatus.CONFIRMED
    assert len(calls) == 3
