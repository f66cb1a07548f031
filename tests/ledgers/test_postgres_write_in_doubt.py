"""A PostgreSQL write its client gave up on is settled on the server before it is read back.

A statement that outlives its client's time limit may still be running on
the server: waiting for a lock, or for a synchronous standby to confirm its
commit. The ledger ends that backend and waits for it before the error goes
up to the proven-write read-back, so the read-back sees the write's final
fate: a statement still waiting is rolled back (never to commit later, a
claim stranded with its attempt counted), a commit that waited for a
standby becomes visible, but on this server alone: no statement of the
ledger runs until a settling commit shows the standby has it too, so such a
write is never taken for proven (a failover would lose it) nor for absent.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from dataoad import (
    ActionRunner,
    ActionStatus,
    LedgerUnusableError,
    NothingInvokedError,
    OutcomeNotRecordedError,
    PostgresLedger,
)
from dataoad.ledgers._postgres_backend import Backends, _settling_commit
from dataoad.ledgers._postgres_lane import acquire_settled
from dataoad.testing._postgres_server import PostgresServer, PostgresUnavailableError
from suite_support import REQUEST, CountingOperation
from suite_support.services import postgres_dsn, unavailable, unique_table

LIMIT = 0.5  # seconds: the ledger's command_timeout in these tests


@pytest.fixture
async def ledger() -> AsyncIterator[PostgresLedger]:
    ledger = PostgresLedger(postgres_dsn(), table=unique_table(), command_timeout=LIMIT)
    await ledger.migrate()
    yield ledger
    await ledger.close()


@pytest.fixture
async def patient_ledger() -> AsyncIterator[PostgresLedger]:
    """A ledger whose statements are bounded far beyond what a cancellation may take."""
    ledger = PostgresLedger(postgres_dsn(), table=unique_table(), command_timeout=30)
    await ledger.migrate()
    yield ledger
    await ledger.close()


@pytest.fixture
async def admin() -> AsyncIterator[Any]:
    """A session that watches the server (never inside a transaction: a transaction
    keeps its first look at ``pg_stat_activity``)."""
    import asyncpg

    conn = await asyncpg.connect(postgres_dsn())
    yield conn
    await conn.close()


@pytest.fixture
async def locker() -> AsyncIterator[Any]:
    """A session that takes the lock every INSERT and UPDATE of the table waits for."""
    import asyncpg

    conn = await asyncpg.connect(postgres_dsn())
    yield conn
    await conn.close()


async def _writes_running(admin: Any, ledger: PostgresLedger) -> list[Any]:
    """The ledger's statements on its table still running on the server."""
    rows = await admin.fetch(
        "SELECT pid, query FROM pg_stat_activity WHERE state = 'active' "
        "AND pid <> pg_backend_pid() AND query LIKE '%' || $1 || '%'",
        ledger.table,
    )
    return list(rows)


async def test_a_claim_that_timed_out_on_a_lock_is_rolled_back_not_stranded(
    ledger: PostgresLedger, admin: Any, locker: Any
) -> None:
    runner = ActionRunner(ledger)
    operation = CountingOperation()
    await runner.execute("charge", operation, request=REQUEST, idempotency_key="warm")
    lock = locker.transaction()
    await lock.start()
    # A lock every INSERT waits for and no SELECT does (a migration, VACUUM FULL...).
    await locker.execute(f'LOCK TABLE "{ledger.table}" IN SHARE MODE')
    try:
        with pytest.raises(NothingInvokedError) as raised:
            await runner.execute("charge", operation, request=REQUEST, idempotency_key="k")
        assert raised.value.receipt is None
        # Its backend was ended before the read-back: nothing of it runs on.
        assert await _writes_running(admin, ledger) == []
    finally:
        await lock.rollback()
    await asyncio.sleep(0.2)
    assert await ledger.find("charge", "k") is None  # the claim never commits later
    assert operation.calls == 1  # the warm-up only
    result = await runner.execute("charge", operation, request=REQUEST, idempotency_key="k")
    assert result.status is ActionStatus.CONFIRMED
    assert operation.calls == 2


