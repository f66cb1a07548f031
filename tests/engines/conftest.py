"""Engine tests: the engines themselves, in real processes. The "without Dataoad" runs
report the double charges they show in the terminal summary."""

from __future__ import annotations

import pytest


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
