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
* Schema handling, the missing-extra error, and bad arguments.
"""

from __future__ import annotations

import asyncio
import contextlib
import subprocess
import sys
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import pytest

from dataoad import (
    ActionInProgressError,
    ActionPersistenceError,
    ActionRunner,
    ActionStatus,
    ClaimState,
    InvalidArgumentError,
    LedgerSchemaError,
    PostgresLedger,
)
from dataoad.ledgers.postgres import SCHEMA_VERSION as PG_SCHEMA
from dataoad.testing import ManualClock
from dataoad.testing._postgres_server import PostgresServer, PostgresUnavailableError
from stateful_tests.services import postgres_dsn, unavailable, unique_table
from tests.support import REQUEST, CountingOperation, unstarted


async def fresh_ledger(dsn: str, **options: Any) -> PostgresLedger:
    table = options.pop("table", None) or unique_table()
    ledger = PostgresLedger(dsn, table=table, **options)
    await ledger.migrate()
    return ledger


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
        self._server: asyncio.Server | None = None
        self.listen_port = 0

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.listen_port = self._server.sockets[0].getsockname()[1]

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()

    async def _serve(self, client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        server_r, server_w = await asyncio.open_connection(self.host, self.port)

        async def pump(
            reader: asyncio.StreamReader, writer: asyncio.StreamWriter, answers: bool
        ) -> None:
            try:
                while data := await reader.read(65536):
                    if answers and self.armed is not None and self.armed in data:
                        self.armed = None
                        self.dropped += 1
                        break
                    writer.write(data)
                    await writer.drain()
            except (ConnectionError, OSError):
                pass
            finally:
                for w in (client_w, server_w):
                    w.close()

        await asyncio.gather(pump(client_r, server_w, False), pump(server_r, client_w, True))


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
def test_lost_acknowledgement_is_read_back_and_the_operation_runs_once(
    step: str, tag: bytes
) -> None:
    dsn = postgres_dsn()

    async def scenario() -> None:
        async with proxied(dsn) as (proxy, proxy_dsn):
            clock = ManualClock()
            ledger = await fresh_ledger(proxy_dsn, clock=clock)
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

    asyncio.run(scenario())


# -- unproven attempt starts ---------------------------------------------------------------


class PausingLedger(PostgresLedger):
    """Runs ``before_start`` just before the attempt-start statement."""

    before_start: Callable[[], Awaitable[None]] | None = None

    async def start_attempt(self, receipt: Any, **lease: Any) -> bool:
        if self.before_start is not None:
            await self.before_start()
        return await super().start_attempt(receipt, **lease)


async def attempt_start_under_row_lock(
    dsn: str,
    interfere: Callable[[Any, PausingLedger], Awaitable[None]],
    *,
    commit_lock: bool = False,
    **options: Any,
) -> tuple[PausingLedger, CountingOperation, BaseException | Any]:
    """Take over a legacy unstarted claim and start its attempt while another
    session holds the claim's row lock; ``interfere`` acts meanwhile."""
    import asyncpg

    table = unique_table()
    clock = ManualClock()
    setup = await fresh_ledger(dsn, table=table, clock=clock)
    await leave_legacy_claim(setup, clock)
    await setup.close()
    # The blocker connects before the ledger's pool opens (at the runner's first
    # call), as it did before the fused claim: a fast shutdown signals the newest
    # backend first, so the waiting start ends before the blocker's lock does.
    # The other way round the start can get the lock and commit before its own
    # termination (the runner then proves it by read-back and rightly invokes).
    ledger = PausingLedger(dsn, table=table, clock=clock, **options)
    blocker = await asyncpg.connect(dsn)
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
    for _ in range(500):
        waiting = await blocker.fetchval(
            "SELECT count(*) FROM pg_stat_activity WHERE application_name = 'dataoad' "
            "AND wait_event_type = 'Lock'"
        )
        if waiting:
            break
        await asyncio.sleep(0.01)
    else:
        raise AssertionError("the attempt start never waited on the row lock")
    await interfere(blocker, ledger)
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


