"""Fixtures shared by the example tests."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from dataoad import (
    InMemoryLedger,
    Ledger,
    SQLiteLedger,
)
from dataoad.testing import ManualClock
from suite_support import BACKENDS, LEDGER_START, closing
from suite_support.fault_guard import guarding_injected_faults
from suite_support.services import (
    PostgresRoute,
    PostgresTestTable,
    pgbouncer_in_front_of,
    postgres_dsn,
)


@pytest.fixture(params=BACKENDS)
def new_ledger(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Callable[[], Ledger]]:
    """A factory of ledgers of one backend (memory, SQLite, PostgreSQL), all on one store."""
    kind = request.param
    if kind == "memory":
        shared = InMemoryLedger()
        yield lambda: shared
    elif kind == "sqlite":
        yield lambda: SQLiteLedger(tmp_path / "ledger.sqlite3")
    else:
        table = PostgresTestTable()
        asyncio.run(table.create())
        try:
            yield table.client
        finally:
            asyncio.run(table.drop())


@pytest.fixture(params=BACKENDS)
async def clocked(
    request: pytest.FixtureRequest, tmp_path: Path
) -> AsyncIterator[tuple[Any, ManualClock]]:
    """A ledger of each backend whose clock is a ManualClock at ``LEDGER_START``, far from
    the host's: anything the host's clock stamped would show."""
    clock = ManualClock(LEDGER_START)
    table = None
    if request.param == "memory":
        ledger: Any = InMemoryLedger(clock=clock)
    elif request.param == "sqlite":
        ledger = SQLiteLedger(tmp_path / "ledger.sqlite3", clock=clock)
    else:
        table = PostgresTestTable()
        await table.create()
        ledger = table.client(clock=clock, max_size=4)
    yield ledger, clock
    await closing(ledger)
    if table is not None:
        await table.drop()


@pytest.fixture(autouse=True)
def every_injected_fault_strikes(
    request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch
) -> Iterator[None]:
    """Each fault a test injects must strike, and a lost acknowledgement must follow a
    write that stored something (``suite_support.fault_guard``).

    A test that injects more than it needs on purpose says why with
    ``@pytest.mark.faults_may_remain("why")``; one that loses the answer to a
    refused write on purpose, with ``@pytest.mark.refused_write_may_lose_its_ack("why")``.
    """
    with guarding_injected_faults(
        monkeypatch,
        unstruck_allowed=request.node.get_closest_marker("faults_may_remain") is not None,
        refused_allowed=request.node.get_closest_marker("refused_write_may_lose_its_ack")
        is not None,
    ):
        yield


@pytest.fixture
def caplog(caplog: pytest.LogCaptureFixture) -> pytest.LogCaptureFixture:
    """Every test here reads the dataoad logger's records at INFO and above."""
    caplog.set_level(logging.INFO, logger="dataoad")
    return caplog


@pytest.fixture(scope="session")
def pgbouncer() -> Iterator[str]:
    """PgBouncer in transaction mode in front of the shared test server; its DSN."""
    with pgbouncer_in_front_of(postgres_dsn()) as bouncer:
        yield bouncer.dsn


@pytest.fixture(params=["direct", "pgbouncer"])
def route(request: pytest.FixtureRequest) -> PostgresRoute:
    """The shared test server reached straight, then through PgBouncer in transaction mode."""
    server = postgres_dsn()
    if request.param == "direct":
        return PostgresRoute("direct", server, server)
    bouncer = request.getfixturevalue("pgbouncer")
    return PostgresRoute("pgbouncer", bouncer, server, {"transaction_pooling": True})