async def test_an_outcome_that_timed_out_on_a_lock_never_lands_after_the_answer(
    ledger: PostgresLedger, admin: Any, locker: Any
) -> None:
    runner = ActionRunner(ledger)
    lock = locker.transaction()

    async def charge() -> str:
        # The effect happens; then something locks the table the outcome goes to.
        await lock.start()
        await locker.execute(f'LOCK TABLE "{ledger.table}" IN SHARE MODE')
        return "ch_1"

    try:
        with pytest.raises(OutcomeNotRecordedError) as raised:
            await runner.execute("charge", charge, request=REQUEST, idempotency_key="k")
        assert await _writes_running(admin, ledger) == []
    finally:
        await lock.rollback()
    stored = raised.value.receipt
    assert stored is not None
    assert stored.is_pending
    await asyncio.sleep(0.2)
    # What the read-back showed is what stays: the claim, PENDING, for recovery.
    assert await ledger.get(stored.action_id) == stored


async def _claim_waiting_on_a_lock(
    ledger: PostgresLedger, admin: Any, locker: Any, lock: Any
) -> asyncio.Future[Any]:
    """A call whose claim waits on ``lock`` (taken here) on the server, once it does."""
    runner = ActionRunner(ledger)
    await runner.execute("charge", CountingOperation(), request=REQUEST, idempotency_key="warm")
    await lock.start()
    await locker.execute(f'LOCK TABLE "{ledger.table}" IN SHARE MODE')
    call = asyncio.ensure_future(
        runner.execute("charge", CountingOperation(), request=REQUEST, idempotency_key="k")
    )
    # The server offers no event for "a statement waits": look until it does.
    while not await _writes_running(admin, ledger):  # noqa: ASYNC110
        await asyncio.sleep(0.01)
    return call


async def test_a_cancelled_write_does_not_wait_and_its_backend_still_ends(
    patient_ledger: PostgresLedger, admin: Any, locker: Any
) -> None:
    ledger = patient_ledger  # its statement would wait 30 s: only the cancel ends it sooner
    lock = locker.transaction()
    call = await _claim_waiting_on_a_lock(ledger, admin, locker, lock)
    try:
        started = time.monotonic()
        call.cancel()
        with pytest.raises(asyncio.CancelledError):
            await call
        assert time.monotonic() - started < 3  # the caller was not held
        assert ledger._backends is not None
        await ledger._backends.close(ledger._pool, 30)  # the end, run in the background, is done
        assert await _writes_running(admin, ledger) == []
    finally:
        await lock.rollback()
    await asyncio.sleep(0.2)
    assert await ledger.find("charge", "k") is None


@pytest.fixture
async def other_session(admin: Any) -> AsyncIterator[tuple[Any, Any, int, Any]]:
    """A pool, another session, and that session's backend: process id and start time."""
    import asyncpg

    pool = await asyncpg.create_pool(postgres_dsn(), min_size=1, max_size=2)
    other = await asyncpg.connect(postgres_dsn())
    try:
        pid = other.get_server_pid()
        started = await admin.fetchval(
            "SELECT backend_start FROM pg_stat_activity WHERE pid = $1", pid
        )
        yield pool, other, pid, started
    finally:
        other.terminate()
        await pool.close()


async def _gone(admin: Any, pid: int) -> bool:
    return not await admin.fetchval("SELECT count(*) FROM pg_stat_activity WHERE pid = $1", pid)


async def test_a_backend_is_ended_only_under_the_name_it_had(
    admin: Any, other_session: tuple[Any, Any, int, Any]
) -> None:
    """A process id noted with another start time (reused since, or another server's)
    names another session: that session is left alone."""
    pool, other, pid, started = other_session
    backends = Backends(5.0)
    for wrong in (started - timedelta(microseconds=1), started + timedelta(microseconds=1)):
        await backends.end(pool, (pid, wrong), 1.0, wait=True)
        assert await other.fetchval("SELECT 1") == 1  # untouched
    await backends.end(pool, (pid, started), 1.0, wait=True)
    assert await _gone(admin, pid)


