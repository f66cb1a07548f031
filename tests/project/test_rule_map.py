"""The rule map (``stateful_tests/RULES.md``) names only checks that exist.

A row that cites a renamed test, a property no machine has, or a planted bug
no one plants would say a rule is enforced when nothing enforces it.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
RULES = ROOT / "stateful_tests" / "RULES.md"

_TEST = re.compile(r"\b(tests/[\w/]+\.py)(?:::(\w+))?")
_CONTRACT = re.compile(r"\b(\w+Contract)::(\w+)")
_PLANTED = re.compile(r"planted ((?:[a-z0-9]+(?:-[a-z0-9]+)+)(?:, (?:[a-z0-9]+(?:-[a-z0-9]+)+))*)")
_PROPERTY = re.compile(r"`([a-z0-9]+(?:-[a-z0-9]+)+)`")


def _functions(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    return {
        n.name for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))
    }


def _machinery() -> str:
    return "\n".join(
        p.read_text(encoding="utf-8") for p in sorted((ROOT / "stateful_tests").glob("*.py"))
    )


def dangling(text: str, root: Path, machinery: str) -> list[str]:
    """Every reference in ``text`` (a rule map) that names nothing under ``root``."""
    missing = []
    for path, name in _TEST.findall(text):
        file = root / path
        if not file.is_file():
            missing.append(path)
        elif name and name not in _functions(file):
            missing.append(f"{path}::{name}")
    contracts = "\n".join(
        p.read_text(encoding="utf-8") for p in sorted((root / "dataoad" / "testing").glob("*.py"))
    )
    for cls, name in _CONTRACT.findall(text):
        if f"class {cls}" not in contracts or f"def {name}(" not in contracts:
            missing.append(f"{cls}::{name}")
    for listed in _PLANTED.findall(text):
        for bug in listed.split(", "):
            if not re.search(rf"(?<![\w-]){re.escape(bug)}(?![\w-])", machinery):
                missing.append(f"planted {bug}")
    for prop in set(_PROPERTY.findall(text)):
        snake = prop.replace("-", "_")
        if f'"{prop}"' not in machinery and f"def {snake}(" not in machinery:
            missing.append(f"`{prop}`")
    return sorted(set(missing))


def test_every_check_the_rule_map_cites_exists() -> None:
    assert dangling(RULES.read_text(encoding="utf-8"), ROOT, _machinery()) == []


def test_the_check_sees_dangling_references(tmp_path: Path) -> None:
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "test_a.py").write_text("def test_here():\n    pass\n")
    (tmp_path / "dataoad" / "testing").mkdir(parents=True)
    (tmp_path / "dataoad" / "testing" / "c.py").write_text(
        "class KContract:\n    def test_k(s): 0\n"
    )
    machinery = 'def one_winner_per_key(m): 0\nPlantedBug("bug-a", ...)\n'
    text = (
        "| x | tests/test_a.py::test_here; tests/test_a.py::test_gone; tests/test_b.py |\n"
        "| y | `one-winner-per-key`; `no-such-property`; planted bug-a, bug-b; KContract::test_k;"
        " KContract::test_gone |\n"
    )
    assert dangling(text, tmp_path, machinery) == [
        "KContract::test_gone",
        "`no-such-property`",
        "planted bug-b",
        "tests/test_a.py::test_gone",
        "tests/test_b.py",
    ]
