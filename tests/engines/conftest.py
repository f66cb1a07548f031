"""Engine tests: the engines themselves, in real processes. The "without Dataoad" runs
report the double charges they show in the terminal summary."""

from __future__ import annotations

import logging
import sys
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path

import pytest
from dbos import DBOS

from tests.engines.dbos_support import system_database


@pytest.fixture
def dbos_system_database(tmp_path: Path) -> Iterator[str]:
    """DBOS's system database for one test: SQLite where DBOS supports it, else PostgreSQL."""
    with system_database(tmp_path) as url:
        yield url


@pytest.fixture
async def dbos_app(dbos_system_database: str) -> AsyncIterator[Callable[[], None]]:
    """A DBOS app on a fresh system database; call the result to launch it."""
    # DBOS's console handler keeps the stream it first saw; a second pytest
    # session in one process (mutmut's clean run after its stats run) would
    # find it closed, and DBOS's first log line would fail the set-up.
    for handler in logging.getLogger("dbos").handlers:
        if isinstance(handler, logging.StreamHandler) and getattr(handler.stream, "closed", False):
            handler.stream = sys.stderr  # not setStream: it flushes the closed one first
    DBOS(config={"name": "dataoad-test", "system_database_url": dbos_system_database})
    yield DBOS.launch
    DBOS.destroy(destroy_registry=True)


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    lines = [
        value
        for report in terminalreporter.stats.get("passed", [])
        for name, value in getattr(report, "user_properties", [])
        if name == "without_dataoad"
    ]
    if lines:
        terminalreporter.section("engines without Dataoad")
        for line in sorted(lines):
            terminalreporter.line(line)