async def test_a_commit_waiting_for_a_standby_is_neither_proven_nor_taken_for_absent() -> None:
    """Synchronous replication with the standby away: each write's commit waits for it.
    Ended, the backend's commit becomes visible on this server alone, which a failover
    would lose: the claim is not proven (nothing is invoked), every later statement
    refuses until a commit can be settled, and once the standby is no longer awaited
    the claim reads back as stored, never as absent."""
    try:
        server = PostgresServer()
        server.start()
    except PostgresUnavailableError as exc:
        unavailable(f"no PostgreSQL server of the test's own: {exc}")
    try:
        import asyncpg

        admin = await asyncpg.connect(server.dsn)
        ledger = PostgresLedger(server.dsn, table=unique_table(), command_timeout=LIMIT)
        try:
            await ledger.migrate()
            await _standby_awaited(admin, "away")
            operation = CountingOperation()
            with pytest.raises(NothingInvokedError) as raised:
                await ActionRunner(ledger).execute(
                    "charge", operation, request=REQUEST, idempotency_key="k"
                )
            assert operation.calls == 0
            assert raised.value.operation_invoked is False
            # Visible on the primary alone: a read would answer from it, so none runs.
            local = await admin.fetchval(f'SELECT count(*) FROM "{ledger.schema}"."{ledger.table}"')
            assert local == 1
            with pytest.raises(TimeoutError):
                await ledger.find("charge", "k")
            # The settling commit that timed out is not left waiting for the standby
            # (one server connection per statement tried, until it is back).
            assert ledger._backends is not None
            await ledger._backends.close(ledger._pool, LIMIT)
            waiting = "SELECT count(*) FROM pg_stat_activity WHERE wait_event = 'SyncRep'"
            assert await admin.fetchval(waiting) == 0
            await _standby_awaited(admin, "")
            stored = await ledger.find("charge", "k")
            assert stored is not None, "the claim was there all along: never absent"
            assert stored.is_pending
            assert stored.attempts == 1
        finally:
            await admin.execute("ALTER SYSTEM RESET synchronous_standby_names")
            await admin.execute("SELECT pg_reload_conf()")
            await ledger.close()
            await admin.close()
    finally:
        server.stop()


async def _standby_awaited(admin: Any, names: str) -> None:
    """Set ``synchronous_standby_names`` and wait until the server's backends have it.

    ``pg_reload_conf()`` only signals the postmaster, which then signals every
    backend; on a loaded machine the ledger's connection committed a claim
    before its backend had the new setting (CI, 2026-12-07). The admin
    backend seeing it means the postmaster has signalled them all, and a
    backend applies a pending reload before it runs its next command.
    """
    if names:
        await admin.execute(f"ALTER SYSTEM SET synchronous_standby_names = '{names}'")
    else:
        await admin.execute("ALTER SYSTEM RESET synchronous_standby_names")
    await admin.execute("SELECT pg_reload_conf()")
    for _ in range(1000):
        if await admin.fetchval("SHOW synchronous_standby_names") == names:
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"synchronous_standby_names never became {names!r}")


@pytest.fixture
async def plain_role(admin: Any) -> AsyncIterator[tuple[str, str]]:
    """A role with its own tables and no more, and its URL; neither
    ``pg_logical_emit_message`` nor temporary tables are granted to everyone meanwhile
    (a common hardening)."""
    role = f"plain_{unique_table()}"
    database = await admin.fetchval("SELECT current_database()")
    await admin.execute(f'CREATE ROLE "{role}" LOGIN')
    await admin.execute(f'GRANT CREATE, USAGE ON SCHEMA public TO "{role}"')
    await admin.execute(f'GRANT CREATE ON DATABASE "{database}" TO "{role}"')
    await admin.execute(f"REVOKE EXECUTE ON FUNCTION {_MESSAGE} FROM PUBLIC")
    await admin.execute(f'REVOKE TEMPORARY ON DATABASE "{database}" FROM PUBLIC')
    try:
        yield role, postgres_dsn().replace("postgresql://postgres", f"postgresql://{role}", 1)
    finally:
        await admin.execute(f"GRANT EXECUTE ON FUNCTION {_MESSAGE} TO PUBLIC")
        await admin.execute(f'GRANT TEMPORARY ON DATABASE "{database}" TO PUBLIC')
        await admin.execute(f'DROP OWNED BY "{role}"')
        await admin.execute(f'DROP ROLE "{role}"')


_MESSAGE = "pg_logical_emit_message(boolean, text, text)"


async def test_without_synchronous_replication_a_write_ended_in_doubt_is_settled_at_once(
    locker: Any, plain_role: tuple[str, str]
) -> None:
    """No standby is waited for, so the primary's commit is the whole truth: a role that
    may make no settling commit still goes on after a write ended in doubt."""
    ledger = PostgresLedger(plain_role[1], table=unique_table(), command_timeout=LIMIT)
    try:
        await ledger.migrate()
        runner = ActionRunner(ledger)
        await runner.execute("charge", CountingOperation(), request=REQUEST, idempotency_key="w")
        lock = locker.transaction()
        await lock.start()
        await locker.execute(f'LOCK TABLE "{ledger.table}" IN SHARE MODE')
        try:
            with pytest.raises(NothingInvokedError):
                await runner.execute(
                    "charge", CountingOperation(), request=REQUEST, idempotency_key="k"
                )
        finally:
            await lock.rollback()
        assert ledger._backends is not None
        assert ledger._backends._settled == ledger._backends._doubts == 1
        assert await ledger.find("charge", "k") is None
        again = await runner.execute(
            "charge", CountingOperation(), request=REQUEST, idempotency_key="k"
        )
        assert again.status is ActionStatus.CONFIRMED
    finally:
        await ledger.close()


