"""The fixed scenarios: every one passes on every ledger, and fails for a broken runner."""

from __future__ import annotations

import asyncio
import importlib
import json
import subprocess
import sys
from pathlib import Path

import pytest

from dataoad.testing import SafetyReport, in_memory_ledgers, sqlite_ledgers
from fault_scenarios._kit import broken_runner_factories

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "examples"))

SUITES = [
    "payment_timeout_after_commit",
    "fault_scenarios.email_send",
    "fault_scenarios.support_ticket",
    "fault_scenarios.partial_refund",
    "fault_scenarios.infrastructure_change",
]


def run_suite(module: str, **kwargs: object) -> SafetyReport:
    suite = importlib.import_module(module).run_safety_suite
    report = asyncio.run(suite(**kwargs))
    assert type(report) is SafetyReport
    return report


@pytest.mark.parametrize("module", SUITES)
@pytest.mark.parametrize("backend", ["memory", "sqlite"])
def test_every_scenario_passes_on_every_ledger(module: str, backend: str, tmp_path: Path) -> None:
    factory = in_memory_ledgers if backend == "memory" else sqlite_ledgers(tmp_path)
    report = run_suite(module, ledger_factory=factory)
    failed = [f"{c.name}: {c.detail}" for c in report.checks if not c.passed]
    assert report.passed, failed
    assert len(report.checks) >= 5


@pytest.mark.parametrize("module", SUITES)
@pytest.mark.parametrize("broken", sorted(broken_runner_factories()))
def test_a_broken_runner_fails_at_least_one_check_of_every_scenario(
    module: str, broken: str
) -> None:
    report = run_suite(
        module, ledger_factory=in_memory_ledgers, runner_factory=broken_runner_factories()[broken]
    )
    assert not report.passed
    assert report.classification == "UNSAFE UNDER TESTED CONDITIONS"


def dataoad(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "dataoad", *args],
        capture_output=True,
        text=True,
        cwd=ROOT,
        check=False,
    )


@pytest.mark.parametrize("folder", ["examples", "fault_scenarios"])
def test_the_cli_runs_every_scenario_folder(folder: str) -> None:
    done = dataoad("test", folder, "--format", "json")
    assert done.returncode == 0, done.stderr
    payload = json.loads(done.stdout)
    assert payload["passed"] is True
    assert payload["reports"]
    for report in payload["reports"]:
        assert report["classification"] == "SAFE UNDER TESTED CONDITIONS"
        assert all(check["passed"] is True for check in report["checks"])
    text = dataoad("test", folder)
    assert text.returncode == 0
    assert "Summary:" in text.stdout


@pytest.mark.parametrize("module", SUITES)
def test_the_cli_exits_1_when_a_broken_runner_is_swapped_in(module: str, tmp_path: Path) -> None:
    wrapper = tmp_path / "broken_suite.py"
    wrapper.write_text(
        "import sys\n"
        f"sys.path[:0] = [{str(ROOT)!r}, {str(ROOT / 'examples')!r}]\n"
        "import importlib\n"
        "from fault_scenarios._kit import broken_runner_factories\n"
        "async def run_safety_suite():\n"
        f"    suite = importlib.import_module({module!r}).run_safety_suite\n"
        "    return await suite(runner_factory=broken_runner_factories()['retries-unknown'])\n"
    )
    done = dataoad("test", str(wrapper))
    assert done.returncode == 1, done.stdout + done.stderr
    assert "FAIL" in done.stdout
    assert "UNSAFE UNDER TESTED CONDITIONS" in done.stdout
