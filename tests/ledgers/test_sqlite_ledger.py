"""SQLiteLedger specifics: files, schema, durability, processes, crashes, faults."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import os
import sqlite3
import stat
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from dataoad import (
    ActionInProgressError,
    ActionPersistenceError,
    ActionReceipt,
    ActionRunner,
    ActionStatus,
    ClaimState,
    LedgerFileError,
    RecoveryRefusedError,
    SQLiteLedger,
)
from dataoad.ledgers import sqlite as sqlite_module
from dataoad.ledgers._codec import row_of
from dataoad.ledgers._statements import SQLITE, Statements
from dataoad.ledgers.sqlite import APPLICATION_ID, MIGRATIONS, SCHEMA_VERSION
from dataoad.testing import ManualClock, make_receipt, unstarted_claim
from suite_support import skew_wall_clock
from suite_support.ledger_child import CRASH_POINTS, EffectsVerifier, contend_in_processes

ROOT = Path(__file__).resolve().parents[2]


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


async def test_new_files_are_readable_by_their_owner_only(tmp_path: Path) -> None:
    db = tmp_path / "ledger.sqlite3"

    async with SQLiteLedger(db) as ledger:
        await ActionRunner(ledger).execute("a", lambda: 1, request={}, idempotency_key="k")
    for path in tmp_path.iterdir():
        mode = stat.S_IMODE(path.stat().st_mode)
        assert mode & 0o077 == 0, f"{path.name} is {oct(mode)}"


async def test_opens_lazily_and_works_as_in_the_seed(tmp_path: Path) -> None:
    ledger = SQLiteLedger(tmp_path / "dataoad.sqlite3")
    runner = ActionRunner(ledger)
    assert not (tmp_path / "dataoad.sqlite3").exists()
    result = await runner.execute("a", lambda: "v", request={}, idempotency_key="k")
    assert result.status is ActionStatus.CONFIRMED
    await ledger.close()
    await ledger.close()


async def test_completed_receipts_and_claims_survive_a_restart(tmp_path: Path) -> None:
    db = tmp_path / "ledger.sqlite3"
    calls = 0

    def op() -> str:
        nonlocal calls
        calls += 1
        return "v"

    async def first() -> object:
        async with SQLiteLedger(db) as ledger:
            return (
                await ActionRunner(ledger).execute("a", op, request={"x": 1}, idempotency_key="k")
            ).receipt

    async def second() -> object:
        async with SQLiteLedger(db) as ledger:
            return await ActionRunner(ledger).execute(
                "a", op, request={"x": 1}, idempotency_key="k"
            )

    receipt = await first()
    replay = await second()
    assert calls == 1
    assert replay.replayed is True  # type: ignore[attr-defined]
    assert replay.receipt == receipt  # type: ignore[attr-defined]


async def _rejected(path: Path, match: str) -> None:
    before = digest(path)
    names = sorted(p.name for p in path.parent.iterdir())

    ledger = SQLiteLedger(path)
    with pytest.raises(LedgerFileError, match=match):
        await ledger.find("a", "k")
    await ledger.close()
    assert digest(path) == before, "a rejected file was modified"
    # Any reader of a WAL-mode database (our read-only probe included) makes
    # SQLite create its shared-memory and log sidecars; nothing else may appear.
    sidecars = {f"{path.name}-wal", f"{path.name}-shm"}
    after = sorted(p.name for p in path.parent.iterdir() if p.name not in sidecars)
    assert after == [n for n in names if n not in sidecars]


async def test_a_foreign_sqlite_file_is_rejected_unchanged(tmp_path: Path) -> None:
    path = tmp_path / "other.db"
    with contextlib.closing(sqlite3.connect(path)) as conn, conn:
        conn.execute("CREATE TABLE customers (id INTEGER PRIMARY KEY)")
    await _rejected(path, "not a Dataoad ledger")


async def test_a_corrupt_file_is_rejected_unchanged(tmp_path: Path) -> None:
    path = tmp_path / "corrupt.sqlite3"
    path.write_bytes(b"this is not a database at all" * 100)
    await _rejected(path, "not a SQLite database, or corrupt")


async def test_a_newer_schema_is_rejected_unchanged(tmp_path: Path) -> None:
    path = tmp_path / "ledger.sqlite3"

    async with SQLiteLedger(path) as ledger:
        await ledger.claim(make_receipt())
    with contextlib.closing(sqlite3.connect(path)) as conn, conn:
        conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION + 1}")
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    await _rejected(path, "newer than")


async def test_an_older_schema_is_migrated_keeping_every_receipt(tmp_path: Path) -> None:
    path = tmp_path / "v1.sqlite3"
    receipt = make_receipt()
    with contextlib.closing(sqlite3.connect(path)) as conn, conn:
        for statement in MIGRATIONS[1]:
            conn.execute(statement)
        conn.execute(f"PRAGMA application_id = {APPLICATION_ID}")
        conn.execute("PRAGMA user_version = 1")
        conn.execute(
            f"INSERT INTO receipts VALUES ({', '.join('?' * 18)})",
            row_of(receipt, datetime.isoformat)[:18],  # v0.1's columns
        )

    async with SQLiteLedger(path) as ledger:
        assert await ledger.get(receipt.action_id) == receipt
    with contextlib.closing(sqlite3.connect(path)) as conn, conn:
        assert conn.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
        indexes = {row[1] for row in conn.execute("PRAGMA index_list(receipts)")}
        assert "receipts_by_age" in indexes


def test_invalid_constructor_arguments_are_refused(tmp_path: Path) -> None:
    from dataoad import InvalidArgumentError

    for kwargs in ({"synchronous": "OFF"}, {"busy_timeout": -1}, {"busy_timeout": "1"}):
        with pytest.raises(InvalidArgumentError):
            SQLiteLedger(tmp_path / "x.sqlite3", **kwargs)
    with pytest.raises(InvalidArgumentError):
        SQLiteLedger(":memory:")
    with pytest.raises(InvalidArgumentError):
        SQLiteLedger(3)  # type: ignore[arg-type]


async def test_missing_folder_is_a_clear_error(tmp_path: Path) -> None:
    ledger = SQLiteLedger(tmp_path / "nope" / "ledger.sqlite3")
    with pytest.raises(ActionPersistenceError, match="does not exist"):
        await ActionRunner(ledger).execute("a", lambda: 1, request={}, idempotency_key="k")
    await ledger.close()


# -- faults of the database itself -----------------------------------------------------


async def test_busy_past_the_timeout_does_not_invoke(tmp_path: Path) -> None:
    db = tmp_path / "ledger.sqlite3"
    calls = 0

    def op() -> None:
        nonlocal calls
        calls += 1

    async with SQLiteLedger(db, busy_timeout=0.05) as ledger:
        await ledger.find("a", "k")  # create the file
        blocker = sqlite3.connect(db, isolation_level=None)
        blocker.execute("BEGIN IMMEDIATE")  # a writer that ignores our queue
        try:
            with pytest.raises(ActionPersistenceError, match="locked") as info:
                await ActionRunner(ledger).execute("a", op, request={}, idempotency_key="k")
            assert info.value.operation_invoked is False
        finally:
            blocker.execute("ROLLBACK")
            blocker.close()
        assert calls == 0
        assert await ledger.find("a", "k") is None


async def test_a_full_database_surfaces_as_persistence_error_before_invoking(
    tmp_path: Path,
) -> None:
    db = tmp_path / "ledger.sqlite3"
    calls = 0

    def op() -> None:
        nonlocal calls
        calls += 1

    async with SQLiteLedger(db) as ledger:
        runner = ActionRunner(ledger)
        await runner.execute("a", op, request={}, idempotency_key="first")
        conn = await ledger._connection()
        # SQLITE_FULL, as a full disk reports it: no page may be added.
        [(pages,)] = await conn.execute_fetchall("PRAGMA page_count")
        await conn.execute(f"PRAGMA max_page_count = {pages}")
        padding = {"pad": "x" * 20_000}
        with pytest.raises(ActionPersistenceError, match="full") as info:
            await runner.execute("a", op, request={}, idempotency_key="k", metadata=padding)
        assert info.value.operation_invoked is False
        assert calls == 1
        first = await ledger.find("a", "first")
        assert first is not None
        assert first.final_status is ActionStatus.CONFIRMED


@pytest.mark.skipif(not hasattr(os, "geteuid"), reason="POSIX permissions only")
async def test_a_read_only_file_surfaces_as_persistence_error(tmp_path: Path) -> None:
    # Root ignores file modes, so the attempt runs in a child without privileges.
    folder = Path(f"/tmp/dataoad-ro-{os.getpid()}")
    folder.mkdir(mode=0o755, exist_ok=True)
    os.chmod(folder, 0o777)
    db = folder / "ledger.sqlite3"

    async with SQLiteLedger(db) as ledger:
        await ActionRunner(ledger).execute("a", lambda: 1, request={}, idempotency_key="k")
    with contextlib.closing(sqlite3.connect(db)) as conn, conn:
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    for path in folder.iterdir():
        os.chmod(path, 0o444)
    script = (
        "import asyncio, os, sys\n"
        "from dataoad import ActionRunner, SQLiteLedger, ActionPersistenceError\n"
        "import dataoad.testing, aiosqlite, sqlite3, json, uuid, hashlib, threading\n"
        "if os.geteuid() == 0:  # import first: the stdlib lives under /root\n"
        "    os.setgid(65534); os.setuid(65534)\n"
        "calls = []\n"
        "async def main():\n"
        f"    ledger = SQLiteLedger({str(db)!r})\n"
        "    try:\n"
        "        await ActionRunner(ledger).execute('a', lambda: calls.append(1), request={}, idempotency_key='k2')\n"
        "    except ActionPersistenceError as exc:\n"
        "        print('refused', exc.operation_invoked, len(calls))\n"
        "    finally:\n"
        "        await ledger.close()\n"
        "asyncio.run(main())\n"
    )
    try:
        done = subprocess.run(
            [sys.executable, "-c", script],
            capture_output=True,
            text=True,
            cwd=ROOT,
            check=False,
            timeout=60,
        )
        assert done.returncode == 0, done.stderr
        assert done.stdout.strip() == "refused False 0"
    finally:
        for path in folder.iterdir():
            os.chmod(path, 0o600)
            path.unlink()
        folder.rmdir()


# -- several processes ----------------------------------------------------------------


async def test_processes_contending_for_the_same_keys(tmp_path: Path) -> None:
    db, effects = tmp_path / "ledger.sqlite3", tmp_path / "effects.log"
    keys, processes = 1000, 4

    async with SQLiteLedger(db) as ledger:
        await ledger.find("act", "none")
    summaries = contend_in_processes(str(db), effects, keys, processes)
    lines = effects.read_text().split()
    # Exactly one effect per key: one winner each, and nothing invoked twice.
    assert sorted(lines) == sorted(f"k{n}" for n in range(keys))
    assert sum(s["won"] for s in summaries) == keys
    for summary in summaries:
        assert summary["won"] + summary["replayed"] + summary["in_progress"] == keys
        # Every process got a real share of the work: nobody was starved out.
        assert summary["won"] >= keys // processes // 4, summaries

    async with SQLiteLedger(db) as ledger:
        receipts = await ledger.receipts()
        assert len(receipts) == keys
        assert all(r.final_status is ActionStatus.CONFIRMED for r in receipts)


# -- crashes ----------------------------------------------------------------------------


# NORMAL too: the README promises it survives a process crash (not power loss).
@pytest.mark.parametrize("synchronous", ["FULL", "NORMAL"])
@pytest.mark.parametrize("point", CRASH_POINTS)
async def test_sigkill_at_each_protocol_point_leaves_a_safe_state(
    tmp_path: Path, point: str, synchronous: str
) -> None:
    db, effects = tmp_path / "ledger.sqlite3", tmp_path / "effects.log"
    child = subprocess.run(
        [
            *(sys.executable, "-m", "suite_support.ledger_child", "crash"),
            *(str(db), str(effects), point, synchronous),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert child.returncode == -9, f"child was not killed: {child.returncode} {child.stderr}"
    effects_before = effects.read_text().split() if effects.exists() else []
    calls = 0

    async def op() -> str:
        nonlocal calls
        calls += 1
        return "again"

    async with SQLiteLedger(db) as ledger:
        runner = ActionRunner(ledger)
        receipt = await ledger.find("charge", "order-1")
        assert receipt is not None, "the claim was lost"
        kwargs: dict[str, Any] = {
            "request": {"amount": 1},
            "idempotency_key": "order-1",
            "provider_reference": "order-1",
        }
        if receipt.claim_state is ClaimState.PENDING:
            # The claim still blocks a duplicate.
            with pytest.raises(ActionInProgressError):
                await runner.execute("charge", op, **kwargs)
            if receipt.attempts == 0:
                assert point == "after_claim"
                await runner.release_unstarted(receipt.action_id)
                result = await runner.execute("charge", op, **kwargs)
                assert result.status is ActionStatus.CONFIRMED
                assert calls == 1
                return
            with pytest.raises(RecoveryRefusedError):
                await runner.release_unstarted(receipt.action_id)
            result = await runner.recover_pending(receipt.action_id, EffectsVerifier(effects))
        else:
            assert point == "during_completion"
            result = await runner.execute("charge", op, **kwargs)
            assert result.replayed
        expected = ActionStatus.CONFIRMED if effects_before else ActionStatus.FAILED
        assert result.status is expected
        assert calls == 0, "the operation was invoked again after the crash"
    assert (effects.read_text().split() if effects.exists() else []) == effects_before
    expected_effects = [] if point in ("after_claim", "after_attempt_start") else ["order-1"]
    assert effects_before == expected_effects


async def test_the_receipts_listing_applies_every_filter(tmp_path: Path) -> None:
    from datetime import UTC, datetime, timedelta, timezone

    from dataoad import ActionStatus, DefinitiveFailure
    from dataoad.testing import FaultyLedger, LedgerFault

    async with SQLiteLedger(tmp_path / "l.sqlite3") as ledger:
        runner = ActionRunner(ledger)

        def decline() -> None:
            raise DefinitiveFailure("declined")

        ok = await runner.execute("charge", lambda: 1, request={}, idempotency_key="a")
        failed = await runner.execute("charge", decline, request={}, idempotency_key="b")
        faulty = FaultyLedger(ledger)
        faulty.inject("record", LedgerFault.FAIL_BEFORE_WRITE)
        with pytest.raises(ActionPersistenceError):
            await ActionRunner(faulty).execute("refund", lambda: 1, request={}, idempotency_key="c")

        def ids(receipts: list[ActionReceipt]) -> list[str]:
            return [r.idempotency_key for r in receipts]

        assert ids(await ledger.receipts()) == ["a", "b", "c"]
        assert ids(await ledger.receipts(final_status=ActionStatus.FAILED)) == ["b"]
        assert ids(await ledger.receipts(pending=True)) == ["c"]
        assert ids(await ledger.receipts(pending=False)) == ["a", "b"]
        assert ids(await ledger.receipts(action_name="refund")) == ["c"]
        assert ids(await ledger.receipts(limit=2)) == ["a", "b"]
        # "since" is compared as a time, whatever the caller's time zone.
        since = failed.receipt.created_at.astimezone(timezone(timedelta(hours=-5)))
        assert ids(await ledger.receipts(since=since)) == ["b", "c"]
        later = datetime.now(UTC) + timedelta(days=1)
        assert await ledger.receipts(since=later) == []
        assert (await ledger.receipts(final_status=ActionStatus.CONFIRMED))[0] == ok.receipt


def test_a_failing_contended_lock_wait_surfaces_its_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import fcntl

    from dataoad.ledgers import _writer_lock

    lock = _writer_lock.WriterLock(tmp_path / "lock")

    def flock(fd: int, operation: int) -> None:
        if operation & fcntl.LOCK_NB:
            raise BlockingIOError  # contended: wait on a thread
        raise OSError(37, "No locks available")

    monkeypatch.setattr(fcntl, "flock", flock)  # the module _writer_lock imported
    with pytest.raises(OSError, match="No locks available"), lock.hold(5.0):
        pytest.fail("the lock was not held, yet the block ran")


async def test_the_listing_compares_times_in_utc_whatever_the_local_zone(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import time
    from datetime import timedelta

    monkeypatch.setenv("TZ", "Asia/Tokyo")
    time.tzset()
    try:
        async with SQLiteLedger(tmp_path / "l.sqlite3") as ledger:
            done = await ActionRunner(ledger).execute(
                "charge", lambda: 1, request={}, idempotency_key="a"
            )
            created = done.receipt.created_at
            assert await ledger.receipts(since=created - timedelta(minutes=1)) == [done.receipt]
            assert await ledger.receipts(since=created + timedelta(minutes=1)) == []
    finally:
        monkeypatch.delenv("TZ")
        time.tzset()


def test_a_timed_out_lock_wait_hands_the_lock_back(tmp_path: Path) -> None:
    # Otherwise the waiting thread would take the lock after its caller gave
    # up and hold it for ever: every other writer, in every process, would hang.
    import fcntl
    import os
    import threading
    import time

    from dataoad.ledgers._writer_lock import LedgerBusyError, WriterLock

    path = tmp_path / "lock"
    holder = os.open(path, os.O_CREAT | os.O_RDWR, 0o600)
    fcntl.flock(holder, fcntl.LOCK_EX)
    before = set(threading.enumerate())
    started = time.monotonic()
    with pytest.raises(LedgerBusyError, match="busy_timeout"), WriterLock(path).hold(0.1):
        pytest.fail("the lock was held by another descriptor, yet the block ran")
    assert time.monotonic() - started < 2
    os.close(holder)  # the abandoned waiter's thread now gets the lock, and drops it
    # Wait for that thread to finish before looking: a look while it is still
    # queued in the kernel could take the lock first and pass by luck.
    for thread in set(threading.enumerate()) - before:
        if thread.name == "dataoad-sqlite-lock":
            thread.join(5)
            assert not thread.is_alive(), "the abandoned wait never got the lock"
    other = os.open(path, os.O_RDWR)
    try:
        try:
            fcntl.flock(other, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            pytest.fail("the abandoned wait kept the lock")
    finally:
        os.close(other)


async def test_writes_are_stamped_by_sqlites_clock_which_no_python_patch_moves(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``stored_at`` comes from the clock SQLite reads, not Python's time of day.

    With Python's ``time`` an hour fast (as freezegun or time-machine move
    it), a write is still stamped within the real moment it was made
    (SQLite reads whole milliseconds), on a host whose local zone is not
    UTC. Reading that clock writes nothing to the ledger file: the file
    clock it replaced stamped the file's inode on every write, which each
    commit's fsync then had to journal.
    """
    import time
    from datetime import UTC, timedelta

    db = tmp_path / "ledger.sqlite3"
    monkeypatch.setenv("TZ", "Asia/Kolkata")
    time.tzset()
    try:
        async with SQLiteLedger(db) as ledger:
            runner = ActionRunner(ledger)
            await runner.execute("a", lambda: 1, request={}, idempotency_key="first")
            stamped = db.stat().st_mtime_ns
            real_time, hour = time.time, 3600.0
            monkeypatch.setattr(time, "time", lambda: real_time() + hour)
            monkeypatch.setattr(time, "time_ns", lambda: int((real_time() + hour) * 1e9))
            # The library's own wall clock too, in every module that reads it.
            skew_wall_clock(monkeypatch, lambda: datetime.now(UTC) + timedelta(hours=1))
            for n in range(3):
                time.sleep(0.02)  # past any coarse file-time step
                before = datetime.now(UTC)
                done = await runner.execute("a", lambda: 1, request={}, idempotency_key=f"k{n}")
                after = datetime.now(UTC)
                stored = await ledger.get(done.receipt.action_id)
                assert stored is not None
                assert stored.stored_at is not None
                assert before - timedelta(milliseconds=1) <= stored.stored_at <= after
            assert db.stat().st_mtime_ns == stamped
    finally:
        monkeypatch.delenv("TZ")
        time.tzset()


