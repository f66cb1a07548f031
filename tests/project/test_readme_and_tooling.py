"""The README's example runs as written; the type checker and linter are clean."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path
from typing import cast

import pytest

from suite_support.services import tool

ROOT = Path(__file__).resolve().parents[2]


#: A Python snippet, with the hidden set-up an HTML comment right before it may give.
SNIPPET = re.compile(
    r"(?:<!-- setup[^\n]*\n(?P<setup>.*?)-->\n)?```python\n(?P<code>.*?)```", re.DOTALL
)


def python_blocks() -> list[str]:
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    return [m["code"] for m in SNIPPET.finditer(text)]


def snippets() -> list[tuple[str, str, str]]:
    """(where, set-up, code) for every Python snippet of the README and the docs."""
    found = []
    for path in [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]:
        text = path.read_text(encoding="utf-8")
        for m in SNIPPET.finditer(text):
            line = text[: m.start("code")].count("\n") + 1
            found.append((f"{path.relative_to(ROOT)}:{line}", m["setup"] or "", m["code"]))
    return found


@pytest.mark.parametrize(("where", "setup", "code"), snippets(), ids=[s[0] for s in snippets()])
def test_every_python_snippet_runs(tmp_path: Path, where: str, setup: str, code: str) -> None:
    script = tmp_path / "snippet.py"
    script.write_text(setup + code, encoding="utf-8")
    done = subprocess.run(
        [sys.executable, str(script)],
        capture_output=True,
        text=True,
        cwd=ROOT,  # set-ups import the examples
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, f"{where}:\n{done.stderr}"


def test_readme_thirty_second_example_prints_what_the_readme_says(tmp_path: Path) -> None:
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    blocks = [b for b in python_blocks() if "asyncio.run(main())" in b]
    assert blocks, "README lost its runnable example"
    script = tmp_path / "example.py"
    script.write_text(blocks[0], encoding="utf-8")
    done = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, cwd=tmp_path, check=False
    )
    assert done.returncode == 0, done.stderr
    printed = text.split("It prints:\n\n```\n", 1)[1].split("```", 1)[0]
    assert done.stdout == printed


TYPED_USER_PROGRAM = """
from dataoad import ActionResult, ActionRunner, InMemoryLedger, SyncActionRunner, guarded

sync_runner = SyncActionRunner(InMemoryLedger())
async_runner = ActionRunner(InMemoryLedger())

def blocking() -> int:
    return 1

reveal_type(sync_runner.execute("a", blocking, request={}, idempotency_key="k"))

@guarded("b", runner=sync_runner, idempotency_key=lambda n: str(n), request=lambda n: {"n": n})
def send(n: int) -> str:
    return "sent"

reveal_type(send(1))

@guarded("c", runner=async_runner, idempotency_key=lambda n: str(n), request=lambda n: {"n": n})
async def charge(n: int) -> float:
    return 1.0

