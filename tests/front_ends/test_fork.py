"""A process that forks after using Dataoad (a pre-forking server, ``multiprocessing``'s
``fork``): the child gets none of the parent's threads, so a ledger, a ``SyncActionRunner``
or a pool made before the fork is refused there with a typed error (it used to wait for a
thread that does not exist, forever); one made in the child works; the parent is unharmed.

Each scenario runs in a fresh interpreter that forks itself, as a user's process would,
not in the test worker (whose own threads the child would inherit).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from suite_support.services import PostgresTestTable

pytestmark = pytest.mark.skipif(not hasattr(os, "fork"), reason="os.fork exists on POSIX only")

_SCRIPT = r"""
import asyncio, json, os, signal, sys, warnings
from dataoad import ActionRunner, SQLiteLedger, SyncActionRunner, PostgresLedger
from dataoad._bridge import run_blocking

kind, where = sys.argv[1], sys.argv[2]

def make():
    if kind == "postgres":
        schema, _, table = os.environ["DATAOAD_FORK_TABLE"].rpartition(".")
        return PostgresLedger(where, schema=schema or "public", table=table)
    return SQLiteLedger(where)

def charge(key):
    return lambda: f"charged {key}"

async def call(runner, key):
    try:
        result = await runner.execute("charge", charge(key), request={}, idempotency_key=key)
        return result.status.value
    except Exception as exc:
        cause = exc.__cause__ or exc.__context__
        return f"{type(exc).__name__}/{type(cause).__name__ if cause else None}"

def sync_call(runner, key):
    try:
        return runner.execute("charge", charge(key), request={}, idempotency_key=key).status.value
    except Exception as exc:
        return type(exc).__name__

async def count():
    ledger = make()
    try:
        return len(await ledger.receipts())
    finally:
        await ledger.close()

def fork(child):
    read_end, write_end = os.pipe()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # 3.12+: a threaded process forks
        pid = os.fork()
    if pid == 0:
        signal.alarm(20)  # a hang is a failure, not a stuck test
        try:
            said = child()
        except BaseException as exc:
            said = {"child raised": repr(exc)}
        os.write(write_end, json.dumps(said).encode())
        os._exit(0)
    os.close(write_end)
    with os.fdopen(read_end) as pipe:
        said = pipe.read()
    _, status = os.waitpid(pid, 0)
    return json.loads(said) if said else {"child died": status}

report = {}
if kind == "sync":
    runner = SyncActionRunner(make())
    report["parent before"] = sync_call(runner, "a")

    def child():
        said = {"inherited": sync_call(runner, "b")}
        runner.close()  # returns: the parent's loop and ledger are not the child's
        fresh = SyncActionRunner(make())
        said["fresh"] = sync_call(fresh, "c")
        fresh.close()
        return said

    report["child"] = fork(child)
    report["parent after"] = sync_call(runner, "d")
    runner.close()
else:
    loop = asyncio.new_event_loop()
    ledger = make()
    runner = ActionRunner(ledger)
    report["parent before"] = loop.run_until_complete(call(runner, "a"))
    report["bridge in parent"] = run_blocking(lambda: asyncio.sleep(0, "ok"), caller="test")

    def child():
        async def main():
            said = {"inherited": await call(runner, "b")}
            await ledger.close()  # returns, and leaves the parent's connections alone
            fresh = make()
            said["fresh"] = await call(ActionRunner(fresh), "c")
            await fresh.close()
            return said

        said = asyncio.run(main())
        said["bridge"] = run_blocking(lambda: asyncio.sleep(0, "ok"), caller="test")
        return said

    report["child"] = fork(child)
    report["parent after"] = loop.run_until_complete(call(runner, "d"))
    loop.run_until_complete(ledger.close())
