"""Group commit on SQLite: concurrent writes share one transaction, each answered after its commit.

The writer (``dataoad/ledgers/_sqlite_group.py``) is driven directly on a
plain SQLite file, with a fault at every point of a group (the writer lock
not had, a statement that raises, a transaction SQLite rolls back, a
failed COMMIT), and through the real runner on a ledger shared by
concurrent calls, including a group whose commit fails under the runner.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import sqlite3
import subprocess
import sys
import threading
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from dataoad import (
    ActionRunner,
    ActionStatus,
    DataoadError,
    LedgerBusyError,
    LedgerClosedError,
    NothingInvokedError,
    OutcomeNotRecordedError,
    SQLiteLedger,
)
from dataoad.ledgers import _sqlite_live as live
from dataoad.ledgers._sqlite_group import (
    BrokenConnectionError,
    GroupWriter,
    QueuedWrite,
    _settle,
    answer,
)
from dataoad.ledgers._statements import SQLITE, Statement, compile_sql
from dataoad.ledgers._writer_lock import WriterLock
from suite_support import CountingOperation, lock_is_free, unstarted
from suite_support.writer_lock import HeldWriterLock

INSERT = compile_sql(
    "INSERT INTO t (k, v) VALUES (:k, :v) ON CONFLICT (k) DO NOTHING RETURNING k", SQLITE
)
BUMP = compile_sql("UPDATE t SET v = v + 1 WHERE k = :k AND v = :v RETURNING v", SQLITE)


@pytest.fixture
def db(tmp_path: Path) -> Iterator[sqlite3.Connection]:
    conn = sqlite3.connect(tmp_path / "g.sqlite3", isolation_level=None, check_same_thread=False)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("CREATE TABLE t (k TEXT PRIMARY KEY, v INTEGER NOT NULL CHECK (v >= 0))")
    yield conn
    conn.close()


def stored(path: Path) -> dict[str, int]:
    """What another connection sees committed."""
    with contextlib.closing(sqlite3.connect(path)) as other:
        return dict(other.execute("SELECT k, v FROM t"))


def writer(tmp_path: Path, busy_timeout: float = 1.0) -> GroupWriter:
    return GroupWriter(
        WriterLock(tmp_path / "g.sqlite3.lock"), busy_timeout, lambda s, v, now: s.bind(v)
    )


class Statements:
    """Every statement the connection runs, in order."""

    def __init__(self, db: sqlite3.Connection) -> None:
        self.seen: list[str] = []
        db.set_trace_callback(lambda sql: self.seen.append(sql.split(None, 1)[0].upper()))


class FailingDb:
    """A connection whose statements starting with one of ``verbs`` raise."""

    def __init__(self, db: sqlite3.Connection, *verbs: str, roll_back: bool = False) -> None:
        self._db, self._verbs, self._roll_back = db, verbs, roll_back

    @property
    def in_transaction(self) -> bool:
        return self._db.in_transaction

    def execute(self, sql: str, *args: Any) -> Any:
        if sql.startswith(self._verbs):
            if self._roll_back and self._db.in_transaction:  # as SQLite does on a full disk
                self._db.execute("ROLLBACK")
            raise sqlite3.OperationalError(f"injected at {sql.split()[0]}")
        return self._db.execute(sql, *args)


def test_a_group_commits_once_and_answers_each_write(
    tmp_path: Path, db: sqlite3.Connection
) -> None:
    group = writer(tmp_path)
    db.execute("INSERT INTO t VALUES ('x', 5)")
    entries = [group.enqueue(INSERT, {"k": f"k{n}", "v": n}) for n in range(3)]
    stale = group.enqueue(BUMP, {"k": "x", "v": 4})  # its condition does not hold
    bump = group.enqueue(BUMP, {"k": "x", "v": 5})
    trace = Statements(db)
    group.flush(db)
    assert [answer(e) for e in entries] == [[("k0",)], [("k1",)], [("k2",)]]
    assert answer(stale) == []  # failed its condition, alone
    assert answer(bump) == [(6,)]
    assert trace.seen.count("BEGIN") == 1
    assert trace.seen.count("COMMIT") == 1
    assert group.group_sizes == [5]
    assert stored(tmp_path / "g.sqlite3") == {"x": 6, "k0": 0, "k1": 1, "k2": 2}


def test_a_lone_write_is_one_statement_in_autocommit(
    tmp_path: Path, db: sqlite3.Connection
) -> None:
    group = writer(tmp_path)
    entry = group.enqueue(INSERT, {"k": "a", "v": 1})
    trace = Statements(db)
    group.flush(db)
    assert answer(entry) == [("a",)]
    assert trace.seen == ["INSERT"]
    group.flush(db)  # nothing queued: nothing runs
    assert trace.seen == ["INSERT"]


def _refusing_nan(statement: Statement, values: dict[str, Any], now: Any) -> tuple[Any, ...]:
    if values["v"] != values["v"]:
        raise ValueError("a lease must be finite")  # as the ledger's own parameters refuse
    return statement.bind(values)


@pytest.mark.parametrize(
    ("bad_value", "error"),
    [
        (-1, sqlite3.IntegrityError),  # breaks the CHECK
        (2**64, OverflowError),  # too large for an INTEGER: raised by Python, binding
        ("\ud800", UnicodeEncodeError),  # a lone surrogate: raised by Python, binding
        ({"x": 1}, sqlite3.ProgrammingError),  # no SQLite type
        (float("nan"), ValueError),  # refused while building the parameters
        ("x" * 5000, sqlite3.DataError),  # over SQLite's length limit (SQLITE_TOOBIG)
    ],
    ids=[
        "constraint",
        "int-too-large",
        "lone-surrogate",
        "unbindable",
        "parameters-refused",
        "too-big",
    ],
)
def test_a_statement_that_raises_fails_alone(
    tmp_path: Path, db: sqlite3.Connection, bad_value: object, error: type[Exception]
) -> None:
    """Raised by SQLite or by Python before SQLite ran it, one write's error is its own:
    the others of its group are committed and answered."""
    group = GroupWriter(WriterLock(tmp_path / "g.sqlite3.lock"), 1.0, _refusing_nan)
    db.setlimit(sqlite3.SQLITE_LIMIT_LENGTH, 4096)  # the limit, lowered from a billion bytes
    before = group.enqueue(INSERT, {"k": "a", "v": 1})
    bad = group.enqueue(INSERT, {"k": "b", "v": bad_value})
    after = group.enqueue(INSERT, {"k": "c", "v": 3})
    group.flush(db)
    assert group.group_sizes == [3]
    assert answer(before) == [("a",)]
    with pytest.raises(error):
        answer(bad)
    assert answer(after) == [("c",)]
    assert stored(tmp_path / "g.sqlite3") == {"a": 1, "c": 3}


@pytest.mark.parametrize(
    ("verb", "roll_back"),
    [("COMMIT", False), ("INSERT", True), ("BEGIN", False)],
    ids=["commit-fails", "sqlite-rolls-back", "begin-fails"],
)
def test_a_group_not_committed_fails_every_write_and_stores_nothing(
    tmp_path: Path, db: sqlite3.Connection, verb: str, roll_back: bool
) -> None:
    group = writer(tmp_path)
    entries = [group.enqueue(INSERT, {"k": f"k{n}", "v": n}) for n in range(3)]
    group.flush(FailingDb(db, verb, roll_back=roll_back))  # type: ignore[arg-type]
    for entry in entries:
        with pytest.raises(sqlite3.OperationalError):
            answer(entry)
    assert not db.in_transaction
    assert stored(tmp_path / "g.sqlite3") == {}
    assert group.group_sizes == []
    # The next group is unharmed.
    again = group.enqueue(INSERT, {"k": "a", "v": 1})
    group.flush(db)
    assert answer(again) == [("a",)]


def test_a_group_that_cannot_have_the_writer_lock_writes_nothing(
    tmp_path: Path, db: sqlite3.Connection
) -> None:
    group = writer(tmp_path, busy_timeout=0.05)
    with HeldWriterLock(tmp_path / "g.sqlite3"):
        entries = [group.enqueue(INSERT, {"k": f"k{n}", "v": n}) for n in range(2)]
        group.flush(db)
    for entry in entries:
        with pytest.raises(LedgerBusyError):
            answer(entry)
    assert stored(tmp_path / "g.sqlite3") == {}


def test_each_caller_raises_its_own_copy_of_a_group_error(
    tmp_path: Path, db: sqlite3.Connection
) -> None:
    group = writer(tmp_path)
    entries = [group.enqueue(INSERT, {"k": f"k{n}", "v": n}) for n in range(2)]
    group.flush(FailingDb(db, "COMMIT"))  # type: ignore[arg-type]
    raised = []
    for entry in entries:
        with pytest.raises(sqlite3.OperationalError) as info:
            answer(entry)
        raised.append(info.value)
    assert raised[0] is not raised[1]
    assert raised[0].__cause__ is raised[1].__cause__  # the group's one error


async def _hold_thread(ledger: SQLiteLedger) -> tuple[threading.Event, asyncio.Future[Any]]:
    """Block the ledger's connection thread until the event is set (writes queue meanwhile)."""
    conn = await ledger._connection()
    gate = threading.Event()
    blocked = asyncio.ensure_future(live.on_thread(conn, lambda: gate.wait(10)))
    await asyncio.sleep(0)
    return gate, blocked