def test_the_clock_leaves_no_connection_behind_a_collected_ledger(tmp_path: Path) -> None:
    """Ledgers share one clock connection per process, closed at exit: none is
    left open when a ledger is collected (Python 3.13 and later warn about
    that, which this suite treats as an error)."""
    import asyncio
    import gc
    import warnings

    async def use(path: Path) -> None:
        async with SQLiteLedger(path) as ledger:
            await ActionRunner(ledger).execute("a", lambda: 1, request={}, idempotency_key="k")
        SQLiteLedger(tmp_path / "never-opened.sqlite3")  # built, never used

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for n in range(3):
            asyncio.run(use(tmp_path / f"{n}.sqlite3"))
        gc.collect()
    assert [w for w in caught if issubclass(w.category, ResourceWarning)] == []


@pytest.mark.skipif(not hasattr(os, "fork"), reason="no fork on this platform (Windows)")
def test_a_forked_child_reads_the_clock_though_a_parent_thread_held_it() -> None:
    """The child of a fork gets a clock connection and lock of its own: the
    parent's lock, held by a parent thread at the fork, never blocks it."""
    import warnings
    from datetime import UTC, timedelta

    from dataoad.ledgers import _sqlite_file

    clock = _sqlite_file.sqlite_clock()
    clock()  # the parent's connection is open
    parents = clock._db  # type: ignore[attr-defined]
    with clock._lock:  # type: ignore[attr-defined]  # as a parent thread mid-reading
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)  # fork with threads
            pid = os.fork()
        if pid == 0:  # the child: exits 0 only if its reading is now, on its own connection
            try:
                read = _sqlite_file.sqlite_clock()()
                now = abs(read - datetime.now(UTC)) < timedelta(seconds=5)
                # The parent's connection is kept, never used nor collected (closed).
                kept = any(db is parents for db in _sqlite_file._INHERITED)
                os._exit(0 if now and kept and clock._db is not parents else 3)  # type: ignore[attr-defined]
            finally:
                os._exit(4)
    import time

    deadline = time.monotonic() + 30
    while (done := os.waitpid(pid, os.WNOHANG))[0] == 0 and time.monotonic() < deadline:
        time.sleep(0.01)
    if done[0] == 0:
        os.kill(pid, 9)
        os.waitpid(pid, 0)
        pytest.fail("the forked child waited on its parent's clock lock")
    assert os.waitstatus_to_exitcode(done[1]) == 0


