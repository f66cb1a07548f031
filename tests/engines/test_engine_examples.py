"""Each engine example runs offline and prints exactly the output in its docstring, and
``dataoad check`` targets the provider adapter its guarded step runs, as for any adapter."""

from __future__ import annotations

import contextlib
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.engines.dbos_support import postgres_database, sqlite_fits_dbos

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = sorted(p.stem for p in (ROOT / "examples" / "engines").glob("[!_]*.py"))


def expected_output(path: Path) -> str:
    docstring = path.read_text().split('"""')[1]
    block = docstring.split("Expected output:\n\n", 1)[1]
    return "\n".join(line.removeprefix("    ") for line in block.strip("\n").splitlines())


def test_there_is_one_example_per_engine() -> None:
    assert EXAMPLES == [
        "dbos_checkout",
        "langgraph_checkout",
        "pydantic_ai_dbos_checkout",
        "temporal_checkout",
    ]


@pytest.mark.parametrize("name", EXAMPLES)
def test_example_prints_its_documented_output(name: str, tmp_path: Path) -> None:
    env = {**os.environ, "TMPDIR": str(tmp_path)}
    with contextlib.ExitStack() as stack:
        if not sqlite_fits_dbos():
            env["DATAOAD_EXAMPLE_DBOS_URL"] = stack.enter_context(postgres_database())
        done = run_example(name, env)
    assert done.returncode == 0, done.stderr
    normalised = re.sub(r"\b[0-9a-f]{32}\b", "<action-id>", done.stdout)
    assert normalised.strip() == expected_output(ROOT / "examples" / "engines" / f"{name}.py")
    # The run's ledger and engine state live in a temp folder it removes at exit.
    assert not list(tmp_path.glob("dataoad-engine-*"))


def run_example(name: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", f"examples.engines.{name}"],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


@pytest.mark.parametrize("name", EXAMPLES)
def test_dataoad_check_targets_the_adapter_the_step_runs(name: str) -> None:
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "dataoad",
            "check",
            f"examples/engines/{name}.py:PaymentAdapter",
            "--max-examples",
            "10",
            "--seed",
            "1",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.startswith(f"dataoad check examples/engines/{name}.py:PaymentAdapter\n")
    assert "none found in 10 examples" in done.stdout


def test_the_checked_adapter_is_the_one_the_steps_call() -> None:
    import importlib

    from examples.adapters.payment_adapter import PaymentAdapter

    for name in EXAMPLES:
        module = importlib.import_module(f"examples.engines.{name}")
        assert module.PaymentAdapter is PaymentAdapter, name
