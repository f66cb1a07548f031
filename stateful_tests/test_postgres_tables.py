"""The runner machine's PostgreSQL tables: an emptied table is what ``migrate()`` leaves.

The machine starts every example on a table a finished example gave back,
emptied; a run is judged against an empty ledger, so an emptied table must
hold no receipt and no audit record, keep its schema, and take claims from
the first identity on, like a new one.
"""

from __future__ import annotations

import asyncio

import asyncpg

from dataoad import ActionRunner, DefinitiveFailure
from stateful_tests.postgres_tables import empty_table, give_back
from suite_support.services import postgres_dsn


def declined() -> None:
    raise DefinitiveFailure("card declined")


async def audit_identities(dsn: str, table: str) -> list[int]:
    conn = await asyncpg.connect(dsn)
    try:
        return [row[0] for row in await conn.fetch(f'SELECT seq FROM "{table}_audit"')]
    finally:
        await conn.close()


async def test_a_table_given_back_is_emptied_and_serves_like_a_new_one() -> None:
    table = await empty_table(postgres_dsn())
    ledger = table.client()
    runner = ActionRunner(ledger)
    failed = await runner.execute("charge", declined, request={"n": 1}, idempotency_key="a")
    await runner.reopen(failed.receipt.action_id)  # an audit record too
    assert len(await ledger.audit()) == 1
    await ledger.close()
    give_back(table)

    again = await empty_table(table.dsn)
    assert again is table  # reused, not made anew
    ledger = again.client()
    try:
        assert await ledger.receipts() == []
        assert await ledger.audit() == []
        assert await ledger.schema_version() == await ledger.migrate()  # nothing left to do
        runner = ActionRunner(ledger)
        first = await runner.execute("charge", declined, request={"n": 2}, idempotency_key="a")
        assert not first.replayed  # not the last example's receipt: the key was free
        await runner.reopen(first.receipt.action_id)
        assert len(await ledger.audit()) == 1
        assert await audit_identities(again.dsn, again.table) == [1]  # restarted, as if new
    finally:
        await ledger.close()
        await again.drop()


async def test_a_table_a_straggler_still_holds_is_never_reused() -> None:
    table = await empty_table(postgres_dsn())
    holder = await asyncpg.connect(table.dsn)
    try:
        # A client of the finished example still inside a transaction on the table.
        transaction = holder.transaction()
        await transaction.start()
        await holder.execute(f'LOCK TABLE "{table.table}" IN ACCESS SHARE MODE')
        give_back(table)
        fresh = await asyncio.wait_for(empty_table(table.dsn), timeout=30)
        assert fresh is not table
        assert fresh.table != table.table
        await transaction.rollback()
    finally:
        await holder.close()
    ledger = fresh.client()
    try:
        assert await ledger.receipts() == []
    finally:
        await ledger.close()
        await fresh.drop()
        await table.drop()