def test_the_clock_reads_in_memory_and_leaves_no_file_where_the_process_runs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The clock's connection is in memory: a reading never creates a
    database file in the caller's working folder."""
    from dataoad.ledgers import _sqlite_file

    monkeypatch.chdir(tmp_path)
    clock = _sqlite_file._SQLITE_NOW
    clock.close()  # the next reading opens its connection, here
    assert clock() is not None
    assert list(tmp_path.iterdir()) == []


def test_the_clock_connection_closes_and_a_later_reading_opens_another() -> None:
    """At exit the clock's connection is closed (registered with ``atexit``); a
    reading after that, by another exit handler, opens a new one."""
    import textwrap

    from dataoad.ledgers import _sqlite_file

    clock = _sqlite_file._SQLITE_NOW
    clock()
    opened = clock._db
    assert opened is not None
    clock.close()
    with pytest.raises(sqlite3.ProgrammingError):
        opened.execute("SELECT 1")  # closed
    assert clock() is not None
    assert clock._db is not None
    assert clock._db is not opened
    # A process closes it at exit: a handler registered before the import
    # runs after the clock's own and sees the connection gone.
    child = textwrap.dedent(
        """
        import atexit, os

        def closed_by_now():
            from dataoad.ledgers import _sqlite_file
            os._exit(0 if _sqlite_file._SQLITE_NOW._db is None else 5)

        atexit.register(closed_by_now)
        from dataoad.ledgers import _sqlite_file
        _sqlite_file.sqlite_clock()()
        """
    )
    done = subprocess.run([sys.executable, "-c", child], capture_output=True, timeout=60)
    assert done.returncode == 0, done.stderr