def test_terminated_backend_during_attempt_start_reruns_it_on_a_fresh_connection() -> None:
    """The server ended the connection mid-statement: nothing of it committed.

    The conditional start runs once more on a fresh connection (once the
    row lock is gone) and is proven before the operation runs, once.
    """
    dsn = postgres_dsn()

    async def terminate(blocker: Any, ledger: PausingLedger) -> None:
        killed = await blocker.fetchval(
            "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
            "WHERE application_name = 'dataoad' AND wait_event_type = 'Lock'"
        )
        assert killed == 1

    async def scenario() -> None:
        ledger, op, outcome = await attempt_start_under_row_lock(dsn, terminate)
        assert not isinstance(outcome, BaseException), outcome
        assert outcome.status is ActionStatus.CONFIRMED
        assert op.calls == 1
        receipt = await ledger.find("charge", "k")
        assert receipt is not None
        assert receipt.final_status is ActionStatus.CONFIRMED
        assert receipt.attempts == 1
        assert receipt.fencing_token == 2  # taken over, then started once
        await ledger.close()

    asyncio.run(scenario())


def test_statement_timeout_during_attempt_start_does_not_invoke() -> None:
    dsn = postgres_dsn()

    async def wait_for_timeout(blocker: Any, ledger: PausingLedger) -> None:
        await asyncio.sleep(0.5)  # longer than the ledger's 0.2 s statement timeout

    async def scenario() -> None:
        ledger, op, outcome = await attempt_start_under_row_lock(
            dsn, wait_for_timeout, statement_timeout=0.2
        )
        assert_not_invoked(ledger, op, outcome)
        assert "QueryCanceled" in str(outcome) or "statement timeout" in str(outcome)
        await check_barrier(ledger)
        await ledger.close()

    asyncio.run(scenario())


def serializable(dsn: str) -> str:
    return f"{dsn}?default_transaction_isolation=serializable"


def test_serialization_failure_without_retries_does_not_invoke() -> None:
    dsn = postgres_dsn()

    async def nothing(blocker: Any, ledger: PausingLedger) -> None:
        return None

    async def scenario() -> None:
        # The blocker's UPDATE commits while the attempt start waits: under
        # SERIALIZABLE the waiting statement fails with a serialization error.
        ledger, op, outcome = await attempt_start_under_row_lock(
            serializable(dsn), nothing, commit_lock=True, serialization_retries=0
        )
        assert_not_invoked(ledger, op, outcome)
        assert "SerializationError" in str(outcome)
        await check_barrier(ledger)
        await ledger.close()

    asyncio.run(scenario())


def test_serialization_failure_is_rerun_by_the_ledger() -> None:
    dsn = postgres_dsn()

    async def nothing(blocker: Any, ledger: PausingLedger) -> None:
        return None

    async def scenario() -> None:
        ledger, op, outcome = await attempt_start_under_row_lock(
            serializable(dsn), nothing, commit_lock=True
        )
        # The server rolled the statement back, so re-running it was safe;
        # the version did not change, so it applied the second time.
        assert not isinstance(outcome, BaseException), outcome
        assert outcome.status is ActionStatus.CONFIRMED
        assert op.calls == 1
        await ledger.close()

    asyncio.run(scenario())


# -- a server of its own: restarts and crashes ---------------------------------------------


@pytest.fixture
def own_server() -> Any:
    postgres_dsn()  # skip or fail the same way as every PostgreSQL test
    try:
        server = PostgresServer().start()
    except PostgresUnavailableError as exc:
        unavailable(f"a private PostgreSQL server cannot start: {exc}")
    yield server
    server.cleanup()


