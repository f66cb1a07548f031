"""The triage file of reviewed survivors, and the mutated code each review read.

``mutation_equivalents.txt`` holds one line per survivor reviewed as
equivalent: its name, a tab, why it cannot change a safety-relevant
behaviour, a tab, the code the mutant puts in. A review counts only while
the mutant still puts in that code.
"""

from __future__ import annotations

import dataclasses
import subprocess
from pathlib import Path

EQUIVALENTS = Path(__file__).with_name("mutation_equivalents.txt")


@dataclasses.dataclass(frozen=True)
class Triage:
    """One reviewed survivor: why it is equivalent, and the mutated code that review read."""

    reason: str
    mutated: str | None


def reviewed(path: Path = EQUIVALENTS) -> dict[str, Triage]:
    """The triage file: ``name<TAB>reason[<TAB>mutated code]`` per line."""
    if not path.exists():
        return {}
    triaged = {}
    for line in path.read_text().splitlines():
        if line and not line.startswith("#"):
            name, reason, *mutated = line.split("\t")
            triaged[name] = Triage(reason, mutated[0] if mutated else None)
    return triaged


def mutated_code(workspace: Path, name: str, env: dict[str, str]) -> str:
    """The lines mutant ``name`` puts in, as ``mutmut show`` prints them, joined by " | "."""
    shown = subprocess.run(
        ["mutmut", "show", name],
        cwd=workspace,
        env=env,
        check=False,
        capture_output=True,
        text=True,
    ).stdout
    return " | ".join(
        line[1:].strip()
        for line in shown.splitlines()
        if line.startswith("+") and not line.startswith("+++")
    )


def stale_triage(known: dict[str, Triage], shown: dict[str, str]) -> dict[str, str]:
    """Triaged survivors whose mutated code is not the code their review read, with why.

    Mutants are numbered per function, so an edit renumbers them; a triage
    kept by number alone once excused two mutants that broke the SQL (the
    contract suite kills them). A review counts only for the mutation it read.
    """
    stale = {}
    for name, code in shown.items():
        recorded = known[name].mutated
        if recorded is None:
            stale[name] = "its triage records no mutated code"
        elif recorded != code:
            stale[name] = f"its triage was written for `{recorded}`, this mutant puts in `{code}`"
    return stale


def record_mutated_code(workspace: Path, env: dict[str, str]) -> int:
    """Write each triage's mutated code, read from ``workspace``, where it has none yet."""
    known = reviewed()
    lines = []
    added = 0
    for line in EQUIVALENTS.read_text().splitlines():
        name = line.split("\t", 1)[0]
        if line and not line.startswith("#") and known[name].mutated is None:
            code = mutated_code(workspace, name, env)
            if code:
                line = f"{line}\t{code}"
                added += 1
        lines.append(line)
    EQUIVALENTS.write_text("\n".join(lines) + "\n")
    return added
