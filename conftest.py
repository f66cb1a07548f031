"""Test configuration shared by tests/ and stateful_tests/.

Hypothesis profiles are loaded explicitly: Hypothesis would otherwise pick its
own settings when it sees CI=true, and a run must mean the same thing on a
laptop and in CI.
"""

from __future__ import annotations

import compileall
import os
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

import stateful_tests.profiles  # noqa: F401  (registers and loads the Hypothesis profiles)
from dataoad._in_flight import calls_in_flight

#: How long a test's runner calls may take to wind down after it, in seconds.
CALLS_WIND_DOWN = 10.0


#: The project's own Python, which the suite's child processes import.
_COMPILED = (
    "dataoad",
    "suite_support",
    "tests",
    "stateful_tests",
    "models",
    "examples",
    "fault_scenarios",
)


def pytest_xdist_auto_num_workers(config: pytest.Config) -> int | None:
    """Workers for ``-n auto`` (the default): one per CPU, and one more.

    Much of the suite waits on other processes (PostgreSQL, engine workers,
    commands, planted copies' pytest runs) or on fsync: with one worker per
    core, about a fifth of both cores sat idle. On 2 cores the whole suite
    took 539 s with three workers against 642 to 691 s with two (2026-12-07).
    ``PYTEST_XDIST_AUTO_NUM_WORKERS``, or ``-n N``, still decides when given.
    """
    if os.environ.get("PYTEST_XDIST_AUTO_NUM_WORKERS"):
        return None  # xdist's own hook reads it
    return usable_cpus() + 1


def usable_cpus() -> int:
    """The CPUs this process may run on (all of them where the system cannot say)."""
    if hasattr(os, "sched_getaffinity"):  # not on macOS or Windows
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def pytest_configure(config: pytest.Config) -> None:
    """Compile the project's modules once, before any child process imports them.

    The suite starts hundreds of Python processes (workers, CLI commands,
    planted copies). Where ``PYTHONDONTWRITEBYTECODE`` is set (it was, on a
    CI machine), no import writes bytecode, so each of them compiled the
    library and the suite from source again: a pytest child took 1.6 s
    instead of 0.8 s. ``compileall`` writes it regardless, once (the
    controller, not each xdist worker); an up-to-date tree costs a stat per
    file.
    """
    if hasattr(config, "workerinput"):
        return
    root = Path(__file__).parent
    for folder in _COMPILED:
        compileall.compile_dir(root / folder, quiet=2, workers=1)


#: Tests that each take a large share of a worker's time (30 to 60 s on two
#: cores): they start first, so that no worker is left running one of them
#: alone at the end while the other has nothing to do.
_LONGEST_FIRST = (
    "stateful_tests/test_runner_machine.py::TestRunnerMachineMemory",
    "tests/verification/test_models_exhaustive.py::test_default_bound_is_clean",
    "tests/project/test_readme_and_tooling.py::test_mypy_strict_is_clean_on_every_path",
    "stateful_tests/test_planted_examples.py::test_the_copy_without_a_bug",
    "stateful_tests/test_ledger_machine.py::TestLedgerMachine",
)
# Not the runner machine on one shared SQLite connection: its runs replay
# only while its connection's thread keeps pace, and started beside the
# heaviest tests its data generation differed between runs of the same
# choices (Hypothesis's FlakyStrategyDefinition, CI on 3b21293).


#: A test whose check another test selected in the same run makes in full:
#: the quick loop's mypy over the library and the suite, inside mypy over
#: every path (the two, cold and side by side, analysed the library twice).
_INSIDE = {
    "tests/project/test_readme_and_tooling.py::test_mypy_strict_is_clean": (
        "tests/project/test_readme_and_tooling.py::test_mypy_strict_is_clean_on_every_path"
    ),
}


@pytest.hookimpl(trylast=True)  # after pytest-randomly's shuffle, which it keeps otherwise
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Start the longest tests first (the rest keep their shuffled order); leave out a check
    another selected test makes in full."""
    selected = {item.nodeid for item in items}
    inside = [item for item in items if _INSIDE.get(item.nodeid) in selected]
    if inside:
        config.hook.pytest_deselected(items=inside)
        items[:] = [item for item in items if item not in inside]
    items.sort(key=lambda item: not item.nodeid.startswith(_LONGEST_FIRST))


@pytest.fixture(autouse=True)
def no_call_left_in_flight() -> Iterator[None]:
    """Every test ends its runner calls: the process-wide count of calls in flight is
    what the exit hook waits for, so a call left running would hold every later exit
    (and the close machine's exit rule) for a minute."""
    before = calls_in_flight.count
    yield
    deadline = time.monotonic() + CALLS_WIND_DOWN
    while calls_in_flight.count > before and time.monotonic() < deadline:
        time.sleep(0.01)
    left = calls_in_flight.count - before
    assert left <= 0, f"the test left {left} runner call(s) in flight"


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    """Fold every "PostgreSQL unavailable" skip into one line of the short summary."""
    for report in terminalreporter.stats.get("skipped", []):
        longrepr = getattr(report, "longrepr", None)
        if isinstance(longrepr, tuple) and "PostgreSQL unavailable" in str(longrepr[2]):
            report.longrepr = ("suite_support/__init__.py", 0, longrepr[2])
