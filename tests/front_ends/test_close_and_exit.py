"""Closing a SyncActionRunner and leaving the interpreter never cut a call off (V3, V4).

V3: ``close()`` while another thread's call was inside its operation used to
return at once, and that call then never returned. V4: on SQLite, when the
main thread ended while non-daemon threads were inside ``execute``, the exit
hook closed the connections under them and their outcomes were lost. Now a
close waits (bounded) for calls in flight and refuses new ones, and exit
waits for calls in flight before it stops SQLite connections.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
import textwrap
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from dataoad import (
    ActionRunner,
    ActionStatus,
    DataoadError,
    InMemoryLedger,
    InvalidArgumentError,
    SQLiteLedger,
    SyncActionRunner,
)
from dataoad.ledgers.sqlite_reader import SQLiteReader
from suite_support.in_flight import until_returned_or_blocked
from suite_support.services import PostgresTestTable

REQUEST = {"amount": 100}


@pytest.fixture(params=["memory", "sqlite", "postgres"])
def make_ledger(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Any]:
    tables: list[PostgresTestTable] = []

    def make() -> Any:
        if request.param == "memory":
            return InMemoryLedger()
        if request.param == "sqlite":
            return SQLiteLedger(tmp_path / "ledger.sqlite3")
        table = PostgresTestTable()
        asyncio.run(table.create())
        tables.append(table)
        return table.client()

    yield make
    for table in tables:
        asyncio.run(table.drop())


class Blocked:
    """An operation that waits in its caller's thread until released."""

    def __init__(self) -> None:
        self.started = threading.Event()
        self.release = threading.Event()

    def __call__(self) -> str:
        self.started.set()
        assert self.release.wait(30)
        return "ch_1"


def _in_thread(
    runner: SyncActionRunner, op: Any, key: str, out: dict[str, Any]
) -> threading.Thread:
    def call() -> None:
        try:
            out[key] = runner.execute("charge", op, request=REQUEST, idempotency_key=key)
        except BaseException as exc:
            out[key] = exc

    thread = threading.Thread(target=call)
    thread.start()
    return thread


def test_close_waits_for_a_call_inside_its_operation(make_ledger: Any) -> None:
    ledger = make_ledger()
    runner = SyncActionRunner(ledger)
    out: dict[str, Any]
    op, out = Blocked(), {}
    caller = _in_thread(runner, op, "k", out)
    assert op.started.wait(10)
    closer = threading.Thread(target=runner.close, kwargs={"timeout": 20})
    closer.start()
    # Until the closer has returned or blocks waiting for the call (however
    # slowly a loaded machine runs it, or a close that does not wait returns).
    until_returned_or_blocked(closer, runner._calls, within=10)
    assert closer.is_alive()  # waiting for the call in flight, not closed under it
    with pytest.raises(DataoadError, match="closing"):
        runner.execute("charge", lambda: "x", request=REQUEST, idempotency_key="new")
    op.release.set()
    caller.join(10)
    closer.join(10)
    assert not caller.is_alive()
    assert not closer.is_alive()
    result = out["k"]
    assert result.status is ActionStatus.CONFIRMED, result
    with pytest.raises(DataoadError, match="closed"):
        runner.execute("charge", lambda: "x", request=REQUEST, idempotency_key="k")


def test_a_close_that_times_out_leaves_the_call_to_record_its_outcome(make_ledger: Any) -> None:
    ledger = make_ledger()
    runner = SyncActionRunner(ledger)
    out: dict[str, Any]
    op, out = Blocked(), {}
    caller = _in_thread(runner, op, "k", out)
    assert op.started.wait(10)
    with pytest.raises(DataoadError, match=r"1 call.*still running.*stays open"):
        runner.close(timeout=0.2)
    op.release.set()
    caller.join(10)
    result = out["k"]
    assert result.status is ActionStatus.CONFIRMED, result
    with pytest.raises(DataoadError, match="closing"):
        runner.receipt(result.receipt.action_id)  # new calls stay refused
    runner.close()  # nothing in flight now: it closes
    with pytest.raises(DataoadError, match="closed"):
        runner.receipt(result.receipt.action_id)


def test_close_from_inside_its_own_call_refuses_at_once() -> None:
    runner = SyncActionRunner(InMemoryLedger())
    seen: list[BaseException] = []

    def closes_itself() -> str:
        try:
            runner.close(timeout=5)
        except DataoadError as exc:
            seen.append(exc)
        return "ok"

    result = runner.execute("charge", closes_itself, request=REQUEST, idempotency_key="k")
    assert result.status is ActionStatus.CONFIRMED
    assert seen
    assert "inside one of its own calls" in str(seen[0])
    runner.close()