reveal_type(charge(1))
"""


def test_sync_runner_and_guarded_are_typed_like_the_async_runner(tmp_path: Path) -> None:
    program = tmp_path / "user_program.py"
    program.write_text(TYPED_USER_PROGRAM, encoding="utf-8")
    done = subprocess.run(
        [*_tool("mypy"), "--strict", "--no-incremental", str(program)],
        capture_output=True,
        text=True,
        cwd=ROOT,
        check=False,
    )
    revealed = [line for line in done.stdout.splitlines() if "Revealed type" in line]
    assert len(revealed) == 3, done.stdout
    # mypy spells builtins with or without their module, depending on its version.
    assert re.search(r'ActionResult\[(builtins\.)?int\]"', revealed[0]), revealed[0]
    assert re.search(r'ActionResult\[(builtins\.)?str\]"', revealed[1]), revealed[1]
    assert re.search(
        r"Coroutine\[Any, Any, dataoad\._result\.ActionResult\[(builtins\.)?float\]\]",
        revealed[2],
    ), revealed[2]


def _tool(name: str) -> list[str]:
    return tool(name)


def typed_paths() -> list[str]:
    """The library and the code that checks it, as far as the installed tools can type it.

    The state machines and planted bugs are held where Hypothesis types its
    stateful API (older releases, which the lower bound allows, leave
    ``run_state_machine_as_test`` unannotated): a planted bug that raised
    TypeError instead of staying wrong was found this way. Not the
    benchmarks: their peers come with the ``bench`` extra, which the dev
    install lacks.
    """
    from hypothesis.stateful import run_state_machine_as_test

    paths = ["dataoad", "models", "suite_support"]
    if run_state_machine_as_test.__annotations__:
        paths.append("stateful_tests")
    return paths


def every_typed_path() -> list[str]:
    """All the project's Python, as far as the installed packages type it.

    The tests, examples and fault scenarios are typed against the newest
    engines (langgraph, DBOS, Temporal, Pydantic AI), whose types change
    between the releases the lower bounds allow; so this runs with the slow
    tests, which CI runs at the newest versions. Two test defects were found
    this way: stand-ins that raised TypeError, so that a test passed on a
    failed write instead of the refusal it names, and a patch of a method
    the code under test never calls.
    """
    import importlib.util

    paths = [*typed_paths(), "tests", "examples", "fault_scenarios", "scripts", "docs"]
    paths += [".ci/lower_bounds.py", "conftest.py"]
    if importlib.util.find_spec("aws_lambda_powertools") and importlib.util.find_spec("idemkit"):
        paths.append("benchmarks")  # its peers come with the bench extra
    return paths


def _mypy_strict(paths: list[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*_tool("mypy"), "--strict", *paths], capture_output=True, text=True, cwd=ROOT, check=False
    )


def test_mypy_strict_is_clean() -> None:
    done = _mypy_strict(typed_paths())
    assert done.returncode == 0, done.stdout + done.stderr


@pytest.mark.slow
def test_mypy_strict_is_clean_on_every_path() -> None:
    done = _mypy_strict(every_typed_path())
    assert done.returncode == 0, done.stdout + done.stderr


def test_ruff_check_and_format_are_clean() -> None:
    check = subprocess.run(
        [*_tool("ruff"), "check", "."], capture_output=True, text=True, cwd=ROOT, check=False
    )
    assert check.returncode == 0, check.stdout + check.stderr
    fmt = subprocess.run(
        [*_tool("ruff"), "format", "--check", "."],
        capture_output=True,
        text=True,
        cwd=ROOT,
        check=False,
    )
    assert fmt.returncode == 0, fmt.stdout + fmt.stderr


def test_no_text_tells_a_user_to_install_dataoad_from_the_package_index() -> None:
    # The index's "dataoad" is another project: every install is from a
    # checkout (pip install -e ".[extra]") or a wheel built from it.
    texts = [ROOT / "README.md", *(ROOT / "dataoad").rglob("*.py"), *(ROOT / "docs").rglob("*.md")]
    # (A direct reference, "dataoad @ git+URL@commit", names this repository.)
    pattern = re.compile(r"pip install\s+(-U\s+|--upgrade\s+)?[\"']?dataoad\b(?!\S*\s*@\s*git\+)")
    offenders = [
        f"{path.relative_to(ROOT)}: {line.strip()}"
        for path in texts
        for line in path.read_text(encoding="utf-8").splitlines()
        if pattern.search(line)
    ]
    assert not offenders, offenders


def test_ci_runs_exactly_the_readme_test_command() -> None:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    command = 'python -m pip install -e ".[dev]" && python -m pytest'
    assert command in readme
    ci = (ROOT / ".ci" / "run").read_text(encoding="utf-8")
    assert any(line.strip() == command for line in ci.splitlines())
    assert '"$status" -eq 5' in ci, ".ci/run must fail when pytest ran no tests"


def test_auto_workers_are_one_per_cpu_and_one_more(monkeypatch: pytest.MonkeyPatch) -> None:
    """``-n auto`` gets a worker beyond the CPUs; the variable xdist honours still decides."""
    import conftest

    monkeypatch.delenv("PYTEST_XDIST_AUTO_NUM_WORKERS", raising=False)
    cpus = conftest.usable_cpus()
    if hasattr(os, "sched_getaffinity"):
        assert cpus == len(os.sched_getaffinity(0))
    assert conftest.pytest_xdist_auto_num_workers(cast(pytest.Config, None)) == cpus + 1
    monkeypatch.setenv("PYTEST_XDIST_AUTO_NUM_WORKERS", "5")
    assert conftest.pytest_xdist_auto_num_workers(cast(pytest.Config, None)) is None