def test_server_restart_during_attempt_start_does_not_invoke(own_server: PostgresServer) -> None:
    async def restart(blocker: Any, ledger: PausingLedger) -> None:
        await asyncio.to_thread(own_server.restart)

    async def scenario() -> None:
        ledger, op, outcome = await attempt_start_under_row_lock(own_server.dsn, restart)
        assert_not_invoked(ledger, op, outcome)
        # The pool's connections died with the server; later calls reconnect.
        await check_barrier(ledger)
        result = await ActionRunner(ledger).execute(
            "charge", CountingOperation("ok"), request=REQUEST, idempotency_key="after"
        )
        assert result.status is ActionStatus.CONFIRMED
        await ledger.close()

    asyncio.run(scenario())


def test_server_crash_keeps_every_acknowledged_receipt(own_server: PostgresServer) -> None:
    """Acknowledged transitions survive an immediate shutdown (crash recovery from WAL)."""

    async def scenario() -> None:
        ledger = await fresh_ledger(own_server.dsn)
        runner = ActionRunner(ledger)
        results = [
            await runner.execute(
                "charge", CountingOperation("ok"), request=REQUEST, idempotency_key=f"k{n}"
            )
            for n in range(20)
        ]
        await asyncio.to_thread(own_server.kill)
        await asyncio.to_thread(own_server.start)
        for result in results:
            assert await ledger.get(result.receipt.action_id) == result.receipt
        await ledger.close()

    asyncio.run(scenario())


# -- schema ---------------------------------------------------------------------------------


def test_ledger_refuses_a_database_without_the_schema() -> None:
    dsn = postgres_dsn()

    async def scenario() -> None:
        ledger = PostgresLedger(dsn, table=unique_table())
        op = CountingOperation("ok")
        with pytest.raises(LedgerSchemaError, match="ledger migrate"):
            await ledger.find("a", "k")
        with pytest.raises(ActionPersistenceError, match="ledger migrate") as info:
            await ActionRunner(ledger).execute("a", op, request=REQUEST, idempotency_key="k")
        assert isinstance(info.value.__cause__, LedgerSchemaError)
        assert op.calls == 0
        assert await ledger.schema_version() is None  # nothing was created
        await ledger.close()

    asyncio.run(scenario())


def test_concurrent_migrations_from_many_clients_apply_once() -> None:
    dsn = postgres_dsn()
    table = unique_table()

    async def scenario() -> None:
        ledgers = [PostgresLedger(dsn, table=table) for _ in range(8)]
        found = await asyncio.gather(*(ledger.migrate() for ledger in ledgers))
        assert sorted(found) == [0] + [PG_SCHEMA] * 7
        assert await ledgers[0].schema_version() == PG_SCHEMA
        assert await ledgers[0].migrate() == PG_SCHEMA  # idempotent
        for ledger in ledgers:
            await ledger.close()

    asyncio.run(scenario())


def test_newer_schema_is_refused_and_left_alone() -> None:
    dsn = postgres_dsn()

    async def scenario() -> None:
        ledger = await fresh_ledger(dsn)
        pool = await ledger._raw_pool()
        await pool.execute(f'INSERT INTO "public"."{ledger.table}_schema" (version) VALUES (99)')
        other = PostgresLedger(dsn, table=ledger.table)
        with pytest.raises(LedgerSchemaError, match="newer"):
            await other.find("a", "k")
        with pytest.raises(LedgerSchemaError, match="newer"):
            await other.migrate()
        assert await other.schema_version() == 99
        await other.close()
        await ledger.close()

    asyncio.run(scenario())


def test_schema_and_table_names_isolate_ledgers() -> None:
    dsn = postgres_dsn()

    async def scenario() -> None:
        schema = unique_table()
        a = await fresh_ledger(dsn, schema=schema, table="receipts")
        b = await fresh_ledger(dsn, table=unique_table())
        op = CountingOperation("ok")
        await ActionRunner(a).execute("a", op, request=REQUEST, idempotency_key="k")
        await ActionRunner(b).execute("a", op, request=REQUEST, idempotency_key="k")
        assert op.calls == 2
        assert len(await a.receipts()) == len(await b.receipts()) == 1
        await a.close()
        await b.close()

    asyncio.run(scenario())