async def test_the_claim_statement_compiled_now_claims_a_free_key_and_answers_a_held_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The SQLite ledger's statements, compiled by this test rather than at import.

    The ledger compiles its statements once, when its module is imported,
    so a mutation run (which changes code only for calls made after
    import) never saw a broken claim statement: PostgreSQL, which compiles
    its own per ledger, claims with another statement.
    """
    monkeypatch.setattr(sqlite_module, "_SQL", Statements("receipts", SQLITE))
    ledger = SQLiteLedger(tmp_path / "ledger.sqlite3")
    try:
        first = unstarted_claim("charge", "k", {"amount": 1}, provider_reference="ref-1")
        stored, created = await ledger.claim(first, lease=30.0)
        assert created
        assert stored.action_id == first.action_id
        assert stored.stored_at is not None
        assert stored.lease_expires_at is not None
        assert await ledger.get(first.action_id) == stored
        again = unstarted_claim("charge", "k", {"amount": 1}, provider_reference="ref-1")
        holder, created = await ledger.claim(again, lease=30.0)
        assert not created
        assert holder == stored
        assert await ledger.get(again.action_id) is None  # nothing written for the replay
    finally:
        await ledger.close()


async def test_a_prune_reads_each_receipt_once_whatever_form_its_stored_time_has(
    tmp_path: Path,
) -> None:
    # A file migrated to stored_at copied each row's updated_at as it was
    # written, without microseconds at a whole second; rows this version
    # stores have them. Six receipts at one moment, half in each form.
    clock = ManualClock(datetime(2030, 1, 1, tzinfo=UTC))
    path = tmp_path / "mixed.sqlite3"
    ledger = SQLiteLedger(path, clock=clock)
    runner = ActionRunner(ledger, lease=None)
    for n in range(6):
        await runner.execute("charge", lambda: "ok", request={"n": n}, idempotency_key=f"k{n}")
    await ledger.close()
    with contextlib.closing(sqlite3.connect(path)) as db, db:
        ids = [row[0] for row in db.execute("SELECT action_id FROM receipts ORDER BY action_id")]
        db.executemany(
            "UPDATE receipts SET stored_at = replace(stored_at, '.000000', '') WHERE action_id = ?",
            [(i,) for i in ids[::2]],
        )
        forms = {row[0] for row in db.execute("SELECT stored_at FROM receipts")}
    assert forms == {"2030-01-01T00:00:00+00:00", "2030-01-01T00:00:00.000000+00:00"}
    clock.advance(86_400)
    ledger = SQLiteLedger(path, clock=clock)
    try:
        for size in (1, 2, 4):
            counted = await asyncio.wait_for(
                ledger.prune(older_than=60, dry_run=True, batch_size=size), 30
            )
            assert counted == 6, f"batch_size={size} counted {counted} of 6"
        seen: list[str] = []
        deleted = await ledger.prune(
            older_than=60, batch_size=1, before_delete=lambda b: seen.extend(r.action_id for r in b)
        )
        assert (deleted, sorted(seen)) == (6, ids)
        assert await ledger.receipts() == []
    finally:
        await ledger.close()