report["receipts"] = asyncio.run(count())
print(json.dumps(report))
"""


def _run(tmp_path: Path, kind: str, where: str, env: dict[str, str] | None = None) -> Any:
    script = tmp_path / "forking.py"
    script.write_text(_SCRIPT)
    done = subprocess.run(
        [sys.executable, str(script), kind, where],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, **(env or {})},
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("kind", ["async", "sync"])
def test_a_forked_child_is_refused_what_it_inherited_and_served_by_its_own(
    tmp_path: Path, kind: str
) -> None:
    report = _run(tmp_path, kind, str(tmp_path / "ledger.sqlite3"))
    inherited = "DataoadError" if kind == "sync" else "NothingInvokedError/LedgerUnusableError"
    assert report["child"].get("inherited") == inherited, report
    assert report["child"].get("fresh") == "CONFIRMED", report
    assert (report["parent before"], report["parent after"]) == ("CONFIRMED", "CONFIRMED")
    assert report["receipts"] == 3  # a, c and d: nothing of b was written
    if kind == "async":
        assert report["child"]["bridge"] == report["bridge in parent"] == "ok"


def test_a_forked_child_never_uses_or_ends_the_parents_postgres_sessions(
    tmp_path: Path,
) -> None:
    table = PostgresTestTable()
    import asyncio

    asyncio.run(table.create())
    try:
        report = _run(
            tmp_path, "postgres", table.dsn, {"DATAOAD_FORK_TABLE": f"public.{table.table}"}
        )
    finally:
        asyncio.run(table.drop())
    assert report["child"].get("inherited") == "NothingInvokedError/LedgerUnusableError", report
    assert report["child"].get("fresh") == "CONFIRMED", report
    # The child's close() ended none of the parent's sessions: its next call works.
    assert (report["parent before"], report["parent after"]) == ("CONFIRMED", "CONFIRMED")
    assert report["receipts"] == 3


# -- the same refusals in this process, a fork simulated by its generation ----------------


def test_what_was_made_before_a_fork_is_refused_after_it_in_process(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import asyncio

    from dataoad import (
        ActionRunner,
        DataoadError,
        LedgerUnusableError,
        NothingInvokedError,
        SQLiteLedger,
        SyncActionRunner,
        _forks,
    )

    sync = SyncActionRunner(SQLiteLedger(tmp_path / "sync.sqlite3"))
    assert sync.execute("charge", lambda: 1, request={}, idempotency_key="a").status.value == (
        "CONFIRMED"
    )
    ledger = SQLiteLedger(tmp_path / "async.sqlite3")
    loop = asyncio.new_event_loop()
    runner = ActionRunner(ledger)
    loop.run_until_complete(runner.execute("charge", lambda: 1, request={}, idempotency_key="a"))
    born = _forks.generation()
    monkeypatch.setattr(_forks, "_generation", born + 1)  # as in a forked child
    with pytest.raises(DataoadError, match="made before this process forked"):
        sync.execute("charge", lambda: 1, request={}, idempotency_key="b")
    with pytest.raises(NothingInvokedError) as refused:
        loop.run_until_complete(
            runner.execute("charge", lambda: 1, request={}, idempotency_key="b")
        )
    assert isinstance(refused.value.__cause__, LedgerUnusableError)
    assert "opened before this process forked" in str(refused.value.__cause__)
    monkeypatch.setattr(_forks, "_generation", born)  # back in the parent
    # Nothing of "b" was written, and both still serve the process that made them.
    assert loop.run_until_complete(ledger.receipts(idempotency_key="b")) == []
    assert sync.execute("charge", lambda: 1, request={}, idempotency_key="c").status.value == (
        "CONFIRMED"
    )
    loop.run_until_complete(ledger.close())
    loop.close()
    sync.close()


def test_a_child_s_close_leaves_the_parent_s_loop_and_connection_running(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import asyncio

    from dataoad import SQLiteLedger, SyncActionRunner, _forks
    from dataoad.ledgers import _sqlite_live

    sync = SyncActionRunner(SQLiteLedger(tmp_path / "sync.sqlite3"))
    sync.execute("charge", lambda: 1, request={}, idempotency_key="a")
    ledger = SQLiteLedger(tmp_path / "async.sqlite3")
    loop = asyncio.new_event_loop()
    loop.run_until_complete(ledger.receipts())  # opened: a connection and its thread
    conn = ledger._conn
    born = _forks.generation()
    monkeypatch.setattr(_forks, "_generation", born + 1)
    sync.close()  # returns at once, stopping nothing of the parent's
    loop.run_until_complete(ledger.close())
    monkeypatch.setattr(_forks, "_generation", born)
    assert sync._thread.is_alive()
    assert conn is not None
    assert conn._running  # never stopped from the "child"
    assert conn not in _sqlite_live._LIVE  # and no longer counted as this process's
    # Cleaned up as the parent would: its own loop, stopped by hand.
    sync._loop.call_soon_threadsafe(sync._loop.stop)
    sync._thread.join()
    sync._loop.close()
    loop.run_until_complete(conn.close())
    loop.close()


def test_a_forked_child_s_blocking_pool_starts_empty() -> None:
    from dataoad._blocking import _WorkerPool

    pool = _WorkerPool()
    done = threading.Event()
    pool.submit(done.set)
    assert done.wait(5)
    # The parent's worker is idle now: a job handed to it in the child would
    # wait forever for a thread the child does not have.
    for _ in range(100):
        if pool._idle:
            break
        time.sleep(0.01)
    assert pool._idle == 1
    pool.start_after_fork()
    assert (pool._idle, pool._jobs.empty()) == (0, True)
    again = threading.Event()
    pool.submit(again.set)  # starts a worker of its own
    assert again.wait(5)