async def _first_calls_held_together(
    ledger: SQLiteLedger, runner: ActionRunner, ops: list[CountingOperation]
) -> list[Any]:
    """One first call per operation (key ``k<n>``), all queued while the thread is held."""
    gate, blocked = await _hold_thread(ledger)
    calls = [
        asyncio.ensure_future(
            runner.execute("charge", op, request={"n": n}, idempotency_key=f"k{n}")
        )
        for n, op in enumerate(ops)
    ]
    await asyncio.sleep(0.05)  # every call has looked its key up and queued its claim
    gate.set()
    await blocked
    results: list[Any] = await asyncio.gather(*calls, return_exceptions=True)
    return results


async def test_concurrent_first_calls_commit_together_and_each_runs_once(tmp_path: Path) -> None:
    ledger = SQLiteLedger(tmp_path / "ledger.sqlite3")
    runner = ActionRunner(ledger, lease=None)
    await runner.execute("charge", CountingOperation(), request={}, idempotency_key="warm")
    ops = [CountingOperation(f"ch_{n}") for n in range(16)]
    results = await _first_calls_held_together(ledger, runner, ops)
    assert [r.status for r in results] == [ActionStatus.CONFIRMED] * 16
    assert [op.calls for op in ops] == [1] * 16
    assert max(ledger._group.group_sizes) == 16  # the sixteen claims: one transaction
    # Replays read: the same receipts, nothing invoked again.
    again = await asyncio.gather(
        *(
            runner.execute("charge", ops[n], request={"n": n}, idempotency_key=f"k{n}")
            for n in range(16)
        )
    )
    assert all(r.replayed for r in again)
    assert [op.calls for op in ops] == [1] * 16
    await ledger.close()


async def test_the_claims_of_one_group_are_stamped_with_one_reading_of_the_ledger_clock(
    tmp_path: Path,
) -> None:
    """A group's writes commit at one moment: its claims share their ``stored_at`` and
    lease end, although the ledger's clock moves on every reading."""
    readings: list[datetime] = []

    def ticking() -> datetime:
        readings.append(datetime(2026, 1, 1, tzinfo=UTC) + timedelta(seconds=len(readings)))
        return readings[-1]

    ledger = SQLiteLedger(tmp_path / "ledger.sqlite3", clock=ticking)
    runner = ActionRunner(ledger, lease=30)
    let_go = asyncio.Event()

    async def paused() -> str:
        await let_go.wait()
        return "ch"

    await runner.execute("charge", lambda: "warm", request={}, idempotency_key="warm")
    groups_before = len(ledger._group.group_sizes)
    gate, blocked = await _hold_thread(ledger)
    calls = [
        asyncio.ensure_future(
            runner.execute("charge", paused, request={"n": n}, idempotency_key=f"k{n}")
        )
        for n in range(4)
    ]
    await asyncio.sleep(0.05)  # every call has looked its key up and queued its claim
    gate.set()
    await blocked
    while len(ledger._group.group_sizes) == groups_before:  # noqa: ASYNC110 - not run yet
        await asyncio.sleep(0.01)
    assert ledger._group.group_sizes[groups_before] == 4
    claims = [await ledger.find("charge", f"k{n}") for n in range(4)]
    assert len({c.stored_at for c in claims if c is not None}) == 1
    assert len({c.lease_expires_at for c in claims if c is not None}) == 1
    let_go.set()
    await asyncio.gather(*calls)
    await ledger.close()


