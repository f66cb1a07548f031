"""Exact ledger operation counts per execute: the goals the benchmarks print.

A first call is 2 durable commits (the claim, which already counts attempt
1, and the completion); each retry adds 1 (its attempt start, which also
records how the previous attempt ended); a replay is 1 read and 0 writes.
Counted three ways: ledger calls on every backend, the statements SQLite
runs and the thread hops they take, and for PostgreSQL the round trips
plus the server's own word that a replay's statement wrote nothing.
"""

from __future__ import annotations

import sqlite3
from collections import Counter
from collections.abc import Awaitable, Callable
from datetime import datetime
from pathlib import Path
from typing import Any

import aiosqlite
import pytest

import dataoad.ledgers._sqlite_live as sqlite_live
import dataoad.ledgers.sqlite as sqlite_ledger
from dataoad import ActionRunner, DefinitiveFailure, Ledger, RetryPolicy, SQLiteLedger
from dataoad.ledgers._codec import values_of
from dataoad.ledgers._sqlite_file import _NOW_SQL as CLOCK_SQL
from dataoad.ledgers._sqlite_file import sqlite_clock
from dataoad.testing import FaultyLedger
from suite_support import REQUEST, closing
from suite_support.services import PostgresTestTable

WRITES = ("claim", "start_attempt", "record", "release", "take_over", "retire")
READS = ("get", "find")


async def noop() -> str:
    return "ok"


def flaky(failures: int) -> Callable[[], Any]:
    calls = 0

    async def operation() -> str:
        nonlocal calls
        calls += 1
        if calls <= failures:
            raise DefinitiveFailure("rejected before processing", retryable=True)
        return "ok"

    return operation


async def first_then_replay(ledger: Ledger) -> tuple[list[str], list[str]]:
    """The ledger calls of a first call, then of its replay."""
    counted = FaultyLedger(ledger)  # no fault injected: it only records the calls
    runner = ActionRunner(counted)
    await runner.execute("a", noop, request=REQUEST, idempotency_key="k")
    first = list(counted.calls)
    counted.calls.clear()
    replay = await runner.execute("a", noop, request=REQUEST, idempotency_key="k")
    assert replay.replayed
    return first, list(counted.calls)


async def test_a_first_call_is_two_writes_and_a_replay_one_call_on_every_backend(
    new_ledger: Callable[[], Ledger],
) -> None:
    ledger = new_ledger()
    try:
        first, replay = await first_then_replay(ledger)
    finally:
        await closing(ledger)
    # The claim counts attempt 1 (no start_attempt) and looks the key up itself (no find).
    assert first == ["claim", "record"]
    # The replay is the claim's lookup finding the key held: the ledger writes nothing.
    assert replay == ["claim"]


async def test_each_retry_adds_one_write(new_ledger: Callable[[], Ledger]) -> None:
    ledger = new_ledger()
    counted = FaultyLedger(ledger)
    policy = RetryPolicy(max_attempts=3, retry_on_failed=True)
    try:
        result = await ActionRunner(counted).execute(
            "a", flaky(2), request=REQUEST, idempotency_key="k", policy=policy
        )
    finally:
        await closing(ledger)
    assert result.receipt.attempts == 3
    calls = Counter(counted.calls)
    assert calls == Counter(claim=1, start_attempt=2, record=1)
    assert sum(calls[m] for m in WRITES) == 2 + 2
    assert sum(calls[m] for m in READS) == 0


# -- SQLite: the statements behind those calls, and the hops they take ------------------


@pytest.fixture
def traced(
    monkeypatch: pytest.MonkeyPatch,
) -> tuple[list[str], list[int]]:
    """Every statement SQLite runs for the ledger, and a count of aiosqlite thread hops."""
    statements: list[str] = []
    hops = [0]
    connect = sqlite3.connect

    def tracing_connect(*args: Any, **kwargs: Any) -> sqlite3.Connection:
        conn: sqlite3.Connection = connect(*args, **kwargs)
        conn.set_trace_callback(statements.append)
        return conn

    # aiosqlite leaves _execute unannotated.
    original: Callable[..., Awaitable[Any]] = aiosqlite.Connection._execute

    async def counted(self: aiosqlite.Connection, fn: Any, *args: Any, **kwargs: Any) -> Any:
        hops[0] += 1
        return await original(self, fn, *args, **kwargs)

    queue_now = sqlite_live.queue_on_thread

    def counted_now(conn: aiosqlite.Connection, fn: Any) -> Any:
        hops[0] += 1  # a group's flush, queued without an awaited hand-off
        return queue_now(conn, fn)

    monkeypatch.setattr(sqlite3, "connect", tracing_connect)
    monkeypatch.setattr(aiosqlite.Connection, "_execute", counted)
    monkeypatch.setattr(sqlite_live, "queue_on_thread", counted_now)
    return statements, hops


