"""The runner machine's PostgreSQL tables: an emptied table, and the machine's reads of one.

The machine starts every example on a table a finished example gave back,
emptied; a run is judged against an empty ledger, so an emptied table must
hold no receipt and no audit record, keep its schema, and take claims from
the first identity on, like a new one. It then judges every step by one
snapshot of the table, so a snapshot must answer exactly as the ledger's own
``find`` and ``get`` do, for every kind of receipt a run leaves behind.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
from pathlib import Path

import asyncpg

from dataoad import ActionReceipt, ActionRunner, DefinitiveFailure, PostgresLedger
from stateful_tests.every_receipt import KEYS, every_receipt, read_alike
from stateful_tests.postgres_tables import PostgresStorageReads, empty_table, give_back
from suite_support.services import postgres_dsn

ROOT = Path(__file__).resolve().parents[1]


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


async def test_a_snapshot_answers_as_the_ledgers_own_reads() -> None:
    table = await empty_table(postgres_dsn())
    ledger = table.client()
    reads = PostgresStorageReads.of(ledger, table.dsn)
    try:
        made = await every_receipt(ledger)
        snapshot = await reads.snapshot()
        for namespace, key in KEYS:
            assert snapshot.find("charge", key, namespace) == await ledger.find(
                "charge", key, namespace
            )
        assert snapshot.find("charge", "b", "") is None  # retired: it holds no key
        for action_id in made.ids():
            assert read_alike(snapshot.get(action_id), await ledger.get(action_id))
        assert snapshot.get(made.failed.action_id) is not None  # retired, still readable
        # A row read again unchanged is decoded once; a changed row anew.
        before = (await reads.snapshot()).get(made.pending.action_id)
        assert before is snapshot.get(made.pending.action_id)
        assert await ledger.renew(made.pending.action_id, made.pending.fencing_token, 60.0)
        after = (await reads.snapshot()).get(made.pending.action_id)
        assert after is not None
        assert before is not None
        assert after is not before
        assert after == await ledger.get(made.pending.action_id)
        assert after.lease_expires_at != before.lease_expires_at
    finally:
        await reads.close()
        await ledger.close()
        await table.drop()


def test_a_ledger_whose_reads_differ_is_read_through_itself() -> None:
    class FindsOtherwise(PostgresLedger):
        async def find(self, action_name: str, idempotency_key: str, namespace: str = "") -> None:
            return None

    class WritesOtherwise(PostgresLedger):
        async def record(self, receipt: ActionReceipt) -> bool:
            return await super().record(receipt)

    dsn = "postgresql://nobody@127.0.0.1:1/none"  # never connected to
    assert PostgresStorageReads.reads_like_the_ledger(PostgresLedger(dsn))
    assert PostgresStorageReads.reads_like_the_ledger(WritesOtherwise(dsn))
    assert not PostgresStorageReads.reads_like_the_ledger(FindsOtherwise(dsn))
    assert not PostgresStorageReads.reads_like_the_ledger(object())


def test_the_tables_a_process_made_are_dropped_when_it_exits() -> None:
    dsn = postgres_dsn()
    made = subprocess.run(
        [
            sys.executable,
            "-c",
            "import asyncio\n"
            "from stateful_tests.postgres_tables import empty_table, give_back\n"
            "async def main():\n"
            f"    given = await empty_table({dsn!r})\n"
            "    give_back(given)\n"
            f"    kept = await empty_table({dsn!r})\n"  # the given-back one, emptied
            f"    other = await empty_table({dsn!r})\n"  # none free: a new one
            "    print(given.table, other.table, kept is given)\n"
            "asyncio.run(main())\n",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    first, second, reused = made.stdout.split()
    assert reused == "True"

    async def left() -> list[str]:
        conn = await asyncpg.connect(dsn)
        try:
            rows = await conn.fetch(
                "SELECT tablename FROM pg_tables WHERE tablename LIKE ANY($1::text[])",
                [f"{first}%", f"{second}%"],
            )
        finally:
            await conn.close()
        return [row[0] for row in rows]

    assert asyncio.run(left()) == []
