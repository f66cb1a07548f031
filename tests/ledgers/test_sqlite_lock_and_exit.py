"""SQLite's writer lock is held only around one statement and waited for boundedly;
no ledger, closed or not, keeps the interpreter from exiting.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import cast

import pytest

from dataoad import (
    ActionPersistenceError,
    ActionRunner,
    ActionStatus,
    ClaimState,
    LedgerBusyError,
    OperatorRecord,
    SQLiteLedger,
)
from suite_support import REQUEST, CountingOperation, lock_is_free
from suite_support.services import PostgresTestTable
from suite_support.writer_lock import HeldWriterLock

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.asyncio
async def test_the_writer_lock_is_not_held_while_the_event_loop_is_busy(tmp_path: Path) -> None:
    path = tmp_path / "ledger.sqlite3"
    async with SQLiteLedger(path) as ledger:
        done = await ActionRunner(ledger).execute(
            "charge", CountingOperation(), request=REQUEST, idempotency_key="k"
        )
        groups_run = len(ledger._group.group_sizes)
        # A write statement (a release the ledger will refuse) is now in flight.
        write = asyncio.create_task(ledger.release(done.receipt.action_id, done.receipt.version))
        await asyncio.sleep(0)
        # Something blocks the loop (a sync call, a slow task). The statement
        # runs on its own thread meanwhile; the lock must not wait for the
        # loop to come back before it is released. A free lock alone proves
        # nothing (the statement may not have started yet): wait until its
        # group has run, then look. (The loop stays blocked until then, or
        # for 10 s: no machine is that slow.)
        lock = Path(f"{path}.lock")
        deadline = time.monotonic() + 10
        while len(ledger._group.group_sizes) == groups_run and time.monotonic() < deadline:
            time.sleep(0.01)
        assert len(ledger._group.group_sizes) > groups_run, "the write did not run on its thread"
        assert lock_is_free(lock), "the writer lock stayed held while the loop was blocked"
        assert not write.done()  # the loop was blocked all along
        assert await write is False


@pytest.mark.asyncio
async def test_a_stuck_lock_holder_bounds_the_wait_and_nothing_is_invoked(tmp_path: Path) -> None:
    path = tmp_path / "ledger.sqlite3"
    async with SQLiteLedger(path):
        pass  # create the file
    # Another process holds the writer lock and never lets go (as a SIGSTOPped one would).
    with HeldWriterLock(path):
        op = CountingOperation()
        async with SQLiteLedger(path, busy_timeout=0.2) as ledger:
            started = time.monotonic()
            with pytest.raises(ActionPersistenceError) as raised:
                await asyncio.wait_for(
                    ActionRunner(ledger).execute(
                        "charge", op, request=REQUEST, idempotency_key="k"
                    ),
                    timeout=10,
                )
            assert time.monotonic() - started < 5
            assert raised.value.operation_invoked is False
            assert "busy_timeout" in str(raised.value.__cause__)
            assert op.calls == 0
            assert await ledger.find("charge", "k") is None


async def test_an_operator_record_meets_a_stuck_lock_holder_within_busy_timeout(
    tmp_path: Path,
) -> None:
    """An audit record is written in its own transaction under the writer lock: a
    process stuck holding the lock bounds its wait by ``busy_timeout`` too, and
    nothing is recorded."""
    path = tmp_path / "ledger.sqlite3"
    async with SQLiteLedger(path):
        pass  # create the file
    with HeldWriterLock(path) as holder:
        # A wait with no bound would hold the connection's thread for ever; the
        # holder lets go after 3 s, so such a bug fails this test instead of hanging it.
        holder.release_after(3)
        async with SQLiteLedger(path, busy_timeout=0.2) as ledger:
            started = time.monotonic()
            with pytest.raises(LedgerBusyError, match="busy_timeout"):
                await ledger.append_audit(
                    OperatorRecord("ana", "h", "verify", None, "", "looked", "-")
                )
            assert time.monotonic() - started < 2
            holder.release()
            assert await ledger.audit() == []


async def test_a_lock_let_go_within_busy_timeout_is_waited_for_and_the_write_lands(
    tmp_path: Path,
) -> None:
    """The other side of the bound: a writer that meets the lock waits for it, and once
    the holder lets go before busy_timeout runs out, its write lands and the call runs."""
    path = tmp_path / "ledger.sqlite3"
    async with SQLiteLedger(path):
        pass  # create the file
    op = CountingOperation()
    with HeldWriterLock(path) as holder:
        async with SQLiteLedger(path, busy_timeout=5) as ledger:
            call = asyncio.ensure_future(
                ActionRunner(ledger).execute("charge", op, request=REQUEST, idempotency_key="k")
            )
            # Let go only once the claim's write is queued on the lock (its helper
            # thread blocked in flock), so the write has really met a held lock.
            for _ in range(1000):
                if any(t.name == "dataoad-sqlite-lock" for t in threading.enumerate()):
                    break
                await asyncio.sleep(0.005)
            else:
                pytest.fail("the claim's write never queued on the held lock")
            assert not call.done()
            await asyncio.sleep(0.05)  # still waiting: well within its busy_timeout
            assert not call.done()
            holder.release()
            result = await asyncio.wait_for(call, timeout=10)
            assert result.status is ActionStatus.CONFIRMED
            assert op.calls == 1


@pytest.mark.asyncio
async def test_a_stuck_lock_holder_before_the_outcome_keeps_the_claim_pending(
    tmp_path: Path,
) -> None:
    path = tmp_path / "ledger.sqlite3"
    holder: list[HeldWriterLock] = []

    async def charge() -> str:
        holder.append(HeldWriterLock(path))  # another process grabs the lock while we charge
        return "ch_1"

    try:
        async with SQLiteLedger(path, busy_timeout=0.2) as ledger:
            with pytest.raises(ActionPersistenceError) as raised:
                await asyncio.wait_for(
                    ActionRunner(ledger).execute(
                        "charge", charge, request=REQUEST, idempotency_key="k"
                    ),
                    timeout=10,
                )
            assert raised.value.operation_invoked is True
            assert raised.value.observed_status is ActionStatus.CONFIRMED
            stored = await ledger.find("charge", "k")
            assert stored is not None
            assert stored.claim_state is ClaimState.PENDING
            assert stored.attempts == 1
    finally:
        for hold in holder:
            hold.release()


@pytest.mark.asyncio
async def test_opening_and_inspecting_a_ledger_never_waits_on_the_writer_lock(
    tmp_path: Path,
) -> None:
    path = tmp_path / "ledger.sqlite3"
    async with SQLiteLedger(path) as ledger:
        done = await ActionRunner(ledger).execute(
            "charge", CountingOperation(), request=REQUEST, idempotency_key="k"
        )
    with HeldWriterLock(path):
        # As `dataoad recover` / `receipts list` do: a fresh ledger, then reads.
        async def inspect() -> None:
            async with SQLiteLedger(path, busy_timeout=30) as fresh:
                assert await fresh.get(done.receipt.action_id) == done.receipt
                assert [r.action_id for r in await fresh.receipts()] == [done.receipt.action_id]

        await asyncio.wait_for(inspect(), timeout=5)


EXIT_SCRIPT = """
import asyncio, gc, sys
from dataoad import ActionRunner, InMemoryLedger, PostgresLedger, SQLiteLedger

