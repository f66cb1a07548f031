"""The PostgreSQL ledger's held connection: no pool checkout for consecutive statements.

It must save the checkout without changing anything else: concurrency still
gets pool connections, a pool of one and a pool the ledger was given are
never held, a broken, dead or cancelled connection goes back to the pool
(and a write after the server ended it still works), an idle one goes back
on its own, and closing hands it back and takes no other.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

import pytest

from dataoad import ActionRunner, ActionStatus, PostgresLedger
from dataoad.ledgers import _postgres_lane
from dataoad.ledgers._postgres_lane import ConnectionLane, no_reset
from suite_support import REQUEST, CountingOperation
from suite_support.services import postgres_dsn, unique_table


async def fresh_ledger(dsn: str, **options: Any) -> PostgresLedger:
    ledger = PostgresLedger(dsn, table=unique_table(), **options)
    await ledger.migrate()
    return ledger


def _count_checkouts(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    import asyncpg

    acquired: list[int] = []
    real = asyncpg.pool.Pool.acquire

    def counted(self: Any, *args: Any, **kwargs: Any) -> Any:
        acquired.append(1)
        return real(self, *args, **kwargs)

    monkeypatch.setattr(asyncpg.pool.Pool, "acquire", counted)
    return acquired


async def test_consecutive_calls_check_nothing_out_of_the_pool(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    dsn = postgres_dsn()

    ledger = await fresh_ledger(dsn, max_size=4)
    runner = ActionRunner(ledger)
    try:
        await runner.execute("a", CountingOperation("ok"), request=REQUEST, idempotency_key="w")
        acquired = _count_checkouts(monkeypatch)
        for key in ("k1", "k2", "k1"):  # two first calls and a replay
            await runner.execute("a", CountingOperation("ok"), request=REQUEST, idempotency_key=key)
        monkeypatch.undo()
        assert acquired == []  # five statements, all on the held connection
    finally:
        await ledger.close()


@pytest.mark.parametrize("max_size", [1, 3])
async def test_concurrent_calls_use_the_pool_and_a_pool_of_one_is_never_starved(
    monkeypatch: pytest.MonkeyPatch, max_size: int
) -> None:
    dsn = postgres_dsn()
    ledger = await fresh_ledger(dsn, min_size=1, max_size=max_size)
    runner = ActionRunner(ledger)
    operation = CountingOperation("ok")
    try:
        await runner.execute("a", operation, request=REQUEST, idempotency_key="warm")
        lane = ledger._lane
        assert lane is not None
        assert lane.enabled is (max_size >= 2)
        acquired = _count_checkouts(monkeypatch)
        results = await asyncio.wait_for(
            asyncio.gather(
                *(
                    runner.execute("a", operation, request=REQUEST, idempotency_key=f"k{i}")
                    for i in range(32)
                )
            ),
            timeout=60,
        )
        monkeypatch.undo()
        assert all(r.status is ActionStatus.CONFIRMED for r in results)
        assert operation.calls == 33  # one per key, whichever connection served it
        assert len(await ledger.receipts()) == 33
        # Statements that found the held connection busy went to the pool.
        assert acquired
    finally:
        await ledger.close()


async def test_closing_hands_the_connection_back_and_a_given_pool_is_never_held() -> None:
    dsn = postgres_dsn()

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


async def _until_closed(conn: Any) -> None:
    """Wait until asyncpg has seen the server end ``conn`` (closed, or taken back)."""
    for _ in range(200):
        try:
            if conn.is_closed():
                return
        except Exception:  # detached by the pool: it saw the end too
            return
        await asyncio.sleep(0.01)
    raise AssertionError("the server never ended the connection")


async def test_after_the_server_ends_the_held_connection_reads_and_writes_work() -> None:
    dsn = postgres_dsn()

    ledger = await fresh_ledger(dsn, max_size=3)
    runner = ActionRunner(ledger)
    operation = CountingOperation("ok")
    try:
        await runner.execute("a", operation, request=REQUEST, idempotency_key="k")
        lane = ledger._lane
        assert lane is not None
        held = lane._conn
        assert held is not None
        pool = await ledger._raw_pool()
        for statement in ("a write", "a read"):
            pid = held.get_server_pid()
            await pool.execute("SELECT pg_terminate_backend($1)", pid)
            await _until_closed(held)
            if statement == "a write":
                # The claim and the completion: writes are never retried,
                # so a dead held connection must not reach them at all.
                done = await runner.execute("a", operation, request=REQUEST, idempotency_key="k2")
                assert done.status is ActionStatus.CONFIRMED
            else:
                found = await ledger.find("a", "k2")
                assert found is not None
                assert found.final_status is ActionStatus.CONFIRMED
            assert lane._conn is not None
            assert lane._conn.get_server_pid() != pid
            held = lane._conn
        assert operation.calls == 2
    finally:
        await ledger.close()


async def test_closing_during_a_statement_or_before_a_late_one_takes_no_connection(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import asyncpg

    dsn = postgres_dsn()
    real_release = asyncpg.pool.Pool.release

    async def slow_release(self: Any, *args: Any, **kwargs: Any) -> Any:
        await asyncio.sleep(0.1)  # widens the window in which close() waits
        return await real_release(self, *args, **kwargs)

    # A statement in flight when close() begins finishes, then gives back.
    ledger = await fresh_ledger(dsn, min_size=2, max_size=2)
    pool = await ledger._ready_pool()
    slow = asyncio.create_task(ledger._lane_of(pool).fetch("SELECT pg_sleep(0.3)"))
    await asyncio.sleep(0.05)
    closing = asyncio.create_task(ledger.close())
    await slow
    await asyncio.wait_for(closing, timeout=30)
    # A statement that passed its checks before close() began, arriving
    # while close() hands the held connection back: it must not take a
    # connection that the pool's close would then wait for for ever.
    for held in (True, False):  # a lane holding a connection, or none made yet
        ledger = await fresh_ledger(dsn, min_size=2, max_size=2)
        pool = await ledger._ready_pool()
        if held:
            await ledger._lane_of(pool).fetch("SELECT 1")  # held now, idle
        monkeypatch.setattr(asyncpg.pool.Pool, "release", slow_release)
        closing = asyncio.create_task(ledger.close())
        await asyncio.sleep(0.02)  # close() is handing the connection back
        with contextlib.suppress(Exception):  # the pool may refuse it as closing
            await ledger._lane_of(pool).fetch("SELECT 1")
        lane = ledger._lane
        assert lane is not None
        assert lane._conn is None  # it took no connection to hold
        if not held:
            assert not lane.enabled  # made after close() began: never holds one
        await asyncio.wait_for(closing, timeout=10)
        monkeypatch.undo()


async def test_a_statement_cancelled_on_the_held_connection_leaves_it_usable() -> None:
    dsn = postgres_dsn()

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


async def test_an_idle_held_connection_goes_back_on_its_own(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import asyncpg

    dsn = postgres_dsn()
    released: list[int] = []
    real_release = asyncpg.pool.Pool.release

    async def counted_release(self: Any, *args: Any, **kwargs: Any) -> Any:
        released.append(1)
        return await real_release(self, *args, **kwargs)

    pool = await asyncpg.create_pool(dsn, min_size=1, max_size=2, reset=no_reset)
    lane = ConnectionLane(pool)
    try:
        # 0.5 s: statements 50 ms apart keep it even on a loop a loaded
        # machine stalls for a while, and 16 of them outlast one idle period.
        monkeypatch.setattr(_postgres_lane, "IDLE_SECONDS", 0.5)
        monkeypatch.setattr(asyncpg.pool.Pool, "release", counted_release)
        await lane.fetch("SELECT 1")
        first = lane._conn
        await lane.fetch("SELECT 1")
        assert lane._conn is first  # held between consecutive statements
        assert released == []
        for _ in range(16):  # statements more often than IDLE_SECONDS: kept
            await asyncio.sleep(0.05)
            await lane.fetch("SELECT 2")
        assert lane._conn is first
        assert released == []
        for _ in range(200):  # no statement for longer than IDLE_SECONDS (bounded: 10 s)
            await asyncio.sleep(0.05)
            if lane._conn is None:
                break
        assert lane._conn is None
        assert released == [1]
        assert pool.get_idle_size() == pool.get_size()  # all back in the pool
        assert [tuple(r) for r in await lane.fetch("SELECT 3")] == [(3,)]
    finally:
        await lane.close()
        await asyncio.wait_for(pool.close(), timeout=30)