async def test_every_statement_of_a_group_runs_under_the_writer_lock(tmp_path: Path) -> None:
    ledger = SQLiteLedger(tmp_path / "ledger.sqlite3")
    runner = ActionRunner(ledger, lease=None)
    await runner.execute("charge", CountingOperation(), request={}, idempotency_key="warm")
    conn = await ledger._connection()
    seen: list[tuple[str, bool]] = []

    def trace(sql: str) -> None:
        verb = sql.lstrip().split(None, 1)[0].upper()
        if verb in ("INSERT", "UPDATE", "DELETE", "BEGIN", "COMMIT"):
            seen.append((verb, lock_is_free(tmp_path / "ledger.sqlite3.lock")))

    await live.on_thread(conn, lambda: conn._conn.set_trace_callback(trace))
    gate, blocked = await _hold_thread(ledger)
    calls = [
        asyncio.ensure_future(
            runner.execute("charge", CountingOperation(), request={"n": n}, idempotency_key=f"k{n}")
        )
        for n in range(4)
    ]
    await asyncio.sleep(0.05)
    gate.set()
    await blocked
    await asyncio.gather(*calls)
    await live.on_thread(conn, lambda: conn._conn.set_trace_callback(None))
    await ledger.close()
    assert ("BEGIN", False) in seen  # a group ran
    assert [verb for verb, free in seen if free] == []


async def test_a_cancelled_caller_leaves_no_write_behind(tmp_path: Path) -> None:
    """A claim given up before its group ran never runs later, when nobody waits for it."""
    ledger = SQLiteLedger(tmp_path / "ledger.sqlite3")
    runner = ActionRunner(ledger, lease=None)
    await runner.execute("charge", CountingOperation(), request={}, idempotency_key="warm")
    gate, blocked = await _hold_thread(ledger)
    op = CountingOperation()
    call = asyncio.ensure_future(
        runner.execute("charge", op, request={"n": 1}, idempotency_key="given-up")
    )
    await asyncio.sleep(0.05)  # its look-up is queued on the held thread
    call.cancel()
    with pytest.raises(asyncio.CancelledError):
        await call
    gate.set()
    await blocked
    # Other writes flush the queue afterwards: the given-up claim is not among them.
    await runner.execute("charge", CountingOperation(), request={}, idempotency_key="later")
    assert await ledger.receipts(idempotency_key="given-up") == []
    assert op.calls == 0
    assert ledger._group._queue == []
    await ledger.close()


async def test_one_key_claimed_by_many_in_one_group_runs_once(tmp_path: Path) -> None:
    ledger = SQLiteLedger(tmp_path / "ledger.sqlite3")
    runner = ActionRunner(ledger, lease=None)
    await runner.execute("charge", CountingOperation(), request={}, idempotency_key="warm")
    gate, blocked = await _hold_thread(ledger)
    op = CountingOperation("ch_1")
    calls = [
        asyncio.ensure_future(runner.execute("charge", op, request={"n": 1}, idempotency_key="hot"))
        for _ in range(8)
    ]
    await asyncio.sleep(0.05)
    gate.set()
    await blocked
    outcomes = await asyncio.gather(*calls, return_exceptions=True)
    assert op.calls == 1
    confirmed = [o for o in outcomes if not isinstance(o, BaseException)]
    assert confirmed, outcomes
    assert {o.receipt.action_id for o in confirmed} == {confirmed[0].receipt.action_id}
    await ledger.close()


async def test_a_failed_group_commit_under_the_runner_is_read_back_and_never_repeated(
    tmp_path: Path,
) -> None:
    """Claims in a group whose COMMIT fails: nothing ran, each caller is told so, none runs twice."""
    ledger = SQLiteLedger(tmp_path / "ledger.sqlite3")
    runner = ActionRunner(ledger, lease=None)
    await runner.execute("charge", CountingOperation(), request={}, idempotency_key="warm")
    group = ledger._group
    real_flush = group.flush
    failures = {"left": 1}

    def flush_once_failing(db: sqlite3.Connection) -> None:
        with group._lock:
            queued = len(group._queue)
        if queued > 1 and failures["left"]:
            failures["left"] -= 1
            real_flush(FailingDb(db, "COMMIT"))  # type: ignore[arg-type]
        else:
            real_flush(db)

    group.flush = flush_once_failing  # type: ignore[method-assign]
    ops = [CountingOperation(f"ch_{n}") for n in range(4)]
    outcomes = await _first_calls_held_together(ledger, runner, ops)
    assert failures["left"] == 0
    for op, outcome in zip(ops, outcomes, strict=True):
        # The claim was not stored: the operation never ran, and the caller knows.
        assert isinstance(outcome, NothingInvokedError), outcome
        assert op.calls == 0
    assert await ledger.receipts(idempotency_key="k0") == []
    # Retried, each runs exactly once.
    done = [
        await runner.execute("charge", ops[n], request={"n": n}, idempotency_key=f"k{n}")
        for n in range(4)
    ]
    assert [r.status for r in done] == [ActionStatus.CONFIRMED] * 4
    assert [op.calls for op in ops] == [1] * 4
    await ledger.close()


async def test_a_failed_group_commit_of_outcomes_leaves_claims_pending_never_repeated(
    tmp_path: Path,
) -> None:
    """Outcomes in a group whose COMMIT fails: each caller learns its outcome was not recorded,
    and the claims stay held, so no retry runs the operation again."""
    ledger = SQLiteLedger(tmp_path / "ledger.sqlite3")
    runner = ActionRunner(ledger, lease=None)
    await runner.execute("charge", CountingOperation(), request={}, idempotency_key="warm")
    group = ledger._group
    real_flush = group.flush
    state = {"armed": False, "failed": 0}

    def flush(db: sqlite3.Connection) -> None:
        with group._lock:
            queued = len(group._queue)
        if state["armed"] and queued > 1 and not state["failed"]:
            state["failed"] = queued
            real_flush(FailingDb(db, "COMMIT"))  # type: ignore[arg-type]
        else:
            real_flush(db)

    group.flush = flush  # type: ignore[method-assign]
    conn = await ledger._connection()
    gate = threading.Event()
    invoked = asyncio.Event()
    counts = [0] * 4
    holders: list[asyncio.Future[Any]] = []

    def op_for(n: int) -> Any:
        async def run() -> str:
            counts[n] += 1
            if sum(counts) == 4:  # the last one in: hold the thread, then let all four finish
                state["armed"] = True
                holders.append(asyncio.ensure_future(live.on_thread(conn, lambda: gate.wait(10))))
                await asyncio.sleep(0)  # the hold is queued on the thread before any outcome
                asyncio.get_running_loop().call_later(0.1, gate.set)
                invoked.set()
            await invoked.wait()
            return f"ch_{n}"

        return run

    outcomes = await asyncio.gather(
        *(
            runner.execute("charge", op_for(n), request={"n": n}, idempotency_key=f"k{n}")
            for n in range(4)
        ),
        return_exceptions=True,
    )
    assert state["failed"] == 4  # the four outcomes, queued behind the held thread: one group
    assert counts == [1, 1, 1, 1]
    for outcome in outcomes:
        assert isinstance(outcome, OutcomeNotRecordedError), outcome
    pending = await ledger.receipts(pending=True)
    assert len(pending) == 4
    # A retry never repeats a call whose outcome was lost: the claims stay held.
    for n in range(4):
        with pytest.raises(DataoadError):
            await runner.execute("charge", op_for(n), request={"n": n}, idempotency_key=f"k{n}")
    assert counts == [1, 1, 1, 1]
    await ledger.close()