keep = []

async def main(kind, where, mode):
    if kind == "sqlite":
        ledger = SQLiteLedger(where)
    elif kind == "postgres":
        dsn, table = where.split(" ")
        ledger = PostgresLedger(dsn, table=table, min_size=1, max_size=2)
    else:
        ledger = InMemoryLedger()
    await ActionRunner(ledger).execute("a", lambda: 1, request={}, idempotency_key="k")
    if mode == "kept":
        keep.append(ledger)  # alive and never closed at exit
    else:
        del ledger  # collected without close()
        gc.collect()

asyncio.run(main(*sys.argv[1:4]))
print("main done", flush=True)
"""


@pytest.mark.parametrize("mode", ["collected", "kept"])
@pytest.mark.parametrize("kind", ["memory", "sqlite", "postgres"])
def test_an_unclosed_ledger_never_keeps_the_interpreter_from_exiting(
    tmp_path: Path, kind: str, mode: str
) -> None:
    script = tmp_path / "unclosed.py"
    script.write_text(EXIT_SCRIPT)
    table: PostgresTestTable | None = None
    where = str(tmp_path / "l.sqlite3")
    if kind == "postgres":
        table = PostgresTestTable()
        asyncio.run(table.create())
        where = f"{table.dsn} {table.table}"
    try:
        done = subprocess.run(
            [sys.executable, str(script), kind, where, mode],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=30,
        )
    finally:
        if table is not None:
            asyncio.run(table.drop())
    assert done.returncode == 0, done.stderr
    assert "main done" in done.stdout


def test_pytest_never_hangs_on_a_forgotten_close(tmp_path: Path) -> None:
    test_file = tmp_path / "test_forgetful.py"
    test_file.write_text(
        textwrap.dedent(
            """
            import asyncio
            from dataoad import ActionRunner, SQLiteLedger

            def test_forgets_to_close(tmp_path):
                async def main():
                    ledger = SQLiteLedger(tmp_path / "l.sqlite3")
                    await ActionRunner(ledger).execute(
                        "a", lambda: 1, request={}, idempotency_key="k"
                    )
                asyncio.run(main())
            """
        )
    )
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(test_file)],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "1 passed" in done.stdout


async def test_every_write_statement_runs_while_the_writer_lock_is_held(tmp_path: Path) -> None:
    """The README's lock discipline: each write runs inside the cross-process writer lock.

    Without it, correctness rests on SQLite's own busy handler, which
    starves processes. Every statement the connection runs is traced; each
    one that writes must find the lock taken (by the ledger itself).
    """
    ledger = SQLiteLedger(tmp_path / "ledger.sqlite3")
    lock_file = tmp_path / "ledger.sqlite3.lock"
    runner = ActionRunner(ledger)
    await runner.execute("charge", CountingOperation(), request=REQUEST, idempotency_key="warm")
    unlocked: list[str] = []
    writes: list[str] = []

    def trace(statement: str) -> None:
        verb = statement.lstrip().split(None, 1)[0].upper()
        if verb in ("INSERT", "UPDATE", "DELETE", "REPLACE"):
            writes.append(statement)
            if lock_is_free(lock_file):
                unlocked.append(statement)

    conn = ledger._conn
    assert conn is not None
    # aiosqlite's own (untyped) queue onto the connection's thread.
    on_its_thread = cast(Callable[..., Awaitable[object]], conn._execute)
    await on_its_thread(conn._conn.set_trace_callback, trace)
    await runner.execute("charge", CountingOperation(), request=REQUEST, idempotency_key="k")
    await on_its_thread(conn._conn.set_trace_callback, None)
    await ledger.close()
    assert len(writes) >= 2, writes  # the claim (counting attempt 1), the outcome
    assert unlocked == [], unlocked


async def test_a_new_ledger_is_durable_by_default(tmp_path: Path) -> None:
    """The documented defaults: WAL with synchronous=FULL (a commit survives power loss), 5 s busy_timeout."""
    ledger = SQLiteLedger(tmp_path / "ledger.sqlite3")
    assert ledger.synchronous == "FULL"
    await ledger.get("0" * 32)  # opens the connection
    conn = ledger._conn
    assert conn is not None
    [(synchronous,)] = await conn.execute_fetchall("PRAGMA synchronous")
    [(journal,)] = await conn.execute_fetchall("PRAGMA journal_mode")
    [(busy_ms,)] = await conn.execute_fetchall("PRAGMA busy_timeout")
    await ledger.close()
    assert synchronous == 2, "synchronous must be FULL (2) unless asked otherwise"
    assert journal == "wal"
    assert (ledger.busy_timeout, busy_ms) == (5.0, 5000), "the documented 5 s busy_timeout"


def _lock_threads() -> int:
    return sum(t.name == "dataoad-sqlite-lock" for t in threading.enumerate())


def _descriptors_on(path: Path) -> int:
    found = 0
    for fd in Path("/proc/self/fd").iterdir():
        with contextlib.suppress(OSError):  # closed while we looked
            found += os.readlink(fd) == str(path)
    return found


def _until(done: Callable[[], bool], seconds: float = 10) -> bool:
    deadline = time.monotonic() + seconds
    while not done() and time.monotonic() < deadline:
        time.sleep(0.005)
    return done()


def test_waits_timed_out_behind_a_stuck_holder_leave_one_waiter_not_one_each(
    tmp_path: Path,
) -> None:
    """Behind a holder that never lets go, each timed-out write used to leave a
    helper thread and a descriptor queued in the kernel, without bound."""
    from dataoad.ledgers._writer_lock import WriterLock

    # Waiters of earlier tests end once their holders let go: none is left.
    assert _until(lambda: _lock_threads() == 0)
    lock = WriterLock(tmp_path / "l.sqlite3.lock")
    peer = HeldWriterLock(tmp_path / "l.sqlite3")
    for _ in range(50):
        with pytest.raises(LedgerBusyError), lock.hold(0.005):
            pytest.fail("held a lock another process holds")
    assert _lock_threads() == 1
    assert _descriptors_on(lock.path) == 2  # the peer's, and the one wait left queued
    peer.release()
    # The wait left queued gets the lock, sees nobody wants it and lets go.
    assert _until(lambda: _lock_threads() == 0 and _descriptors_on(lock.path) == 0)
    assert lock_is_free(lock.path)


def test_a_wait_taken_up_again_holds_the_lock_once_the_holder_lets_go(tmp_path: Path) -> None:
    from dataoad.ledgers._writer_lock import WriterLock

    assert _until(lambda: _lock_threads() == 0)  # none left by earlier tests
    lock = WriterLock(tmp_path / "l.sqlite3.lock")
    peer = HeldWriterLock(tmp_path / "l.sqlite3")
    for _ in range(3):
        with pytest.raises(LedgerBusyError), lock.hold(0.005):
            pytest.fail("held a lock another process holds")
    threading.Timer(0.1, peer.release).start()
    with lock.hold(10):
        assert not peer.held
        assert not lock_is_free(lock.path)  # held by this block, on the adopted wait
        # Its waiter thread ends once it has handed the lock over; none
        # is left blocked behind this hold.
        assert _until(lambda: _lock_threads() == 0)
    assert lock_is_free(lock.path)
    assert _descriptors_on(lock.path) == 0


def test_holds_that_meet_a_wait_left_queued_still_hold_one_at_a_time(tmp_path: Path) -> None:
    """Two holds may both find the wait a timed-out one left: only one takes it up."""
    from dataoad.ledgers._writer_lock import WriterLock

    lock = WriterLock(tmp_path / "l.sqlite3.lock")
    peer = HeldWriterLock(tmp_path / "l.sqlite3")
    with pytest.raises(LedgerBusyError), lock.hold(0.005):
        pytest.fail("held a lock another process holds")
    inside: list[int] = []
    overlaps: list[int] = []

    def writer() -> None:
        for _ in range(20):
            with lock.hold(10):
                inside.append(1)
                if len(inside) > 1:
                    overlaps.append(len(inside))
                time.sleep(0.001)
                inside.pop()

    threads = [threading.Thread(target=writer) for _ in range(3)]
    for thread in threads:
        thread.start()
    time.sleep(0.05)  # all three are waiting
    peer.release()
    for thread in threads:
        thread.join(30)
    assert not any(thread.is_alive() for thread in threads)
    assert overlaps == []
    assert lock_is_free(lock.path)


def test_a_wait_left_queued_is_taken_up_once_and_only_where_its_thread_runs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two holders of one descriptor would both think they hold the lock: a wait
    is adopted once, never after its thread closed it, never in a forked child."""
    from dataoad.ledgers._writer_lock import _Wait

    def abandoned() -> _Wait:
        wait = _Wait(os.open(tmp_path / "l.lock", os.O_CREAT | os.O_RDWR, 0o600))
        assert wait.outcome(0) is False  # nothing ran it: timed out, abandoned
        return wait

    wait = abandoned()
    assert wait.adopt() is True
    assert wait.adopt() is False  # taken up already
    assert wait.outcome(0) is False  # abandoned again: adoptable again
    wait.run()  # its thread gets the lock, sees it abandoned, closes it
    assert wait.adopt() is False
    child = abandoned()
    monkeypatch.setattr(os, "getpid", lambda: -1)  # as in a forked child
    assert child.adopt() is False
    monkeypatch.undo()
    assert child.adopt() is True
    os.close(child.fd)


def test_a_wait_left_behind_a_stuck_holder_never_keeps_the_process_from_exiting(
    tmp_path: Path,
) -> None:
    """The waiter a timed-out hold leaves queued is a daemon thread: the process
    still ends while another process holds the lock."""
    peer = HeldWriterLock(tmp_path / "l.sqlite3")
    child = textwrap.dedent(
        """
        import sys
        from pathlib import Path
        from dataoad import LedgerBusyError
        from dataoad.ledgers._writer_lock import WriterLock

        try:
            with WriterLock(Path(sys.argv[1])).hold(0.05):
                raise SystemExit(3)  # the lock is held by the test: never had
        except LedgerBusyError:
            print("busy, ending")
        """
    )
    try:
        done = subprocess.run(
            [sys.executable, "-c", child, str(peer.path)],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=30,
        )
    finally:
        peer.release()
    assert done.returncode == 0, done.stderr
    assert "busy, ending" in done.stdout
