"""Print a pip constraints file pinning every direct dependency to its lower bound.

CI's second stage installs ``.[dev]`` with these constraints and runs the fast
tests, so a lower bound in pyproject.toml that is too loose fails CI. Every
requirement must therefore state a lower bound (``>=`` or ``==``); one that
does not is refused here, loudly.
"""

from __future__ import annotations

import re
import sys
import tomllib
from pathlib import Path

_REQUIREMENT = re.compile(r"^\s*([A-Za-z0-9][A-Za-z0-9._-]*)\s*(\[[^\]]*\])?\s*(.*)$")
_LOWER = re.compile(r"(?:>=|==)\s*([0-9][^,;\s]*)")


def lower_bounds(pyproject: Path) -> dict[str, str]:
    """Each direct requirement's name (normalised) and its lowest allowed version."""
    project = tomllib.loads(pyproject.read_text(encoding="utf-8"))["project"]
    requirements = list(project.get("dependencies", []))
    for extra in project.get("optional-dependencies", {}).values():
        requirements.extend(extra)
    bounds: dict[str, str] = {}
    for requirement in requirements:
        match = _REQUIREMENT.match(requirement.split(";")[0])
        if match is None:
            raise SystemExit(f"cannot read the requirement {requirement!r}")
        name = re.sub(r"[-_.]+", "-", match.group(1)).lower()
        if name == "dataoad":
            continue
        lower = _LOWER.search(match.group(3))
        if lower is None:
            raise SystemExit(f"{requirement!r} states no lower bound: add one (>= or ==)")
        version = lower.group(1)
        # Two extras may name one package: the higher lower bound is the one both allow.
        if name in bounds and _key(bounds[name]) >= _key(version):
            continue
        bounds[name] = version
    return bounds


def _key(version: str) -> tuple[int, ...]:
    return tuple(int(part) for part in re.findall(r"\d+", version))


def main() -> None:
    root = Path(__file__).resolve().parent.parent
    for name, version in sorted(lower_bounds(root / "pyproject.toml").items()):
        sys.stdout.write(f"{name}=={version}\n")


if __name__ == "__main__":
    main()
