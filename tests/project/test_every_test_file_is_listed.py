"""Every test file is in its README's map of what lives where, so a newcomer can find it."""

from __future__ import annotations

import fnmatch
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _named_in(readme: Path) -> list[str]:
    """Every file name or glob the README writes in backticks."""
    return re.findall(r"`([A-Za-z0-9_*./-]+\.py)`", readme.read_text(encoding="utf-8"))


def _unlisted(folder: Path) -> list[str]:
    names = _named_in(folder / "README.md")
    unlisted = []
    for path in sorted(folder.rglob("test_*.py")):
        relative = path.relative_to(folder).as_posix()
        if not any(
            fnmatch.fnmatch(relative, name) or fnmatch.fnmatch(path.name, name) for name in names
        ):
            unlisted.append(relative)
    return unlisted


def test_every_example_test_file_is_in_the_tests_readme() -> None:
    assert _unlisted(ROOT / "tests") == []


def test_every_state_machine_test_file_is_in_the_stateful_readme() -> None:
    assert _unlisted(ROOT / "stateful_tests") == []


def test_the_check_sees_a_missing_file(tmp_path: Path) -> None:
    (tmp_path / "README.md").write_text("| claims | `test_claims.py`, `test_pg_*.py` |\n")
    for name in ("test_claims.py", "test_pg_faults.py", "test_forgotten.py"):
        (tmp_path / name).write_text("")
    assert _unlisted(tmp_path) == ["test_forgotten.py"]
