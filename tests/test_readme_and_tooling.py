"""The README's example runs as written; the type checker and linter are clean."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def python_blocks() -> list[str]:
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    return re.findall(r"```python\n(.*?)```", text, flags=re.DOTALL)


def test_readme_thirty_second_example_runs_as_written(tmp_path: Path) -> None:
    blocks = [b for b in python_blocks() if "asyncio.run(main())" in b]
    assert blocks, "README lost its runnable example"
    script = tmp_path / "example.py"
    script.write_text(blocks[0], encoding="utf-8")
    done = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, cwd=tmp_path, check=False
    )
    assert done.returncode == 0, done.stderr


def _tool(name: str) -> list[str]:
    if shutil.which(name) is None:
        pytest.fail(f"{name} is not installed; install the dev extra")
    return [name]


def test_mypy_strict_is_clean() -> None:
    done = subprocess.run(
        [*_tool("mypy"), "--strict", "dataoad"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        check=False,
    )
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


def test_ci_runs_exactly_the_readme_test_command() -> None:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    command = 'python -m pip install -e ".[dev]" && python -m pytest'
    assert command in readme
    ci = (ROOT / ".ci" / "run").read_text(encoding="utf-8")
    assert any(line.strip() == command for line in ci.splitlines())
    assert '"$status" -eq 5' in ci, ".ci/run must fail when pytest ran no tests"
