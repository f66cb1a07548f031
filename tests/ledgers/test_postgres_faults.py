"""PostgresLedger against a real server that misbehaves.

* Lost acknowledgements: a TCP proxy between the ledger and the server
  forwards a write, lets the server commit it, and then cuts the connection
  instead of passing the answer on. The runner must read back and carry on.
* Unproven writes: a statement terminated with ``pg_terminate_backend``, a
  statement timeout, a serialization failure and a server restart while the
  attempt start waits on a row lock all leave the attempt unstarted; the
  runner must raise ActionPersistenceError without invoking the operation.
  (A new claim counts attempt 1 itself, so the attempt start that is a
  call's first write of its own is the one after taking over an expired
  claim a v0.1 runner left unstarted: that is the start these tests break.)

Every test runs twice (the ``route`` fixture): straight to the server, and
through Debian's PgBouncer in transaction pooling mode, where each
transaction may get another server connection and a server connection's
death reaches the client as PgBouncer's error. Settings the tests need on
the server side (a statement timeout, SERIALIZABLE) are set on a database
of their own, as a pooler requires (it drops session settings).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import pytest

from dataoad import (
    ActionInProgressError,
    ActionPersistenceError,
    ActionRunner,
    ActionStatus,
    ClaimState,
    PostgresLedger,
)
from dataoad._records import OperatorRecord
from dataoad.testing import ManualClock
from dataoad.testing._postgres_server import PostgresServer, PostgresUnavailableError
from suite_support import REQUEST, CountingOperation, unstarted
from suite_support.services import (
    PostgresRoute,
    pgbouncer_in_front_of,
    postgres_dsn,
    unavailable,
    unique_table,
)


async def fresh_ledger(route: PostgresRoute, dsn: str | None = None, **options: Any) -> Any:
    table = options.pop("table", None) or unique_table()
    ledger = route.ledger(dsn, table=table, **options)
    await ledger.migrate()
    return ledger


@contextlib.asynccontextmanager
async def database_with(route: PostgresRoute, **settings: str) -> AsyncIterator[PostgresRoute]:
    """``route`` to a fresh database whose every session runs with ``settings``.

    ``ALTER DATABASE ... SET`` reaches sessions a pooler opens, unlike a
    client's startup settings, which PgBouncer drops.
    """
    import asyncpg

    name = unique_table()
    admin = await asyncpg.connect(route.server_dsn)
    try:
        await admin.execute(f'CREATE DATABASE "{name}"')
        for key, value in settings.items():
            await admin.execute(f'ALTER DATABASE "{name}" SET {key} = {value}')

        def to(dsn: str) -> str:
            return dsn.rsplit("/", 1)[0] + "/" + name

        yield PostgresRoute(route.name, to(route.dsn), to(route.server_dsn), route.options)
    finally:
        await admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        await admin.close()


async def leave_legacy_claim(ledger: PostgresLedger, clock: ManualClock) -> None:
    """Key "k" held by an expired claim whose attempt 1 never started (a v0.1 runner's).

    The next ``execute`` of it takes it over, and its attempt start is then
    the call's first write of its own (a new claim counts attempt 1 itself).
    """
    await unstarted(ledger, provider_reference=None, owner="v0.1-worker", lease=1.0)
    clock.advance(1.0)


# -- a proxy that loses acknowledgements ------------------------------------------------


class LossyProxy:
    """TCP proxy to PostgreSQL that can drop the answer to the next write.

    When armed with a command tag (b"INSERT 0 1", b"UPDATE 1"), the first
    server message carrying it is swallowed and both sockets are closed: the
    server has committed, the client never hears so.
    """

    def __init__(self, host: str, port: int) -> None:
        self.host, self.port = host, port
        self.armed: bytes | None = None
        self.dropped = 0
        #: Run once the armed answer is dropped; until it returns, nothing a
        #: client sends reaches the server (so a re-run comes after it).
        self.after_drop: Callable[[], Awaitable[None]] | None = None
        self._open = asyncio.Event()
        self._open.set()
        self._server: asyncio.Server | None = None
        self.listen_port = 0

    async def _run_after_drop(self, hook: Callable[[], Awaitable[None]]) -> None:
        try:
            await hook()
        finally:
            self._open.set()

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.listen_port = self._server.sockets[0].getsockname()[1]

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()

    async def _serve(self, client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        server_r, server_w = await asyncio.open_connection(self.host, self.port)
        hooks: list[asyncio.Future[None]] = []

        async def pump(
            reader: asyncio.StreamReader, writer: asyncio.StreamWriter, answers: bool
        ) -> None:
            try:
                while data := await reader.read(65536):
                    if answers and self.armed is not None and self.armed in data:
                        self.armed = None
                        self.dropped += 1
                        if self.after_drop is not None:
                            self._open.clear()
                            hook, self.after_drop = self.after_drop, None
                            hooks.append(asyncio.ensure_future(self._run_after_drop(hook)))
                        break
                    if not answers:
                        await self._open.wait()
                    writer.write(data)
                    await writer.drain()
            except (ConnectionError, OSError):
                pass
            finally:
                for w in (client_w, server_w):
                    w.close()

        await asyncio.gather(pump(client_r, server_w, False), pump(server_r, client_w, True))
        await asyncio.gather(*hooks)


@contextlib.asynccontextmanager
async def proxied(dsn: str) -> AsyncIterator[tuple[LossyProxy, str]]:
    host_port = dsn.split("@", 1)[1].split("/", 1)[0]
    host, port = host_port.rsplit(":", 1)
    proxy = LossyProxy(host, int(port))
    await proxy.start()
    try:
        yield proxy, dsn.replace(host_port, f"127.0.0.1:{proxy.listen_port}")
    finally:
        await proxy.stop()


@pytest.mark.parametrize(
    ("step", "tag"),
    [
        # The claim is one data-modifying WITH statement: its command tag is a SELECT's.
        ("claim", b"SELECT 1\x00"),
        ("start_attempt", b"UPDATE 1"),
        ("record", b"UPDATE 1"),
    ],
)
async def test_lost_acknowledgement_is_read_back_and_the_operation_runs_once(
    route: PostgresRoute, step: str, tag: bytes
) -> None:
    async with proxied(route.dsn) as (proxy, proxy_dsn):
        clock = ManualClock()
        ledger = await fresh_ledger(route, proxy_dsn, clock=clock)
        # Check the schema now: its query's answer carries a SELECT tag too.
        assert await ledger.find("charge", "k") is None
        if step == "start_attempt":
            await leave_legacy_claim(ledger, clock)  # the start is the takeover's
        real = getattr(ledger, step)

        async def arm_then_call(*args: Any, **kwargs: Any) -> Any:
            proxy.armed = tag
            return await real(*args, **kwargs)

        setattr(ledger, step, arm_then_call)
        runner = ActionRunner(ledger)
        op = CountingOperation("charged")
        result = await runner.execute("charge", op, request=REQUEST, idempotency_key="k")
        assert proxy.dropped == 1, "the proxy never saw the write's answer"
        assert op.calls == 1
        assert result.status is ActionStatus.CONFIRMED
        assert result.taken_over is (step == "start_attempt")
        setattr(ledger, step, real)
        stored = await ledger.find("charge", "k")
        assert stored == result.receipt
        again = await runner.execute("charge", op, request=REQUEST, idempotency_key="k")
        assert again.replayed
        assert op.calls == 1
        await ledger.close()


async def test_a_lost_claim_acknowledgement_whose_claim_was_taken_over_invokes_nothing(
    route: PostgresRoute,
) -> None:
    """The claim's answer is lost after its commit; before the ledger runs it once more on a
    fresh connection, the lease runs out and another worker takes the claim over. The re-run
    finds the call's own action id holding the key, but no longer as written: the call must
    not take it for its own (it would run the operation under the new holder's fence)."""
    async with proxied(route.dsn) as (proxy, proxy_dsn):
        clock = ManualClock()
        ledger = await fresh_ledger(route, proxy_dsn, clock=clock)
        other = route.ledger(table=ledger.table, clock=clock)
        assert await ledger.find("charge", "k") is None  # the schema check's answer is a SELECT's
        taken: list[bool] = []

        async def lease_runs_out_and_b_takes_over() -> None:
            stored = await other.find("charge", "k")
            assert stored is not None
            assert stored.owner == "worker-a"
            clock.advance(31.0)
            taken.append(
                await other.take_over(
                    stored.evolve(
                        owner="worker-b",
                        fencing_token=stored.fencing_token + 1,
                        version=stored.version + 1,
                        updated_at=stored.updated_at,
                    ),
                    lease=30.0,
                )
            )

        proxy.armed = b"SELECT 1\x00"  # the claim is a data-modifying WITH: a SELECT's tag
        proxy.after_drop = lease_runs_out_and_b_takes_over
        op = CountingOperation("charged")
        runner = ActionRunner(ledger, owner="worker-a", lease=30.0)
        with pytest.raises(ActionPersistenceError) as raised:
            await runner.execute("charge", op, request=REQUEST, idempotency_key="k")
        assert proxy.dropped == 1, "the proxy never saw the claim's answer"
        assert taken == [True]
        assert op.calls == 0
        assert raised.value.operation_invoked is False
        stored = await other.find("charge", "k")
        assert stored is not None
        assert (stored.owner, stored.fencing_token, stored.claim_state) == (
            "worker-b",
            2,
            ClaimState.PENDING,
        )
        await other.close()
        await ledger.close()


async def test_an_audit_append_whose_answer_was_lost_is_not_appended_again(
    route: PostgresRoute,
) -> None:
    """An append has no condition a second run would fail: it is reported, never re-run."""
    import asyncpg

    async with proxied(route.dsn) as (proxy, proxy_dsn):
        ledger = await fresh_ledger(route, proxy_dsn)
        result = await ActionRunner(ledger).execute(
            "charge", CountingOperation(), request=REQUEST, idempotency_key="k"
        )
        assert await ledger.audit() == []
        record = OperatorRecord(
            operator="op",
            host="h",
            verb="reconcile",
            action_id=result.receipt.action_id,
            namespace="",
            reason="test",
            outcome="confirmed",
        )
        proxy.armed = b"SELECT 1\x00"  # the append's answer: the server committed it
        with pytest.raises((OSError, asyncpg.PostgresConnectionError, asyncpg.InterfaceError)):
            await ledger.append_audit(record)
        assert proxy.dropped == 1, "the proxy never saw the append's answer"
        assert [r.verb for r in await ledger.audit()] == ["reconcile"]
        stored = await ledger.get(result.receipt.action_id)
        assert stored is not None
        assert [r.verb for r in stored.operator_records] == ["reconcile"]
        await ledger.close()


# -- unproven attempt starts ---------------------------------------------------------------


class PausingLedger(PostgresLedger):
    """Runs ``before_start`` just before the attempt-start statement."""

    before_start: Callable[[], Awaitable[None]] | None = None

    async def start_attempt(self, receipt: Any, **lease: Any) -> bool:
        if self.before_start is not None:
            await self.before_start()
        return await super().start_attempt(receipt, **lease)


def waiting_on_lock(table: str) -> str:
    """SQL: the other sessions whose statement on ``table`` waits for a lock.

    Found by the table's unique name, not by application_name, which a
    ledger behind a pooler does not set.
    """
    return (
        "SELECT pid FROM pg_stat_activity WHERE pid <> pg_backend_pid() "
        f"AND wait_event_type = 'Lock' AND query LIKE '%{table}%'"
    )


async def waiting(blocker: Any, table: str) -> bool:
    """Whether the attempt start waits on the lock now.

    The blocker polls inside its open transaction, and PostgreSQL shows a
    transaction one snapshot of pg_stat_activity: clear it each time, or a
    start that began waiting after the first poll is never seen.
    """
    await blocker.execute("SELECT pg_stat_clear_snapshot()")
    return bool(await blocker.fetch(waiting_on_lock(table)))


async def attempt_start_under_row_lock(
    route: PostgresRoute,
    interfere: Callable[[Any, str], Awaitable[None]],
    *,
    commit_lock: bool = False,
    **options: Any,
) -> tuple[PausingLedger, CountingOperation, BaseException | Any]:
    """Take over a legacy unstarted claim and start its attempt while another
    session holds the claim's row lock; ``interfere`` acts meanwhile."""
    import asyncpg

    table = unique_table()
    clock = ManualClock()
    setup = await fresh_ledger(route, table=table, clock=clock)
    await leave_legacy_claim(setup, clock)
    await setup.close()
    # The blocker connects before the ledger's pool opens (at the runner's first
    # call), as it did before the fused claim: a fast shutdown signals the newest
    # backend first, so the waiting start ends before the blocker's lock does.
    # The other way round the start can get the lock and commit before its own
    # termination (the runner then proves it by read-back and rightly invokes).
    ledger = PausingLedger(route.dsn, table=table, clock=clock, **{**route.options, **options})
    blocker = await asyncpg.connect(route.server_dsn)
    lock = blocker.transaction()

    locked = asyncio.Event()

    async def take_row_lock() -> None:
        await lock.start()
        await blocker.execute(f'UPDATE "public"."{table}" SET updated_at = updated_at')
        ledger.before_start = None
        locked.set()

    ledger.before_start = take_row_lock
    runner = ActionRunner(ledger)
    op = CountingOperation("charged")
    task = asyncio.create_task(runner.execute("charge", op, request=REQUEST, idempotency_key="k"))
    # The blocker connection runs one statement at a time: poll it only once
    # the runner's task has finished taking the lock with it.
    await asyncio.wait_for(locked.wait(), timeout=30)
    # Wait until the attempt start is blocked on the row lock, then interfere.
    deadline = asyncio.get_running_loop().time() + 30  # a loaded CI machine is slow
    while not await waiting(blocker, table):
        if task.done() or asyncio.get_running_loop().time() > deadline:
            ended = task.exception() if task.done() else "still running"
            await ledger.close()
            await blocker.close()
            raise AssertionError(f"the attempt start never waited on the row lock: {ended!r}")
        await asyncio.sleep(0.01)
    await interfere(blocker, table)
    with contextlib.suppress(Exception):
        await (lock.commit() if commit_lock else lock.rollback())
    outcome: BaseException | Any
    try:
        outcome = await asyncio.wait_for(task, 30)
    except Exception as exc:
        outcome = exc
    with contextlib.suppress(Exception):
        await blocker.close()
    return ledger, op, outcome


def assert_not_invoked(ledger: PausingLedger, op: CountingOperation, outcome: object) -> None:
    assert isinstance(outcome, ActionPersistenceError), outcome
    assert outcome.operation_invoked is False
    assert op.calls == 0


async def check_barrier(ledger: PostgresLedger) -> None:
    """The durable claim stays a barrier with zero attempts; a duplicate does not run."""
    receipt = await ledger.find("charge", "k")
    assert receipt is not None
    assert receipt.claim_state is ClaimState.PENDING
    assert receipt.attempts == 0
    assert receipt.fencing_token == 2  # taken over (the takeover was proven); no attempt started
    runner = ActionRunner(ledger)
    op = CountingOperation("charged")
    with pytest.raises(ActionInProgressError):
        await runner.execute("charge", op, request=REQUEST, idempotency_key="k")
    assert op.calls == 0


async def test_terminated_backend_during_attempt_start_reruns_it_on_a_fresh_connection(
    route: PostgresRoute,
) -> None:
    """The server ended the connection mid-statement: nothing of it committed.

    The conditional start runs once more on a fresh connection (once the
    row lock is gone) and is proven before the operation runs, once.
    """

    async def terminate(blocker: Any, table: str) -> None:
        killed = await blocker.fetchval(
            f"SELECT count(pg_terminate_backend(pid)) FROM ({waiting_on_lock(table)}) AS w"
        )
        assert killed == 1

    ledger, op, outcome = await attempt_start_under_row_lock(route, terminate)
    assert not isinstance(outcome, BaseException), outcome
    assert outcome.status is ActionStatus.CONFIRMED
    assert op.calls == 1
    receipt = await ledger.find("charge", "k")
    assert receipt is not None
    assert receipt.final_status is ActionStatus.CONFIRMED
    assert receipt.attempts == 1
    assert receipt.fencing_token == 2  # taken over, then started once
    await ledger.close()


async def test_statement_timeout_during_attempt_start_does_not_invoke(route: PostgresRoute) -> None:
    """Straight to the server the ledger's own ``statement_timeout`` applies; behind
    a pooler, which refuses that session setting, the database's."""

    async def wait_for_timeout(blocker: Any, table: str) -> None:
        # Until the server has cancelled the waiting start (its 0.2 s statement
        # timeout; a loaded server may take longer), before the lock goes.
        for _ in range(600):
            if not await waiting(blocker, table):
                return
            await asyncio.sleep(0.05)
        raise AssertionError("the attempt start still waited on the lock after 30 s")

    if route.pooled:
        async with database_with(route, statement_timeout="'200ms'") as timed:
            ledger, op, outcome = await attempt_start_under_row_lock(timed, wait_for_timeout)
            await check_timed_out(ledger, op, outcome)
    else:
        ledger, op, outcome = await attempt_start_under_row_lock(
            route, wait_for_timeout, statement_timeout=0.2
        )
        await check_timed_out(ledger, op, outcome)


async def check_timed_out(ledger: PausingLedger, op: CountingOperation, outcome: object) -> None:
    try:
        assert_not_invoked(ledger, op, outcome)
        assert "QueryCanceled" in str(outcome) or "statement timeout" in str(outcome)
        await check_barrier(ledger)
    finally:
        await ledger.close()


async def nothing(blocker: Any, table: str) -> None:
    return None


def serializable(route: PostgresRoute) -> Any:
    return database_with(route, default_transaction_isolation="serializable")


async def test_serialization_failure_without_retries_does_not_invoke(route: PostgresRoute) -> None:
    # The blocker's UPDATE commits while the attempt start waits: under
    # SERIALIZABLE the waiting statement fails with a serialization error.
    async with serializable(route) as strict:
        ledger, op, outcome = await attempt_start_under_row_lock(
            strict, nothing, commit_lock=True, serialization_retries=0
        )
        assert_not_invoked(ledger, op, outcome)
        assert "SerializationError" in str(outcome)
        await check_barrier(ledger)
        await ledger.close()


async def test_serialization_failure_is_rerun_by_the_ledger(route: PostgresRoute) -> None:
    async with serializable(route) as strict:
        ledger, op, outcome = await attempt_start_under_row_lock(strict, nothing, commit_lock=True)
        # The server rolled the statement back, so re-running it was safe;
        # the version did not change, so it applied the second time.
        assert not isinstance(outcome, BaseException), outcome
        assert outcome.status is ActionStatus.CONFIRMED
        assert op.calls == 1
        await ledger.close()


# -- a server of its own: restarts and crashes ---------------------------------------------


@pytest.fixture(params=["direct", "pgbouncer"])
def own_server(request: pytest.FixtureRequest) -> Any:
    """A private server (to restart and crash) and the route to it: straight or through
    a PgBouncer of its own."""
    postgres_dsn()  # skip or fail the same way as every PostgreSQL test
    try:
        server = PostgresServer().start()
    except PostgresUnavailableError as exc:
        unavailable(f"a private PostgreSQL server cannot start: {exc}")
    try:
        if request.param == "direct":
            yield server, PostgresRoute("direct", server.dsn, server.dsn)
        else:
            with pgbouncer_in_front_of(server.dsn) as bouncer:
                options = {"transaction_pooling": True}
                yield server, PostgresRoute("pgbouncer", bouncer.dsn, server.dsn, options)
    finally:
        server.cleanup()


async def test_server_restart_during_attempt_start_never_invokes_unproven(
    own_server: tuple[PostgresServer, PostgresRoute],
) -> None:
    """Straight to the server the restart ends every connection: the start is not
    proven and nothing runs. Behind PgBouncer the re-run start may instead wait in
    the pooler for the restarted server and commit there: then it is proven, and
    the operation runs once. Either way nothing runs unproven or twice."""
    server, route = own_server

    async def restart(blocker: Any, table: str) -> None:
        await asyncio.to_thread(server.restart)

    ledger, op, outcome = await attempt_start_under_row_lock(route, restart)
    await until_reachable(ledger)
    stored = await ledger.find("charge", "k")
    assert stored is not None
    if op.calls == 0:
        assert_not_invoked(ledger, op, outcome)
        # The pool's connections died with the server; later calls reconnect.
        await check_barrier(ledger)
    else:
        assert route.pooled, "straight to the server the restart must end the start"
        assert op.calls == 1
        assert stored.attempts == 1  # the start was proven before the call
        if isinstance(outcome, ActionPersistenceError):
            assert outcome.operation_invoked is True
        again = CountingOperation("charged")
        with contextlib.suppress(ActionInProgressError):
            await ActionRunner(ledger).execute(
                "charge", again, request=REQUEST, idempotency_key="k"
            )
        assert again.calls == 0
    result = await ActionRunner(ledger).execute(
        "charge", CountingOperation("ok"), request=REQUEST, idempotency_key="after"
    )
    assert result.status is ActionStatus.CONFIRMED
    await ledger.close()


async def until_reachable(ledger: PostgresLedger, within: float = 30) -> None:
    """Wait until a read gets through again (a pooler refuses logins for a while
    after the server was down: ``server_login_retry``)."""
    deadline = asyncio.get_running_loop().time() + within
    while True:
        try:
            await ledger.find("charge", "nothing")
            return
        except Exception:
            if asyncio.get_running_loop().time() > deadline:
                raise
            await asyncio.sleep(0.2)


async def test_server_crash_keeps_every_acknowledged_receipt(
    own_server: tuple[PostgresServer, PostgresRoute],
) -> None:
    """Acknowledged transitions survive an immediate shutdown (crash recovery from WAL)."""
    server, route = own_server

    ledger = await fresh_ledger(route)
    runner = ActionRunner(ledger)
    results = [
        await runner.execute(
            "charge", CountingOperation("ok"), request=REQUEST, idempotency_key=f"k{n}"
        )
        for n in range(20)
    ]
    await asyncio.to_thread(server.kill)
    await asyncio.to_thread(server.start)
    await until_reachable(ledger)
    for result in results:
        assert await ledger.get(result.receipt.action_id) == result.receipt
    await ledger.close()