def _kinds(statements: list[str]) -> Counter[str]:
    return Counter(s.split(None, 1)[0].upper() for s in statements)


async def test_sqlite_first_call_commits_twice_and_a_replay_is_one_select_in_one_hop(
    tmp_path: Path, traced: tuple[list[str], list[int]], monkeypatch: pytest.MonkeyPatch
) -> None:
    statements, hops = traced
    # The ledger's clock is read on a private in-memory database (no file,
    # no hop), one per process: its readings are counted apart.
    readings = [0]
    clock = sqlite_clock()  # the function sqlite_ledger imports, before it is patched there

    def counted_clock() -> Callable[[], datetime]:
        def now() -> datetime:
            readings[0] += 1
            return clock()

        return now

    monkeypatch.setattr(sqlite_ledger, "sqlite_clock", counted_clock)
    seen = {}
    async with SQLiteLedger(tmp_path / "ledger.sqlite3") as ledger:
        runner = ActionRunner(ledger)
        await ledger.get("0" * 32)  # open and migrate first: not part of a call
        for name, operation in (("first", noop), ("replay", noop), ("retry", flaky(1))):
            statements.clear()
            hops[0] = readings[0] = 0
            key = "r" if name == "retry" else "k"
            policy = RetryPolicy(max_attempts=2, retry_on_failed=True)
            await runner.execute(
                "a", operation, request=REQUEST, idempotency_key=key, policy=policy
            )
            on_file = [s for s in statements if s != CLOCK_SQL]
            seen[name] = (_kinds(on_file), hops[0], readings[0])
    # Autocommit: each write statement is its own durable commit.
    assert seen["first"] == (Counter(SELECT=1, INSERT=1, UPDATE=1), 2, 2)
    assert seen["replay"] == (Counter(SELECT=1), 1, 0)
    assert seen["retry"] == (Counter(SELECT=1, INSERT=1, UPDATE=2), 3, 3)


# -- PostgreSQL: round trips, and a replay that writes nothing -----------------------


async def test_postgres_round_trips_and_a_replay_takes_no_transaction_id(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import asyncpg  # the postgres extra; CI has it (a missing extra fails under CI=true)

    sent: list[str] = []
    # Every statement reaches the server through a connection's fetch, held
    # (the ledger's lane) or checked out of the pool for the one statement.
    fetch = asyncpg.connection.Connection.fetch

    async def counted(self: Any, query: str, *args: Any, **kwargs: Any) -> Any:
        sent.append(query)
        return await fetch(self, query, *args, **kwargs)

    table = PostgresTestTable()

    await table.create()
    ledger = table.client()
    try:
        runner = ActionRunner(ledger)
        await ledger.get("0" * 32)  # the schema check: not part of a call
        monkeypatch.setattr(asyncpg.connection.Connection, "fetch", counted)
        first = await runner.execute("a", noop, request=REQUEST, idempotency_key="k")
        first_trips = len(sent)
        sent.clear()
        await runner.execute("a", noop, request=REQUEST, idempotency_key="k")
        replay_trips = len(sent)
        monkeypatch.undo()
        # The replay's statement, run again inside a transaction: PostgreSQL
        # assigns a transaction id on the first write, so none means no write.
        claim = ledger._sql["claim_or_held"]
        values = {
            **values_of(first.receipt.evolve(action_id="f" * 32)),
            "now": None,
            "lease": None,
        }
        conn = await asyncpg.connect(table.dsn)
        try:
            async with conn.transaction():
                rows = await conn.fetch(claim.sql, *claim.bind(values))
                xid = await conn.fetchval("SELECT pg_current_xact_id_if_assigned()")
        finally:
            await conn.close()
        assert [row[-1] for row in rows] == [False]  # it answered the held receipt
    finally:
        await ledger.close()
        await table.drop()
    assert first_trips == 2  # the claim (with its lookup), the completion
    assert replay_trips == 1
    assert xid is None
