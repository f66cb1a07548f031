"""The PostgreSQL ledger's held connection: no pool checkout for consecutive statements.

It must save the checkout without changing anything else: concurrency still
gets pool connections, a pool of one is never starved, a broken or cancelled
connection goes back to the pool, and closing hands it back, even to a pool
the ledger was given.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from dataoad import ActionRunner, ActionStatus, PostgresLedger
from dataoad.ledgers import _postgres_lane
from dataoad.ledgers._postgres_lane import ConnectionLane, no_reset
from stateful_tests.services import postgres_dsn, unique_table
from tests.support import REQUEST, CountingOperation
from tests.test_postgres_faults import fresh_ledger


def _count_checkouts(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    import asyncpg

    acquired: list[int] = []
    real = asyncpg.pool.Pool.acquire

    def counted(self: Any, *args: Any, **kwargs: Any) -> Any:
        acquired.append(1)
        return real(self, *args, **kwargs)

    monkeypatch.setattr(asyncpg.pool.Pool, "acquire", counted)
    return acquired


def test_consecutive_calls_check_nothing_out_of_the_pool(monkeypatch: pytest.MonkeyPatch) -> None:
    dsn = postgres_dsn()

    async def scenario() -> None:
        ledger = await fresh_ledger(dsn, max_size=4)
        runner = ActionRunner(ledger)
        try:
            await runner.execute("a", CountingOperation("ok"), request=REQUEST, idempotency_key="w")
            acquired = _count_checkouts(monkeypatch)
            for key in ("k1", "k2", "k1"):  # two first calls and a replay
                await runner.execute(
                    "a", CountingOperation("ok"), request=REQUEST, idempotency_key=key
                )
            monkeypatch.undo()
            assert acquired == []  # five statements, all on the held connection
        finally:
            await ledger.close()

    asyncio.run(scenario())


def test_concurrent_calls_use_the_pool_and_a_pool_of_one_is_never_starved() -> None:
    dsn = postgres_dsn()

    async def scenario(max_size: int) -> None:
        ledger = await fresh_ledger(dsn, min_size=1, max_size=max_size)
        runner = ActionRunner(ledger)
        operation = CountingOperation("ok")
        try:
            results = await asyncio.wait_for(
                asyncio.gather(
                    *(
                        runner.execute("a", operation, request=REQUEST, idempotency_key=f"k{i}")
                        for i in range(32)
                    )
                ),
                timeout=60,
            )
            assert all(r.status is ActionStatus.CONFIRMED for r in results)
            assert operation.calls == 32  # one per key, whichever connection served it
            assert len(await ledger.receipts()) == 32
        finally:
            await ledger.close()

    asyncio.run(scenario(1))
    asyncio.run(scenario(3))


def test_closing_hands_the_connection_back_and_a_given_pool_is_never_held() -> None:
    dsn = postgres_dsn()

    async def scenario() -> None:
        import asyncpg

        table = unique_table()
        own = PostgresLedger(dsn, table=table, min_size=2, max_size=2)
        await own.migrate()
        await ActionRunner(own).execute(
            "a", CountingOperation("ok"), request=REQUEST, idempotency_key="k1"
        )
        pool = await own._raw_pool()
        assert pool.get_idle_size() == 1  # one held by the ledger
        lane = own._lane
        assert lane is not None
        await asyncio.wait_for(own.close(), timeout=30)
        assert lane._conn is None  # handed back before the pool closed
        # A given pool belongs to its owner, who may close it while the
        # ledger lives: the ledger never keeps one of its connections out.
        given = await asyncpg.create_pool(dsn, min_size=2, max_size=2, reset=no_reset)
        ledger = PostgresLedger(pool=given, table=table)
        await ActionRunner(ledger).execute(
            "a", CountingOperation("ok"), request=REQUEST, idempotency_key="k2"
        )
        assert given.get_idle_size() == 2
        await asyncio.wait_for(given.close(), timeout=30)  # the ledger still open
        await ledger.close()

    asyncio.run(scenario())


def test_a_broken_held_connection_goes_back_and_the_next_read_works() -> None:
    dsn = postgres_dsn()

    async def scenario() -> None:
        ledger = await fresh_ledger(dsn, max_size=3)
        try:
            await ActionRunner(ledger).execute(
                "a", CountingOperation("ok"), request=REQUEST, idempotency_key="k"
            )
            lane = ledger._lane
            assert lane is not None
            assert lane._conn is not None
            held_pid = lane._conn.get_server_pid()
            pool = await ledger._raw_pool()
            await pool.execute("SELECT pg_terminate_backend($1)", held_pid)
            # The read fails on the dead connection, which goes back to the
            # pool; the read is retried once on a pool connection.
            found = await ledger.find("a", "k")
            assert found is not None
            assert found.final_status is ActionStatus.CONFIRMED
            again = await ledger.find("a", "k")
            assert again == found
            assert lane._conn is not None
            assert lane._conn.get_server_pid() != held_pid
        finally:
            await ledger.close()

    asyncio.run(scenario())


def test_a_statement_cancelled_on_the_held_connection_leaves_it_usable() -> None:
    dsn = postgres_dsn()

    async def scenario() -> None:
        import asyncpg

        pool = await asyncpg.create_pool(dsn, min_size=1, max_size=2, reset=no_reset)
        lane = ConnectionLane(pool)
        try:
            assert lane.enabled
            task = asyncio.create_task(lane.fetch("SELECT pg_sleep(30)"))
            await asyncio.sleep(0.3)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            assert lane._conn is None  # back in the pool
            assert not lane._busy
            assert [tuple(r) for r in await lane.fetch("SELECT 1")] == [(1,)]
            assert [tuple(r) for r in await lane.fetch("SELECT 2")] == [(2,)]
        finally:
            await lane.close()
            await asyncio.wait_for(pool.close(), timeout=30)

    asyncio.run(scenario())


def test_an_idle_held_connection_goes_back_before_its_next_statement(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    dsn = postgres_dsn()

    async def scenario() -> None:
        import asyncpg

        pool = await asyncpg.create_pool(dsn, min_size=1, max_size=2, reset=no_reset)
        lane = ConnectionLane(pool)
        try:
            await lane.fetch("SELECT 1")
            first = lane._conn
            await lane.fetch("SELECT 1")
            assert lane._conn is first  # held between consecutive statements
            monkeypatch.setattr(_postgres_lane, "IDLE_SECONDS", 0.0)
            await asyncio.sleep(0.01)
            acquired = _count_checkouts(monkeypatch)
            await lane.fetch("SELECT 1")
            assert acquired == [1]  # given back, and taken afresh from the pool
        finally:
            await lane.close()
            await asyncio.wait_for(pool.close(), timeout=30)

    asyncio.run(scenario())
