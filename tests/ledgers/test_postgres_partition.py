"""A silent partition to PostgreSQL never holds a call past its bound (H1).

A TCP proxy on 127.0.0.1 stands between the ledger and the test server and
goes silent on command: connections stay open, nothing flows, as in a
network partition. Every statement has a client-side time limit
(``command_timeout``), so a call answers in bounded time and says truthfully
whether the operation ran; a cancelled call ends at once; a connection left
in doubt is never reused, so calls work again once the partition heals.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from typing import Any

import pytest

from dataoad import (
    ActionRunner,
    ActionStatus,
    InvalidArgumentError,
    NothingInvokedError,
    OutcomeNotRecordedError,
    PostgresLedger,
)
from stateful_tests.tcp_proxy import SilentProxy
from suite_support.services import PostgresTestTable

LIMIT = 0.5


#: The statement bound of a ledger whose cancellation is measured: far beyond the
#: bound it is held to, so a cancellation that only ended with the statement fails.
PATIENT = 30.0


@contextlib.asynccontextmanager
async def _through_a_proxy(
    command_timeout: float,
) -> AsyncIterator[tuple[SilentProxy, PostgresLedger]]:
    table = PostgresTestTable()
    await table.create()
    proxy = SilentProxy.for_dsn(table.dsn)
    await proxy.start()
    ledger = PostgresLedger(
        proxy.dsn(table.dsn),
        table=table.table,
        command_timeout=command_timeout,
        connect_timeout=2,
    )
    try:
        yield proxy, ledger
    finally:
        proxy.heal()
        await asyncio.wait_for(ledger.close(), 10)
        await proxy.stop()
        await table.drop()


@pytest.fixture
async def partitioned() -> AsyncIterator[tuple[SilentProxy, PostgresLedger]]:
    async with _through_a_proxy(LIMIT) as both:
        yield both


@pytest.fixture
async def patiently_partitioned() -> AsyncIterator[tuple[SilentProxy, PostgresLedger]]:
    async with _through_a_proxy(PATIENT) as both:
        yield both


async def test_a_call_during_a_partition_answers_in_time_and_invokes_nothing(
    partitioned: tuple[SilentProxy, PostgresLedger],
) -> None:
    proxy, ledger = partitioned
    runner = ActionRunner(ledger)
    calls: list[int] = []
    assert (
        await runner.execute("charge", lambda: "ok", request={}, idempotency_key="a")
    ).status is (ActionStatus.CONFIRMED)
    proxy.partition()
    started = time.monotonic()
    with pytest.raises(NothingInvokedError) as info:
        await runner.execute("charge", lambda: calls.append(1), request={}, idempotency_key="b")
    # The claim, its read-back and one fresh read: each bounded.
    assert time.monotonic() - started < 6 * LIMIT + 1
    assert info.value.operation_invoked is False
    assert calls == []
    proxy.heal()
    done = await runner.execute("charge", lambda: "ok", request={}, idempotency_key="c")
    assert done.status is ActionStatus.CONFIRMED


async def test_the_first_call_is_bounded_while_it_checks_the_schema(
    partitioned: tuple[SilentProxy, PostgresLedger],
) -> None:
    """A ledger opened before the partition reads its schema version on its first call:
    that read is bounded like every statement, and a cancellation ends it at once."""
    proxy, ledger = partitioned
    await ledger.durability()  # the pool is open; the schema is not checked yet
    proxy.partition()
    started = time.monotonic()
    with pytest.raises(NothingInvokedError):
        await ActionRunner(ledger).execute("charge", lambda: "ok", request={}, idempotency_key="a")
    assert time.monotonic() - started < 6 * LIMIT + 1


async def test_a_cancelled_first_call_ends_while_it_checks_the_schema(
    patiently_partitioned: tuple[SilentProxy, PostgresLedger],
) -> None:
    """Cancelled while its schema read hangs (a statement bound far away), the call ends
    at once: the cancellation ended it, not the statement's bound."""
    proxy, ledger = patiently_partitioned
    await ledger.durability()  # the pool is open; the schema is not checked yet
    proxy.partition()
    call = asyncio.ensure_future(
        ActionRunner(ledger).execute("charge", lambda: "ok", request={}, idempotency_key="b")
    )
    await asyncio.sleep(0.1)
    started = time.monotonic()
    call.cancel()
    with pytest.raises(asyncio.CancelledError):
        await asyncio.wait_for(call, 2 * PATIENT)
    assert time.monotonic() - started < 3  # the bound is PATIENT s