async def test_a_settling_commit_falls_back_to_a_temporary_table_then_says_what_to_grant(
    admin: Any, plain_role: tuple[str, str]
) -> None:
    import asyncpg

    role, url = plain_role
    conn = await asyncpg.connect(url)
    try:
        with pytest.raises(LedgerUnusableError, match="GRANT TEMPORARY ON DATABASE"):
            await _settling_commit(conn, 1.0)
        database = await admin.fetchval("SELECT current_database()")
        await admin.execute(f'GRANT TEMPORARY ON DATABASE "{database}" TO "{role}"')
        await _settling_commit(conn, 1.0)  # a temporary table, made and dropped
        assert (
            await conn.fetchval("SELECT count(*) FROM pg_tables WHERE tablename = 'dataoad_settle'")
            == 0
        )
        await admin.execute(f'REVOKE TEMPORARY ON DATABASE "{database}" FROM "{role}"')
        await admin.execute(f'GRANT EXECUTE ON FUNCTION {_MESSAGE} TO "{role}"')
        await _settling_commit(conn, 1.0)  # the message
        await admin.execute(f'REVOKE EXECUTE ON FUNCTION {_MESSAGE} FROM "{role}"')
    finally:
        await conn.close()


async def test_a_backend_whose_end_was_not_seen_is_ended_again_before_anything_runs(
    admin: Any, other_session: tuple[Any, Any, int, Any]
) -> None:
    """An end that could not be confirmed (a partition hid it) keeps every statement
    waiting until the backend is seen gone; then a settling commit, then the statement."""
    pool, _, pid, started = other_session
    backends = Backends(5.0)
    # Its end "not seen": as after a partition, it is still to be ended.
    backends._doubts += 1
    backends._lost((pid, started))
    assert backends.unsettled
    await backends.settle(pool, 1.0)
    assert not backends.unsettled
    assert await _gone(admin, pid)


