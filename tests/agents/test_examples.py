"""Each agent example runs offline and prints exactly the output in its docstring."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.agents.support import framework

ROOT = Path(__file__).resolve().parents[2]
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
    assert done.stdout.strip() == expected_output(path)
    assert not re.search(r"[0-9a-f]{32}", done.stdout)
