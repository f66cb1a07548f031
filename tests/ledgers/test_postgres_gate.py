"""Without a PostgreSQL server, its tests skip on a laptop and fail under CI=true."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from suite_support.services import unavailable

ROOT = Path(__file__).resolve().parents[2]


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
            "-n",
            "0",  # one process: the output read below is a plain run's
            "tests/ledgers/test_postgres_contract.py",
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


def test_a_killed_test_run_leaves_no_server_or_data_folder_behind() -> None:
    import os
    import signal
    import time

    from dataoad.testing._postgres_server import find_server_binaries

    if find_server_binaries() is None:
        unavailable("PostgreSQL unavailable: no server binaries")
    code = (
        "import time\n"
        "from dataoad.testing import _postgres_server as pg\n"
        "pg.shared_test_dsn()\n"
        "print(pg._shared_server._root, flush=True)\n"
        "time.sleep(120)\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "DATAOAD_TEST_POSTGRES_DSN"}
    run = subprocess.Popen(
        [sys.executable, "-c", code], stdout=subprocess.PIPE, text=True, env=env, cwd=ROOT
    )
    try:
        assert run.stdout is not None
        root = Path(run.stdout.readline().strip())
        assert (root / "data" / "postmaster.pid").exists()
        postmaster = int((root / "data" / "postmaster.pid").read_text().split()[0])
    finally:
        run.send_signal(signal.SIGKILL)  # no atexit, no cleanup: only the reaper is left
        run.wait()
        if run.stdout is not None:
            run.stdout.close()
    deadline = time.monotonic() + 30
    while root.exists() or _alive(postmaster):
        assert time.monotonic() < deadline, (
            f"left behind: folder {root.exists()}, server {_alive(postmaster)}"
        )
        time.sleep(0.1)


def _alive(pid: int) -> bool:
    import os

    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True
