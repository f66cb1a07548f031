"""Without a PostgreSQL server, its tests skip on a laptop and fail under CI=true."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def run_without_server(ci: str | None) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("CI", "DATAOAD_TEST_POSTGRES_DSN")}
    env["DATAOAD_PG_BINDIR"] = "/nonexistent"  # no server binaries anywhere
    if ci is not None:
        env["CI"] = ci
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            "tests/test_postgres_contract.py",
            "-k",
            "claim_creates_exactly_once or one_winner",
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


def test_without_a_server_postgres_tests_skip_with_one_line() -> None:
    done = run_without_server(None)
    assert done.returncode == 0, done.stdout + done.stderr
    skip_lines = [line for line in done.stdout.splitlines() if line.startswith("SKIPPED")]
    assert len(skip_lines) == 1, done.stdout
    assert "PostgreSQL unavailable" in skip_lines[0]
    assert " skipped" in done.stdout
    assert " passed" not in done.stdout


@pytest.mark.parametrize("ci", ["true", "1"])
def test_without_a_server_postgres_tests_fail_under_ci(ci: str) -> None:
    done = run_without_server(ci)
    assert done.returncode == 1, done.stdout + done.stderr
    assert "CI=true and PostgreSQL unavailable" in done.stdout
    assert "skipped" not in done.stdout