async def test_a_group_that_cannot_be_rolled_back_leaves_a_ledger_that_refuses_everything(
    tmp_path: Path,
) -> None:
    """COMMIT and ROLLBACK both fail: the connection would show uncommitted claims as stored.

    The ledger then refuses every read and write on it, so no read-back can
    prove a claim that was never committed: nothing is invoked.
    """
    path = tmp_path / "ledger.sqlite3"
    ledger = SQLiteLedger(path)
    runner = ActionRunner(ledger, lease=None)
    await runner.execute("charge", CountingOperation(), request={}, idempotency_key="warm")
    group = ledger._group
    real_flush = group.flush

    def flush(db: sqlite3.Connection) -> None:
        with group._lock:
            several = len(group._queue) > 1
        real_flush(FailingDb(db, "COMMIT", "ROLLBACK") if several else db)  # type: ignore[arg-type]

    group.flush = flush  # type: ignore[method-assign]
    ops = [CountingOperation(f"ch_{n}") for n in range(3)]
    outcomes = await _first_calls_held_together(ledger, runner, ops)
    assert [type(o) for o in outcomes] == [NothingInvokedError] * 3
    assert [op.calls for op in ops] == [0, 0, 0]
    with pytest.raises(BrokenConnectionError):
        await ledger.get("0" * 32)
    later = await asyncio.gather(
        runner.execute("charge", CountingOperation(), request={}, idempotency_key="later"),
        return_exceptions=True,
    )
    assert isinstance(later[0], NothingInvokedError)
    await ledger.close()  # closing rolls the stuck transaction back
    async with SQLiteLedger(path) as fresh:
        assert [r.idempotency_key for r in await fresh.receipts()] == ["warm"]


async def test_a_caller_cancelled_while_its_group_waits_for_the_lock_never_writes(
    tmp_path: Path,
) -> None:
    path = tmp_path / "ledger.sqlite3"
    ledger = SQLiteLedger(path, busy_timeout=5)
    runner = ActionRunner(ledger, lease=None)
    await runner.execute("charge", CountingOperation(), request={}, idempotency_key="warm")
    holder = HeldWriterLock(path)  # another process writing: the group waits
    op = CountingOperation()
    call = asyncio.ensure_future(
        runner.execute("charge", op, request={"n": 1}, idempotency_key="given-up")
    )
    await asyncio.sleep(0.2)  # its claim's group is waiting for the lock
    call.cancel()
    with pytest.raises(asyncio.CancelledError):
        await call
    holder.release()  # the group gets the lock, and finds its only write withdrawn
    await runner.execute("charge", CountingOperation(), request={}, idempotency_key="after")
    assert await ledger.receipts(idempotency_key="given-up") == []
    assert op.calls == 0
    await ledger.close()


def test_a_program_ending_while_a_write_is_queued_ends(tmp_path: Path) -> None:
    """``asyncio.run`` cancels every task at its end; a write queued then (and the runner's
    own write on cancellation) is still answered, so the program ends."""
    code = f"""
import asyncio
from dataoad import SQLiteLedger

async def worker(ledger):
    try:
        await ledger.release("a" * 32, 1)
    except asyncio.CancelledError:
        await ledger.release("b" * 32, 1)  # a best-effort write on cancellation
        raise

async def main():
    ledger = SQLiteLedger({str(tmp_path / "ledger.sqlite3")!r})
    await ledger.get("c" * 32)
    asyncio.get_running_loop().create_task(worker(ledger))
    # main ends in the same turn the worker queues its write

asyncio.run(main())
print("ended")
"""
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "ended"


async def test_an_error_that_is_not_one_statements_fails_the_whole_group(
    tmp_path: Path, db: sqlite3.Connection
) -> None:
    group = writer(tmp_path)
    entries = [group.enqueue(INSERT, {"k": f"k{n}", "v": n}) for n in range(3)]

    class DiskFull:
        def __init__(self) -> None:
            self.writes = 0

        @property
        def in_transaction(self) -> bool:
            return db.in_transaction

        def execute(self, sql: str, *args: Any) -> Any:
            if sql.startswith("INSERT"):
                self.writes += 1
                if self.writes == 2:  # SQLite kept the transaction, but the disk is full
                    raise sqlite3.OperationalError("database or disk is full")
            return db.execute(sql, *args)

    group.flush(DiskFull())  # type: ignore[arg-type]
    for entry in entries:
        with pytest.raises(sqlite3.OperationalError):
            answer(entry)
    assert stored(tmp_path / "g.sqlite3") == {}


# -- withdrawing a write, a closed connection, a stuck transaction ----------------


