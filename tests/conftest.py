"""Fixtures shared by the example tests."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from dataoad import (
    InMemoryLedger,
    Ledger,
    SQLiteLedger,
)
from dataoad.testing import FaultyLedger
from suite_support import BACKENDS
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


@pytest.fixture(autouse=True)
def every_injected_fault_strikes(
    request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch
) -> Iterator[None]:
    """A fault a test injects into a FaultyLedger must strike before the test ends.

    One that never strikes leaves the test's scenario unbuilt, and the test
    then passes for another reason (an audit found such tests). A test that
    injects more than it needs on purpose says why with
    ``@pytest.mark.faults_may_remain("why")``.
    """
    made: list[FaultyLedger] = []
    build = FaultyLedger.__init__

    def register(self: FaultyLedger, *args: Any, **kwargs: Any) -> None:
        build(self, *args, **kwargs)
        made.append(self)

    monkeypatch.setattr(FaultyLedger, "__init__", register)
    yield
    if request.node.get_closest_marker("faults_may_remain") is None:
        left = {id(f): f._faults for f in made if f.pending_faults()}
        assert not left, f"injected faults never struck: {list(left.values())}"


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