async def test_a_partition_during_the_operation_says_it_ran(
    partitioned: tuple[SilentProxy, PostgresLedger],
) -> None:
    proxy, ledger = partitioned
    runner = ActionRunner(ledger, lease=None)

    def cut_then_charge() -> str:
        proxy.partition()  # the claim is stored; the outcome write will meet the partition
        return "ch_1"

    started = time.monotonic()
    with pytest.raises(OutcomeNotRecordedError) as info:
        await runner.execute("charge", cut_then_charge, request={}, idempotency_key="k")
    assert time.monotonic() - started < 6 * LIMIT + 1
    assert info.value.operation_invoked is True
    proxy.heal()
    stored = await ledger.find("charge", "k")
    assert stored is not None
    assert stored.is_pending  # never recorded: a PENDING claim, settled read-only later


async def test_a_cancelled_call_in_a_partition_ends_at_once(
    patiently_partitioned: tuple[SilentProxy, PostgresLedger],
) -> None:
    proxy, ledger = patiently_partitioned
    runner = ActionRunner(ledger)
    await runner.execute("charge", lambda: "ok", request={}, idempotency_key="a")
    proxy.partition()
    task = asyncio.ensure_future(
        runner.execute("charge", lambda: "ok", request={}, idempotency_key="b")
    )
    await asyncio.sleep(0.1)
    task.cancel()
    started = time.monotonic()
    done, _ = await asyncio.wait({task}, timeout=2 * PATIENT)
    assert done, "the cancelled call is still running"
    # Far below the statement's own bound (PATIENT s): the cancellation itself ended it.
    assert time.monotonic() - started < 3
    proxy.heal()
    again = await runner.execute("charge", lambda: "ok", request={}, idempotency_key="c")
    assert again.status is ActionStatus.CONFIRMED


@pytest.mark.parametrize("value", [0, -1, float("nan"), float("inf"), 3601, "5", True])
def test_a_bad_command_timeout_is_refused(value: Any) -> None:
    with pytest.raises(InvalidArgumentError, match="command_timeout"):
        PostgresLedger("postgresql://u@127.0.0.1/db", command_timeout=value)


async def test_a_partition_right_after_a_new_connection_logs_in_is_bounded() -> None:
    """Straight to the server, the pool names each new connection's backend with a query
    it runs first (so a write left in doubt can be ended on the server). A partition that
    falls between the login and that query bounds the call like any statement: on the
    first call, and on a reconnect after the server ended the ledger's connections."""
    table = PostgresTestTable()
    await table.create()
    proxy = SilentProxy.for_dsn(table.dsn)
    await proxy.start()
    ledger, fresh = (
        PostgresLedger(
            proxy.dsn(table.dsn),
            table=table.table,
            command_timeout=LIMIT,
            connect_timeout=1,
            transaction_pooling=False,
        )
        for _ in range(2)
    )
    try:
        runner = ActionRunner(ledger)
        assert (
            await runner.execute("charge", lambda: "ok", request={}, idempotency_key="a")
        ).status is ActionStatus.CONFIRMED
        proxy.partition_after_login()
        # The first call of a ledger that never connected.
        started = time.monotonic()
        with pytest.raises(NothingInvokedError):
            await asyncio.wait_for(
                ActionRunner(fresh).execute(
                    "charge", lambda: "ok", request={}, idempotency_key="b"
                ),
                30,
            )
        assert time.monotonic() - started < 10
        # A ledger in use whose connections the server ended: it connects again.
        import asyncpg

        ours = list(ledger._backends._started)  # type: ignore[union-attr]  # this pool's only
        assert ours
        admin = await asyncpg.connect(table.dsn)
        try:
            await admin.execute("SELECT pg_terminate_backend(pid) FROM unnest($1::int[]) pid", ours)
        finally:
            await admin.close()
        started = time.monotonic()
        with pytest.raises((NothingInvokedError, OutcomeNotRecordedError)):
            await asyncio.wait_for(
                runner.execute("charge", lambda: "ok", request={}, idempotency_key="c"), 30
            )
        assert time.monotonic() - started < 10
    finally:
        proxy.heal()
        await asyncio.wait_for(ledger.close(), 10)
        await asyncio.wait_for(fresh.close(), 10)
        await proxy.stop()
        await table.drop()