def test_a_write_is_withdrawn_until_its_group_runs_it_and_never_after(
    tmp_path: Path, db: sqlite3.Connection
) -> None:
    group = writer(tmp_path)
    queued = group.enqueue(INSERT, {"k": "queued", "v": 1})
    assert group.withdraw(queued) is True
    assert group._queue == []  # taken out of the queue
    not_yet = QueuedWrite(INSERT, {"k": "not yet", "v": 2})
    assert group.withdraw(not_yet) is True
    group.put(not_yet)  # a put on its way after the caller gave up: skipped
    assert group._queue == []
    verdicts: list[bool] = []
    running = group.enqueue(INSERT, {"k": "running", "v": 3})
    other = group.enqueue(INSERT, {"k": "other", "v": 4})

    class GivesUpMidGroup:
        """The caller of ``running`` gives up while its group runs: too late."""

        in_transaction = property(lambda self: db.in_transaction)

        def execute(self, sql: str, *args: Any) -> Any:
            if sql.startswith("INSERT") and not verdicts:
                verdicts.append(group.withdraw(running))
            return db.execute(sql, *args)

    group.flush(GivesUpMidGroup())  # type: ignore[arg-type]
    assert verdicts == [False]
    assert answer(running) == [("running",)]  # it ran, and says so
    assert answer(other) == [("other",)]
    for gone in (queued, not_yet):
        with pytest.raises(DataoadError, match="never run"):
            answer(gone)
    assert stored(tmp_path / "g.sqlite3") == {"running": 3, "other": 4}


def test_a_write_withdrawn_while_its_group_waits_for_the_lock_is_not_failed_with_it(
    tmp_path: Path, db: sqlite3.Connection
) -> None:
    group = writer(tmp_path, busy_timeout=0.05)
    kept = group.enqueue(INSERT, {"k": "kept", "v": 1})
    given_up = group.enqueue(INSERT, {"k": "given up", "v": 2})
    real_hold = group._writer.hold

    def hold(timeout: float) -> Any:
        group.withdraw(given_up)  # its caller gives up while the group waits
        return real_hold(timeout)

    group._writer.hold = hold  # type: ignore[method-assign]
    with HeldWriterLock(tmp_path / "g.sqlite3"):
        group.flush(db)
    with pytest.raises(LedgerBusyError):
        answer(kept)
    with pytest.raises(DataoadError, match="never run"):
        answer(given_up)  # nobody waits for it: it is not answered with the group's error
    assert stored(tmp_path / "g.sqlite3") == {}


async def test_a_write_given_up_while_its_group_waits_for_the_lock_never_runs(
    tmp_path: Path,
) -> None:
    """Any write, not only a claim: its caller is cancelled while the group waits."""
    path = tmp_path / "ledger.sqlite3"
    ledger = SQLiteLedger(path, busy_timeout=5)
    claim = await unstarted(ledger, "k")
    with HeldWriterLock(path):
        release = asyncio.ensure_future(ledger.release(claim.action_id, claim.version))
        await asyncio.sleep(0.2)  # its group waits for the lock
        release.cancel()
        with pytest.raises(asyncio.CancelledError):
            await release
    assert await ledger.release("0" * 32, 1) is False  # a later group runs; the release not
    assert await ledger.get(claim.action_id) == claim
    await ledger.close()


async def test_writes_queued_on_a_closed_connection_fail_with_its_error(tmp_path: Path) -> None:
    import aiosqlite

    conn = await aiosqlite.connect(tmp_path / "closed.sqlite3")
    await conn.close()
    group = writer(tmp_path)
    entry = group.put(group.new_entry(INSERT, {"k": "a", "v": 1}))
    with pytest.raises(LedgerClosedError, match="SQLite connection is closed"):
        await group.flushed(conn, entry)
    assert group._queue == []
    assert group.withdraw(entry) is False  # answered already: nothing left to take back
    # Nothing is left scheduled: the next write schedules a flush of its own.
    assert group._flush_queued is False


class _GoneConnection:
    """An aiosqlite connection whose sqlite3 connection went away before the job ran."""

    @property
    def _conn(self) -> sqlite3.Connection:
        raise ValueError("no active connection")


class _LiveConnection:
    def __init__(self, db: sqlite3.Connection) -> None:
        self._conn = db


async def test_the_flush_job_answers_its_writes_itself(
    tmp_path: Path, db: sqlite3.Connection
) -> None:
    """The job queued on the connection's thread has no future (whose answer would wake
    the loop a second time): it answers its writes, with rows once it ran, and with why
    when it could not run at all."""
    group = writer(tmp_path)
    entry = group.put(group.new_entry(INSERT, {"k": "a", "v": 1}))
    group._flush_on(_GoneConnection())  # type: ignore[arg-type]
    assert entry.done is not None
    await entry.done
    with pytest.raises(DataoadError, match=r"^the ledger's connection stopped$"):
        answer(entry)
    assert group.withdraw(entry) is False  # answered already: nothing left to take back
    assert group._queue == []
    assert group._flush_queued is False  # the next write schedules a flush of its own
    kept = group.put(group.new_entry(INSERT, {"k": "b", "v": 2}))
    group._flush_on(_LiveConnection(db))  # type: ignore[arg-type]
    assert kept.done is not None
    await kept.done
    assert answer(kept) == [("b",)]
    assert group._queue == []


async def test_a_queued_flush_wakes_its_callers_loop_once(tmp_path: Path) -> None:
    """A lone write is answered with one wake-up of the loop: the group's."""
    async with SQLiteLedger(tmp_path / "ledger.sqlite3") as ledger:
        await ledger.get("0" * 32)  # open first
        loop = asyncio.get_running_loop()
        woken: list[object] = []
        real = loop.call_soon_threadsafe

        def counted(callback: Any, *args: Any, **kwargs: Any) -> Any:
            woken.append(callback)
            return real(callback, *args, **kwargs)

        loop.call_soon_threadsafe = counted  # type: ignore[assignment]

        async def charge() -> str:  # async: a sync one would be answered from a thread too
            return "ch"

        try:
            await ActionRunner(ledger).execute(
                "charge", charge, request={"n": 1}, idempotency_key="k"
            )
        finally:
            del loop.call_soon_threadsafe
        # Two writes (the claim, the outcome), one wake-up each.
        assert len(woken) == 2


def test_a_stuck_transaction_breaks_the_writer_and_says_what_to_do(
    tmp_path: Path, db: sqlite3.Connection
) -> None:
    group = writer(tmp_path)
    entries = [group.enqueue(INSERT, {"k": f"k{n}", "v": n}) for n in range(2)]
    group.flush(FailingDb(db, "COMMIT", "ROLLBACK"))  # type: ignore[arg-type]
    assert str(group.broken) == (
        "a failed group of writes could not be rolled back; this ledger's connection "
        "is unusable: close the ledger and open it again"
    )
    with pytest.raises(BrokenConnectionError, match="close the ledger and open it again"):
        group.check_usable()
    for entry in entries:
        with pytest.raises(sqlite3.OperationalError, match="injected at COMMIT"):
            answer(entry)
    db.execute("ROLLBACK")


