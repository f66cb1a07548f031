"""Test configuration shared by tests/ and stateful_tests/.

Hypothesis profiles are loaded explicitly: Hypothesis would otherwise pick its
own settings when it sees CI=true, and a run must mean the same thing on a
laptop and in CI.
"""

from __future__ import annotations

import pytest

import stateful_tests.profiles  # noqa: F401  (registers and loads the Hypothesis profiles)


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    """Fold every "PostgreSQL unavailable" skip into one line of the short summary."""
    for report in terminalreporter.stats.get("skipped", []):
        longrepr = getattr(report, "longrepr", None)
        if isinstance(longrepr, tuple) and "PostgreSQL unavailable" in str(longrepr[2]):
            report.longrepr = ("tests/support.py", 0, longrepr[2])