@pytest.mark.parametrize("timeout", [-1, float("nan"), "5", True, 10**6])
def test_close_refuses_a_bad_timeout_and_stays_open(timeout: Any) -> None:
    runner = SyncActionRunner(InMemoryLedger())
    with pytest.raises(InvalidArgumentError):
        runner.close(timeout=timeout)
    assert runner.execute("charge", lambda: "ok", request=REQUEST, idempotency_key="k").status is (
        ActionStatus.CONFIRMED
    )
    runner.close()


_EXIT_PROGRAM = """
import asyncio, sys, threading, time
from dataoad import ActionRunner, SQLiteLedger, SyncActionRunner

path, mode = sys.argv[1], sys.argv[2]
started = threading.Barrier(9)

def slow_charge():
    started.wait()
    time.sleep(0.5)  # still inside the operation when the main thread ends
    return "ch"

if mode == "sync":
    runner = SyncActionRunner(SQLiteLedger(path))  # never closed: exit must cope

    def worker(i):
        runner.execute("charge", slow_charge, request={"i": i}, idempotency_key=f"k{i}")
else:
    def worker(i):
        async def main():
            ledger = SQLiteLedger(path)  # never closed either
            runner = ActionRunner(ledger)
            await runner.execute("charge", slow_charge, request={"i": i}, idempotency_key=f"k{i}")
        asyncio.run(main())

for i in range(8):
    threading.Thread(target=worker, args=(i,)).start()  # non-daemon threads
started.wait()
# The main thread ends here while all eight are inside their operation.
"""


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_exit_lets_every_call_in_flight_record_its_outcome(tmp_path: Path, mode: str) -> None:
    path = tmp_path / "ledger.sqlite3"
    program = tmp_path / "exits.py"
    program.write_text(textwrap.dedent(_EXIT_PROGRAM))
    done = subprocess.run(
        [sys.executable, str(program), str(path), mode],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert "Connection closed" not in done.stderr

    async def stored() -> list[Any]:
        reader = SQLiteReader(path)
        try:
            return await reader.receipts()
        finally:
            await reader.close()

    receipts = asyncio.run(stored())
    assert len(receipts) == 8
    assert {r.final_status for r in receipts} == {ActionStatus.CONFIRMED}, [
        (r.idempotency_key, r.claim_state, r.final_status) for r in receipts
    ]


async def test_closing_a_ledger_the_exit_hook_already_stopped_returns(tmp_path: Path) -> None:
    """A close() after exit's hook stopped the connection (an atexit handler's close, say)
    returns at once. aiosqlite's own close() could queue its work behind the worker thread
    the hook had just ended and wait for it forever."""
    from dataoad.ledgers import _sqlite_live

    for n in range(30):
        ledger = SQLiteLedger(tmp_path / f"l{n}.sqlite3")
        await ActionRunner(ledger).execute(
            "charge", lambda: "ch_1", request={"n": n}, idempotency_key=f"k{n}"
        )
        _sqlite_live.stop_live_connections()  # what exit runs, no call being in flight
        await asyncio.wait_for(ledger.close(), 5)


@pytest.mark.parametrize("kind", ["memory", "sqlite"])
def test_two_threads_closing_at_once_both_return_and_close_once(kind: str, tmp_path: Path) -> None:
    # Both used to pass the closed check and go on: one stopped a loop the
    # other then waited on forever, or closed one already closed.
    ledger: Any = InMemoryLedger() if kind == "memory" else SQLiteLedger(tmp_path / "l.sqlite3")
    runner = SyncActionRunner(ledger)
    release = threading.Event()
    running = threading.Event()

    def held() -> str:
        running.set()
        release.wait(10)
        return "ok"

    call = threading.Thread(
        target=lambda: runner.execute("a", held, request=REQUEST, idempotency_key="k")
    )
    call.start()
    assert running.wait(10)
    outcomes: dict[int, str] = {}

    def closer(n: int) -> None:
        try:
            runner.close(timeout=10)
            outcomes[n] = "ok"
        except BaseException as exc:  # any failure is the finding
            outcomes[n] = f"{type(exc).__name__}: {exc}"

    closers = [threading.Thread(target=closer, args=(n,)) for n in range(2)]
    for thread in closers:
        thread.start()
    release.set()  # both closers are waiting for the call in flight
    for thread in (*closers, call):
        thread.join(15)
    assert outcomes == {0: "ok", 1: "ok"}
    assert not any(thread.is_alive() for thread in closers)
    with pytest.raises(DataoadError, match="closed"):
        runner.execute("a", lambda: "ok", request=REQUEST, idempotency_key="k2")