def test_a_transaction_that_fails_is_rolled_back_and_one_that_succeeds_commits(
    tmp_path: Path, db: sqlite3.Connection
) -> None:
    group = writer(tmp_path)
    trace = Statements(db)

    def insert_then_fail() -> None:
        db.execute("INSERT INTO t VALUES ('a', 1)")
        raise RuntimeError("body failed")

    with pytest.raises(RuntimeError):
        group.transaction(db, insert_then_fail)
    assert not db.in_transaction
    assert group.broken is None
    assert trace.seen[-1] == "ROLLBACK"
    assert group.transaction(db, lambda: db.execute("INSERT INTO t VALUES ('b', 2)").rowcount) == 1
    assert trace.seen[-1] == "COMMIT"
    assert stored(tmp_path / "g.sqlite3") == {"b": 2}


def test_a_group_reads_the_ledgers_clock_once_for_all_its_statements(
    tmp_path: Path, db: sqlite3.Connection
) -> None:
    readings: list[datetime] = []
    handed: list[datetime | None] = []

    def clock() -> datetime:
        readings.append(datetime(2026, 1, 1, tzinfo=UTC) + timedelta(seconds=len(readings)))
        return readings[-1]

    def params(statement: Any, values: dict[str, Any], now: datetime | None) -> Any:
        handed.append(now)
        return statement.bind(values)

    group = GroupWriter(WriterLock(tmp_path / "g.sqlite3.lock"), 1.0, params, clock)
    for n in range(3):
        group.enqueue(INSERT, {"k": f"k{n}", "v": n})
    group.flush(db)
    assert handed == [readings[0]] * 3  # its writes commit at one moment
    group.enqueue(INSERT, {"k": "lone", "v": 9})
    group.flush(db)
    assert handed[3:] == [readings[1]]  # a lone write is handed the clock too
    assert len(readings) == 2


async def test_writes_queued_together_are_flushed_once_and_nothing_is_left_unhandled(
    tmp_path: Path,
) -> None:
    import aiosqlite

    conn = await aiosqlite.connect(tmp_path / "g.sqlite3", isolation_level=None)
    await conn.execute("CREATE TABLE t (k TEXT PRIMARY KEY, v INTEGER NOT NULL)")
    loop = asyncio.get_running_loop()
    unhandled: list[dict[str, Any]] = []
    loop.set_exception_handler(lambda _, context: unhandled.append(context))
    group = writer(tmp_path)
    flushes: list[int] = []
    real_flush = group.flush

    def flush(db: sqlite3.Connection) -> None:
        flushes.append(len(group._queue))
        real_flush(db)

    group.flush = flush  # type: ignore[method-assign]
    try:
        entries = [group.put(group.new_entry(INSERT, {"k": f"k{n}", "v": n})) for n in range(3)]
        answers = await asyncio.gather(*(group.flushed(conn, e) for e in entries))
        await asyncio.sleep(0.05)  # any callback left over has run by now
    finally:
        loop.set_exception_handler(None)
        await conn.close()
    assert answers == [[("k0",)], [("k1",)], [("k2",)]]
    assert flushes == [3]  # one flush queued for all three, not one each
    assert group.group_sizes == [3]
    assert unhandled == []


def test_a_transaction_left_open_on_the_connection_is_never_built_on(
    tmp_path: Path, db: sqlite3.Connection
) -> None:
    db.execute("BEGIN")
    db.execute("INSERT INTO t VALUES ('stray', 1)")  # someone else's, never committed
    group = writer(tmp_path)
    entries = [group.enqueue(INSERT, {"k": f"k{n}", "v": n}) for n in range(2)]
    group.flush(db)
    assert [answer(e) for e in entries] == [[("k0",)], [("k1",)]]
    assert group.broken is None
    assert stored(tmp_path / "g.sqlite3") == {"k0": 0, "k1": 1}


def test_a_broken_writer_runs_nothing_more_on_its_connection(
    tmp_path: Path, db: sqlite3.Connection
) -> None:
    group = writer(tmp_path)
    group.enqueue(INSERT, {"k": "a", "v": 1})
    group.enqueue(INSERT, {"k": "b", "v": 2})
    failing = FailingDb(db, "COMMIT", "ROLLBACK")
    group.flush(failing)  # type: ignore[arg-type]
    assert group.broken is not None
    trace = Statements(db)
    later = group.enqueue(INSERT, {"k": "c", "v": 3})
    group.flush(failing)  # type: ignore[arg-type]
    with pytest.raises(BrokenConnectionError):
        answer(later)
    with pytest.raises(BrokenConnectionError):
        group.transaction(db, lambda: db.execute("INSERT INTO t VALUES ('d', 4)"))
    assert trace.seen == []  # not even a rollback
    assert db.in_transaction  # left as it is, for closing the ledger to undo
    db.execute("ROLLBACK")


class RollsBackAt:
    """A connection on which one INSERT makes SQLite roll the whole transaction back.

    ``raises`` is what that statement raises (None: it returns, as a
    statement can after SQLite abandoned the transaction).
    """

    def __init__(self, db: sqlite3.Connection, key: str, raises: Exception | None) -> None:
        self._db, self._key, self._raises = db, key, raises

    @property
    def in_transaction(self) -> bool:
        return self._db.in_transaction

    def execute(self, sql: str, *args: Any) -> Any:
        if sql.startswith("INSERT") and args and self._key in args[0]:
            self._db.execute("ROLLBACK")
            if self._raises is not None:
                raise self._raises
            return self._db.execute("SELECT 1 WHERE 0")
        return self._db.execute(sql, *args)


@pytest.mark.parametrize(
    ("raises", "message"),
    [
        (sqlite3.IntegrityError("ROLLBACK constraint"), "ROLLBACK constraint"),
        (None, "transaction rolled back"),
    ],
    ids=["its own error", "no error of its own"],
)
def test_a_statement_that_rolls_the_transaction_back_fails_the_whole_group(
    tmp_path: Path, db: sqlite3.Connection, raises: Exception | None, message: str
) -> None:
    group = writer(tmp_path)
    entries = [group.enqueue(INSERT, {"k": f"k{n}", "v": n}) for n in range(3)]
    group.flush(RollsBackAt(db, "k1", raises))  # type: ignore[arg-type]
    for entry in entries:
        with pytest.raises(sqlite3.DatabaseError) as info:
            answer(entry)
        assert str(info.value) == message
    assert stored(tmp_path / "g.sqlite3") == {}
    assert group.broken is None


