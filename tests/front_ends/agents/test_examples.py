"""Each agent example runs offline and prints exactly the output in its docstring."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from suite_support.agents import framework

ROOT = Path(__file__).resolve().parents[3]
EXAMPLES = {
    "pydantic_ai_charge.py": ("pydantic_ai", "pydantic-ai"),
    "openai_agents_charge.py": ("agents", "openai-agents"),
    "langgraph_charge.py": ("langgraph", "langgraph"),
    "mcp_charge.py": ("mcp", "mcp"),
}


def expected_output(path: Path) -> str:
    docstring = path.read_text().split('"""')[1]
    block = docstring.split("Expected output:\n\n", 1)[1]
    return "\n".join(line.removeprefix("    ") for line in block.strip("\n").splitlines())


@pytest.mark.parametrize("name", sorted(EXAMPLES))
def test_example_prints_its_documented_output(name: str) -> None:
    framework(*EXAMPLES[name])
    path = ROOT / "examples" / "agents" / name
    done = subprocess.run(
        [sys.executable, str(path)], capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 0, done.stderr
    # Real action ids and a real ledger path are printed; the docstring
    # shows them as placeholders.
    ids = set(re.findall(r"[0-9a-f]{32}", done.stdout))
    assert len(ids) == 1, ids  # the retry replayed the same action
    command = done.stdout.strip().splitlines()[-1].removeprefix("see the receipt: ").split()
    ledger = command[-1].removeprefix("sqlite://")
    normalised = done.stdout.replace(ids.pop(), "<action-id>").replace(ledger, "<ledger>")
    assert normalised.strip() == expected_output(path)
    # The printed command works, and shows the settled receipt.
    assert command[:3] == ["dataoad", "receipts", "show"]
    shown = subprocess.run(
        [sys.executable, "-m", "dataoad", *command[1:]],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert shown.returncode == 0, shown.stderr
    assert "CONFIRMED" in shown.stdout
    shutil.rmtree(Path(ledger).parent, ignore_errors=True)


def test_importing_the_shop_leaves_no_folder_behind(tmp_path: Path) -> None:
    # ``dataoad check`` imports an example without running it: no receipt is
    # written, so the folder kept for inspecting receipts must not stay.
    done = subprocess.run(
        [sys.executable, "-c", "import examples.agents._shop as shop; print(shop.LEDGER)"],
        cwd=ROOT,
        env={**os.environ, "TMPDIR": str(tmp_path)},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert Path(done.stdout.strip()).parent.parent == tmp_path
    assert list(tmp_path.iterdir()) == []