async def test_a_settle_waits_for_an_end_under_way_even_one_waited_for_inline(
    admin: Any, other_session: tuple[Any, Any, int, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A statement settling while a write's end is still under way (its caller waiting
    for it) must not count that doubt settled before the backend is gone: a commit it
    then made would be on the primary alone."""
    pool, _, pid, started = other_session
    slow = Backends._end_and_watch

    async def slowly(*args: Any) -> bool:
        await asyncio.sleep(0.2)  # a slow checkout, say, before the end is sent
        return await slow(*args)

    monkeypatch.setattr(Backends, "_end_and_watch", staticmethod(slowly))
    backends = Backends(5.0)
    ending = asyncio.ensure_future(backends.end(pool, (pid, started), 2.0, wait=True))
    await asyncio.sleep(0)  # the end has begun: counted, not done
    assert backends.unsettled
    await backends.settle(pool, 2.0)
    assert await _gone(admin, pid), "settled while the backend in doubt still ran"
    assert not backends.unsettled
    await ending


async def test_a_settle_that_cannot_see_an_end_over_in_time_settles_nothing(
    other_session: tuple[Any, Any, int, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    pool, _, pid, started = other_session
    slow = Backends._end_and_watch

    async def slowly(*args: Any) -> bool:
        await asyncio.sleep(0.5)
        return await slow(*args)

    monkeypatch.setattr(Backends, "_end_and_watch", staticmethod(slowly))
    backends = Backends(5.0)
    await backends.end(pool, (pid, started), 2.0, wait=False)
    with pytest.raises(TimeoutError, match="still being ended"):
        await backends.settle(pool, 0.1)
    assert backends.unsettled
    await backends.settle(pool, 2.0)
    assert not backends.unsettled


class _Doubted:
    """A ledger's backends with a doubt that arose while a connection was awaited."""

    def __init__(self, steps: list[str]) -> None:
        self.unsettled = False
        self._steps = steps

    async def settle(self, pool: Any, limit: float | None) -> None:
        self._steps.append("settle")
        self.unsettled = False


class _SlowPool:
    """A pool whose first checkout takes long enough for another write's end to begin."""

    def __init__(self, doubted: _Doubted, steps: list[str]) -> None:
        self._doubted, self._steps = doubted, steps

    async def acquire(self, timeout: float | None = None) -> object:  # noqa: ASYNC109 - as asyncpg's
        self._steps.append("acquire")
        if self._steps.count("acquire") == 1:
            self._doubted.unsettled = True  # meanwhile a write was ended in doubt
        return object()

    async def release(self, conn: object) -> None:
        self._steps.append("release")


async def test_a_statement_that_waited_for_its_connection_settles_before_it_runs() -> None:
    steps: list[str] = []
    doubted = _Doubted(steps)
    await acquire_settled(_SlowPool(doubted, steps), 1.0, doubted)  # type: ignore[arg-type]
    # Checked before the wait, it would run past the doubt: given back, settled, again.
    assert steps == ["acquire", "release", "settle", "acquire"]


async def test_backends_named_alike_are_each_seen_gone(monkeypatch: pytest.MonkeyPatch) -> None:
    """One process id, two backends (pid reuse, or a promoted standby's): seeing one gone
    settles nothing of the other."""
    at = datetime(2026, 1, 1, tzinfo=UTC)
    first, second = (7, at), (7, at + timedelta(hours=1))

    async def watch(pool: Any, backend: tuple[int, datetime], limit: float | None) -> bool:
        return backend == first  # the second cannot be seen to end

    monkeypatch.setattr(Backends, "_end_and_watch", staticmethod(watch))
    backends = Backends(5.0)
    backends._doubts = 2
    backends._lost(first)
    backends._lost(second)
    with pytest.raises(TimeoutError, match="could not be seen to end"):
        await backends.settle(None, 1.0)
    assert second in backends._unconfirmed
    assert backends.unsettled


class _Replication:
    """A connection answering what the server's replication settings are; notes statements."""

    def __init__(self, names: str, commit: str) -> None:
        self.settings = (names, commit)
        self.sent: list[str] = []

    async def fetchrow(self, sql: str, timeout: float | None = None) -> tuple[str, str]:  # noqa: ASYNC109
        self.sent.append(sql)
        return self.settings

    async def fetchval(self, sql: str, timeout: float | None = None) -> None:  # noqa: ASYNC109
        self.sent.append(sql)


class _OnePool:
    def __init__(self, conn: Any) -> None:
        self.conn = conn

    async def acquire(self, timeout: float | None = None) -> Any:  # noqa: ASYNC109
        return self.conn

    async def release(self, conn: Any) -> None:
        pass


@pytest.mark.parametrize(
    ("names", "commit", "waits"),
    [
        ("", "on", False),  # no standby is waited for: the primary's commit is all there is
        ("  ", "on", False),
        ("standby1", "on", True),
        ("ANY 1 (a, b)", "remote_apply", True),
        ("FIRST 1 (a)", "remote_write", True),
        ("standby1", "local", False),  # commits do not wait for it
        ("standby1", "off", False),
    ],
)
async def test_a_settling_commit_is_made_only_where_commits_wait_for_standbys(
    names: str, commit: str, waits: bool
) -> None:
    conn = _Replication(names, commit)
    backends = Backends(5.0)
    backends._doubts = 1
    await backends.settle(_OnePool(conn), 1.0)
    assert not backends.unsettled
    assert any("pg_logical_emit_message" in sql for sql in conn.sent) is waits


async def test_a_settle_with_nothing_to_settle_touches_nothing() -> None:
    backends = Backends(5.0)
    await backends.settle(None, 1.0)  # no doubt: no connection is even asked for
    assert not backends.unsettled


async def test_each_doubt_is_counted_and_a_second_one_is_settled_again(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    async def gone(pool: Any, backend: tuple[int, datetime], limit: float | None) -> bool:
        return True

    monkeypatch.setattr(Backends, "_end_and_watch", staticmethod(gone))
    at = datetime(2026, 1, 1, tzinfo=UTC)
    backends = Backends(5.0)
    conn = _Replication("standby1", "on")
    await backends.end(None, (1, at), 1.0, wait=True)
    await backends.settle(_OnePool(conn), 1.0)
    assert not backends.unsettled
    await backends.end(None, (2, at), 1.0, wait=True)
    assert backends.unsettled, "a second doubt after a settled one"
    await backends.settle(_OnePool(conn), 1.0)
    assert not backends.unsettled
    assert sum("pg_logical_emit_message" in sql for sql in conn.sent) == 2


async def test_an_end_not_seen_is_ended_again_by_the_next_settle(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    seen: list[tuple[int, datetime]] = []
    answers = iter([False, True])  # not seen at first (a partition), then gone

    async def watch(pool: Any, backend: tuple[int, datetime], limit: float | None) -> bool:
        seen.append(backend)
        return next(answers)

    monkeypatch.setattr(Backends, "_end_and_watch", staticmethod(watch))
    backend = (3, datetime(2026, 1, 1, tzinfo=UTC))
    backends = Backends(5.0)
    await backends.end(None, backend, 1.0, wait=True)
    assert "could not be seen to end" in caplog.text
    assert backends._unconfirmed == {backend}
    await backends.settle(_OnePool(_Replication("", "on")), 1.0)
    assert seen == [backend, backend]  # ended again before anything was settled
    assert backends._unconfirmed == set()
    assert not backends.unsettled


async def _never_commits(admin: Any, ledger: PostgresLedger) -> None:
    """The claim of key ``k`` is not there, nor is it once its lock has long gone."""
    await asyncio.sleep(0.3)
    table = f'"{ledger.schema}"."{ledger.table}"'
    assert await admin.fetchval(f"SELECT count(*) FROM {table} WHERE idempotency_key = 'k'") == 0


async def test_a_close_right_after_a_cancelled_write_still_ends_its_backend(
    ledger: PostgresLedger, admin: Any, locker: Any
) -> None:
    """``task.cancel(); await ledger.close()``: the cancelled write's handler has not run
    yet when the close begins; its backend's end must still happen before the pool goes,
    or the claim commits, unended, once the lock is gone."""
    lock = locker.transaction()
    call = await _claim_waiting_on_a_lock(ledger, admin, locker, lock)
    try:
        call.cancel()
        await ledger.close()  # at once: the cancelled call has not run its handler yet
        await asyncio.gather(call, return_exceptions=True)
        assert await _writes_running(admin, ledger) == []
    finally:
        await lock.rollback()
    await _never_commits(admin, ledger)


async def test_a_close_ends_again_a_backend_whose_end_was_not_seen_in_time(
    ledger: PostgresLedger, admin: Any, locker: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A cancelled write's end that ran out of time (a slow new connection on a loaded
    server) is tried once more by the close, before the pool goes."""
    real = Backends._end_and_watch
    tries: list[tuple[int, datetime]] = []

    async def slow_first(pool: Any, backend: tuple[int, datetime], limit: float | None) -> bool:
        tries.append(backend)
        if len(tries) == 1:
            await asyncio.sleep(2 * LIMIT)  # past the end's limit: not seen to end
        return await real(pool, backend, limit)

    monkeypatch.setattr(Backends, "_end_and_watch", staticmethod(slow_first))
    lock = locker.transaction()
    call = await _claim_waiting_on_a_lock(ledger, admin, locker, lock)
    try:
        call.cancel()
        await asyncio.gather(call, return_exceptions=True)
        await ledger.close()
        assert tries == [tries[0], tries[0]]  # once in the background, once by the close
        assert await _writes_running(admin, ledger) == []
    finally:
        await lock.rollback()
    await _never_commits(admin, ledger)


async def test_a_close_ends_again_every_unconfirmed_backend_at_once(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """In a partition each end waits out its limit: the close tries them together, so it
    is bounded by one limit, not one per backend, and warns of each still unseen."""
    under_way: list[int] = []
    most = 0

    async def partitioned(pool: Any, backend: tuple[int, datetime], limit: float | None) -> bool:
        nonlocal most
        under_way.append(backend[0])
        most = max(most, len(under_way))
        try:
            await asyncio.sleep(3600)  # never answered: only the limit ends it
        finally:
            under_way.remove(backend[0])
        return True

    monkeypatch.setattr(Backends, "_end_and_watch", staticmethod(partitioned))
    at = datetime(2026, 1, 1, tzinfo=UTC)
    backends = Backends(5.0)
    backends._unconfirmed = {(pid, at) for pid in (7, 8, 9)}
    await backends.close(None, 0.05)
    assert most == 3
    assert backends._unconfirmed == {(pid, at) for pid in (7, 8, 9)}  # kept: not seen to end
    assert caplog.text.count("could not be seen to end before the ledger closed") == 3