@pytest.mark.parametrize(("before", "after"), [(999, 1000), (1000, 501)])
def test_the_record_of_group_sizes_is_kept_to_about_a_thousand(
    tmp_path: Path, db: sqlite3.Connection, before: int, after: int
) -> None:
    group = writer(tmp_path)
    group.group_sizes.extend([1] * before)
    group.enqueue(INSERT, {"k": "a", "v": 1})
    group.flush(db)
    assert len(group.group_sizes) == after
    assert group.group_sizes[-1] == 1


async def test_writes_whose_loop_has_closed_are_settled_without_an_error(tmp_path: Path) -> None:
    other = asyncio.new_event_loop()
    orphan = QueuedWrite(INSERT, {"k": "a", "v": 1}, other.create_future())
    other.close()  # its caller's loop is gone: nobody waits any more
    mine = QueuedWrite(INSERT, {"k": "b", "v": 2}, asyncio.get_running_loop().create_future())
    _settle([orphan, mine])  # no RuntimeError from the closed loop
    assert mine.done is not None
    await mine.done


def test_a_write_that_never_ran_says_so() -> None:
    with pytest.raises(DataoadError) as info:
        answer(QueuedWrite(INSERT, {"k": "a", "v": 1}))
    assert str(info.value) == "the write was never run: its ledger stopped"


def _finds(value: Any) -> Any:
    """A look-up that answers ``value`` (None: finds nothing), counting its reads."""

    def look_up(db: sqlite3.Connection) -> Any:
        look_up.reads += 1  # type: ignore[attr-defined]
        return value

    look_up.reads = 0  # type: ignore[attr-defined]
    return look_up


def _looked_up(group: GroupWriter, look_up: Any, k: str, v: int) -> QueuedWrite:
    return group.put(QueuedWrite(INSERT, {"k": k, "v": v}, look_up=look_up))


def test_a_write_whose_look_up_finds_is_answered_by_it_and_never_runs(
    tmp_path: Path, db: sqlite3.Connection
) -> None:
    group = writer(tmp_path)
    held = _looked_up(group, _finds("the holder"), "held", 1)
    free = _looked_up(group, _finds(None), "free", 2)
    plain = group.enqueue(INSERT, {"k": "plain", "v": 3})
    trace = Statements(db)
    group.flush(db)
    assert (held.found, answer(held)) == ("the holder", [])
    assert (free.found, answer(free)) == (None, [("free",)])
    assert answer(plain) == [("plain",)]
    assert trace.seen == ["BEGIN", "INSERT", "INSERT", "COMMIT"]  # the held one never ran
    assert group.group_sizes == [2]
    assert stored(tmp_path / "g.sqlite3") == {"free": 2, "plain": 3}


def test_writes_all_answered_by_their_look_ups_take_no_writer_lock(
    tmp_path: Path, db: sqlite3.Connection
) -> None:
    """Replays are reads: another writer holding the lock does not hold them up."""
    group = writer(tmp_path, busy_timeout=0.05)
    finds = _finds("the holder")
    entries = [_looked_up(group, finds, f"k{n}", n) for n in range(3)]
    holds: list[float] = []
    real_hold = group._writer.hold

    def hold(timeout: float) -> Any:
        holds.append(timeout)
        return real_hold(timeout)

    group._writer.hold = hold  # type: ignore[method-assign]
    with HeldWriterLock(tmp_path / "g.sqlite3"):
        group.flush(db)
    assert [(e.found, answer(e)) for e in entries] == [("the holder", [])] * 3
    assert finds.reads == 3
    assert holds == []  # never even waited for the lock
    assert group.group_sizes == []  # no group ran
    # A write left by its look-up does wait for the lock, and fails without it.
    left = _looked_up(group, _finds(None), "free", 1)
    with HeldWriterLock(tmp_path / "g.sqlite3"):
        group.flush(db)
    with pytest.raises(LedgerBusyError):
        answer(left)
    assert stored(tmp_path / "g.sqlite3") == {}


def test_a_look_up_that_raises_fails_its_write_alone(
    tmp_path: Path, db: sqlite3.Connection
) -> None:
    group = writer(tmp_path)

    def broken(db: sqlite3.Connection) -> Any:
        raise sqlite3.DatabaseError("a row that cannot be read")

    bad = _looked_up(group, broken, "bad", 1)
    good = _looked_up(group, _finds(None), "good", 2)
    group.flush(db)
    with pytest.raises(sqlite3.DatabaseError, match="cannot be read"):
        answer(bad)
    assert answer(good) == [("good",)]
    assert stored(tmp_path / "g.sqlite3") == {"good": 2}  # the failed one never wrote


def test_a_broken_writer_runs_no_look_up(tmp_path: Path, db: sqlite3.Connection) -> None:
    """Its connection would read its own uncommitted writes."""
    group = writer(tmp_path)
    group.broken = BrokenConnectionError("broken")
    finds = _finds("the holder")
    entry = _looked_up(group, finds, "k", 1)
    group.flush(db)
    with pytest.raises(BrokenConnectionError):
        answer(entry)
    assert finds.reads == 0


async def test_a_replay_is_answered_while_another_writer_holds_the_lock(tmp_path: Path) -> None:
    path = tmp_path / "ledger.sqlite3"
    ledger = SQLiteLedger(path, busy_timeout=0.1)
    claim = await unstarted(ledger, "k")
    with HeldWriterLock(path):
        held, created = await ledger.claim(dataclasses.replace(claim, action_id="f" * 32), lease=30)
        assert (held, created) == (claim, False)
        with pytest.raises(LedgerBusyError):  # a free key needs the lock
            await ledger.claim(
                dataclasses.replace(claim, action_id="e" * 32, idempotency_key="free"), lease=30
            )
    assert await ledger.find("charge", "free") is None
    await ledger.close()