def test_given_pool_is_used_and_not_closed() -> None:
    dsn = postgres_dsn()

    async def scenario() -> None:
        import asyncpg

        await (await fresh_ledger(dsn, table="given_pool_table")).close()
        pool = await asyncpg.create_pool(dsn, min_size=1, max_size=2)
        async with PostgresLedger(pool=pool, table="given_pool_table") as ledger:
            result = await ActionRunner(ledger).execute(
                "a", CountingOperation("ok"), request=REQUEST, idempotency_key=unique_table()
            )
            assert result.status is ActionStatus.CONFIRMED
        assert await pool.fetchval("SELECT 1") == 1
        await pool.close()

    asyncio.run(scenario())


@pytest.mark.parametrize(
    "kwargs",
    [
        {},
        {"dsn": ""},
        {"dsn": "postgresql://x", "pool": object()},
        {"dsn": "postgresql://x", "table": "Bad-Name"},
        {"dsn": "postgresql://x", "schema": 'x"; DROP TABLE y; --'},
        {"dsn": "postgresql://x", "min_size": 5, "max_size": 2},
        {"dsn": "postgresql://x", "statement_timeout": 0},
        {"dsn": "postgresql://x", "serialization_retries": -1},
    ],
)
def test_bad_arguments_are_refused(kwargs: dict[str, Any]) -> None:
    with pytest.raises(InvalidArgumentError):
        PostgresLedger(**kwargs)


def test_without_the_extra_import_works_and_the_error_names_the_extra() -> None:
    code = (
        "import sys; sys.modules['asyncpg'] = None\n"
        "import dataoad\n"
        "try:\n"
        "    dataoad.PostgresLedger('postgresql://localhost/x')\n"
        "except dataoad.MissingExtraError as exc:\n"
        "    print(exc)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
    )
    assert "'postgres' extra" in done.stdout
    assert 'pip install -e ".[postgres]"' in done.stdout


def test_each_step_is_one_autocommit_statement_and_commits_are_synchronous(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """README: one autocommit statement per ledger step, no BEGIN/COMMIT; synchronous_commit never lowered."""
    import asyncpg

    dsn = postgres_dsn()
    calls: list[tuple[str, str]] = []
    connection = asyncpg.connection.Connection

    def recorded(name: str) -> Callable[..., Any]:
        real = getattr(connection, name)

        def call(self: Any, *args: Any, **kwargs: Any) -> Any:
            calls.append((name, args[0] if args and isinstance(args[0], str) else ""))
            return real(self, *args, **kwargs)

        return call

    async def scenario() -> None:
        ledger = await fresh_ledger(dsn)
        runner = ActionRunner(ledger)
        await runner.execute(
            "charge", CountingOperation("ok"), request=REQUEST, idempotency_key="w"
        )
        # Whatever reaches the server goes through one of these.
        for name in ("fetch", "fetchrow", "fetchval", "execute", "executemany", "transaction"):
            monkeypatch.setattr(connection, name, recorded(name))
        try:
            await runner.execute(
                "charge", CountingOperation("ok"), request=REQUEST, idempotency_key="k"
            )
        finally:
            monkeypatch.undo()
        assert {name for name, _ in calls} == {"fetch"}, calls
        statements = [sql.lstrip().split(None, 1)[0].upper() for _, sql in calls]
        # Two writes now: the claim (a data-modifying WITH, with the key's lookup
        # folded in) counting attempt 1, and the outcome; no lookup before them.
        assert statements == ["WITH", "UPDATE"], statements
        assert "INSERT INTO" in calls[0][1]
        assert not {"BEGIN", "COMMIT", "START", "SET"} & set(statements), statements
        pool = await ledger._raw_pool()
        assert await pool.fetchval("SHOW synchronous_commit") == "on"
        await ledger.close()

    asyncio.run(scenario())