async def test_concurrent_claims_are_looked_up_by_one_flush(tmp_path: Path) -> None:
    """No claim costs a hop of its own to the connection's thread: one flush reads and
    writes them all, replays included."""
    ledger = SQLiteLedger(tmp_path / "ledger.sqlite3")
    claim = await unstarted(ledger, "held")
    conn = await ledger._connection()
    hops: list[object] = []
    real = conn._tx

    class CountingQueue:
        """The thread's queue of work, counting what is put on it."""

        def put_nowait(self, item: Any) -> None:
            hops.append(item)
            real.put_nowait(item)

    reads: list[str] = []
    await live.on_thread(
        conn,
        lambda: conn._conn.set_trace_callback(
            lambda sql: reads.append(sql) if sql.lstrip().upper().startswith("SELECT") else None
        ),
    )
    gate, blocked = await _hold_thread(ledger)
    conn._tx = CountingQueue()  # type: ignore[assignment]
    fresh = [
        dataclasses.replace(claim, action_id=f"{n:032x}", idempotency_key=f"k{n}") for n in range(8)
    ]
    claims = [asyncio.ensure_future(ledger.claim(r, lease=30)) for r in fresh]
    replay = asyncio.ensure_future(
        ledger.claim(dataclasses.replace(claim, action_id="f" * 32), lease=30)
    )
    await asyncio.sleep(0.05)
    gate.set()
    await blocked
    made = await asyncio.gather(*claims)
    assert await replay == (claim, False)
    conn._tx = real
    assert len(hops) == 1  # one flush for nine claims
    assert len(reads) == 1  # and one read for their nine look-ups
    await live.on_thread(conn, lambda: conn._conn.set_trace_callback(None))
    assert [created for _, created in made] == [True] * 8
    assert ledger._group.group_sizes[-1] == 8
    for receipt, _ in made:
        assert await ledger.find("charge", receipt.idempotency_key) == receipt
    await ledger.close()


def _together(found: dict[Any, Any]) -> Any:
    """A ``look_up_together`` answering from ``found`` by key, noting each read's keys."""

    def look_up_together(db: sqlite3.Connection, keys: list[Any]) -> list[Any]:
        look_up_together.reads.append(list(keys))  # type: ignore[attr-defined]
        return [found.get(key) for key in keys]

    look_up_together.reads = []  # type: ignore[attr-defined]
    return look_up_together


def _keyed(group: GroupWriter, look_up: Any, k: str, v: int) -> QueuedWrite:
    return group.put(QueuedWrite(INSERT, {"k": k, "v": v}, look_up=look_up, look_up_key=k))


def test_the_look_ups_of_a_group_are_one_read(tmp_path: Path, db: sqlite3.Connection) -> None:
    together = _together({"held": "the holder"})
    group = GroupWriter(
        WriterLock(tmp_path / "g.sqlite3.lock"),
        1.0,
        lambda s, v, now: s.bind(v),
        look_up_together=together,
    )
    alone = _finds("never asked")
    held = _keyed(group, alone, "held", 1)
    free = _keyed(group, alone, "free", 2)
    unkeyed = _looked_up(group, _finds(None), "unkeyed", 3)  # no key: read alone
    group.flush(db)
    assert together.reads == [["held", "free"]]
    assert alone.reads == 0
    assert (held.found, answer(held)) == ("the holder", [])
    assert (free.found, answer(free)) == (None, [("free",)])
    assert answer(unkeyed) == [("unkeyed",)]
    # A single look-up is read alone: its own statement is the cheaper one.
    one = _keyed(group, _finds(None), "one", 4)
    group.flush(db)
    assert together.reads == [["held", "free"]]
    assert answer(one) == [("one",)]
    assert stored(tmp_path / "g.sqlite3") == {"free": 2, "unkeyed": 3, "one": 4}


@pytest.mark.parametrize("failure", ["raises", "answers too few"])
def test_a_read_together_that_fails_leaves_each_look_up_to_itself(
    tmp_path: Path, db: sqlite3.Connection, failure: str
) -> None:
    def look_up_together(db: sqlite3.Connection, keys: list[Any]) -> list[Any]:
        if failure == "raises":
            raise sqlite3.OperationalError("too many terms")
        return [None] * (len(keys) - 1)

    group = GroupWriter(
        WriterLock(tmp_path / "g.sqlite3.lock"),
        1.0,
        lambda s, v, now: s.bind(v),
        look_up_together=look_up_together,
    )

    def broken(db: sqlite3.Connection) -> Any:
        raise sqlite3.DatabaseError("a row that cannot be read")

    held = _keyed(group, _finds("the holder"), "held", 1)
    bad = _keyed(group, broken, "bad", 2)
    free = _keyed(group, _finds(None), "free", 3)
    group.flush(db)
    assert (held.found, answer(held)) == ("the holder", [])
    with pytest.raises(sqlite3.DatabaseError, match="cannot be read"):
        answer(bad)  # its own read failed: it alone
    assert answer(free) == [("free",)]
    assert stored(tmp_path / "g.sqlite3") == {"free": 3}


@pytest.mark.parametrize("count", [2, 3, 4, 5, 16, 17, 64, 65, 130])
async def test_the_holders_of_many_keys_read_together_are_those_find_reads(
    tmp_path: Path, count: int
) -> None:
    """Every key's holder, across the padded sizes and past one read's widest."""
    from dataoad.ledgers.sqlite import _holders

    ledger = SQLiteLedger(tmp_path / "ledger.sqlite3")
    claim = await unstarted(ledger, "seed")
    keys: list[tuple[str, str, str]] = []
    for n in range(count):
        # The same key text under another action or namespace is another key.
        namespace, action = ("", "charge") if n % 3 else ("tenant", "refund")
        key = (namespace, action, f"k{n // 2}")
        keys.append(key)
        if n % 2 == 0:  # every other key is held; the rest are free
            await ledger.claim(
                dataclasses.replace(
                    claim,
                    action_id=f"{n:032x}",
                    namespace=namespace,
                    action_name=action,
                    idempotency_key=key[2],
                ),
                lease=30,
            )
    keys.append(("", "charge", "seed"))
    conn = await ledger._connection()
    # A retired receipt holds no key: retire the seed's behind the ledger's back.
    await live.on_thread(
        conn,
        lambda: conn._conn.execute(
            "UPDATE receipts SET retired_at = updated_at WHERE idempotency_key = 'seed'"
        ),
    )
    reads: list[str] = []
    await live.on_thread(conn, lambda: conn._conn.set_trace_callback(reads.append))
    found = await live.on_thread(conn, lambda: _holders(conn._conn, keys))
    await live.on_thread(conn, lambda: conn._conn.set_trace_callback(None))
    assert len(reads) == -(-len(keys) // 64)  # one statement per 64 keys
    expected = [await ledger.find(action, key, namespace) for namespace, action, key in keys]
    assert found == expected
    assert any(f is not None for f in found[:-1])  # held keys asked
    assert None in found[:-1]  # and free ones
    assert found[-1] is None
    await ledger.close()
