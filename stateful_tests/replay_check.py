"""Run a machine's search twice on one seed and name the first run whose choices differ.

Hypothesis reports ``FlakyStrategyDefinition`` when two runs that made the
same choices drew differently afterwards: something outside the choices
(thread timing, a clock) decided what a rule or precondition saw. It says
so only when it happens to retrace a prefix, and not where the runs parted.
This check makes it happen on purpose: the same seed twice in one process,
the choices of each run kept from its teardown, and the first pair that
differs shown with both runs' narratives (action ids and temporary paths
normalised, as they differ by design).

    python -m stateful_tests.replay_check stateful_tests.runner_machine:RunnerMachineSQLiteShared --examples 200 --seed 3
"""

from __future__ import annotations

import argparse
import difflib
import importlib
import re
import sys
from dataclasses import dataclass
from typing import Any

from hypothesis import settings
from hypothesis.stateful import RuleBasedStateMachine, run_state_machine_as_test

import stateful_tests.profiles  # noqa: F401  (the profiles, as the suite loads them)

__all__ = ["Parting", "first_parting", "main", "normalised"]

_FULL_ID = re.compile(r"\b[0-9a-f]{32}\b")
_SHORT_ID = re.compile(r"\b[0-9a-f]{8}\b")
_SCRATCH = re.compile(r"dataoad-machine-[a-z0-9_]+")


@dataclass(frozen=True)
class Parting:
    """The first run (by index) whose choices differed between the two searches."""

    index: int
    narratives: tuple[str, str]

    def diff(self) -> str:
        """Both runs' narratives as a unified diff."""
        first, second = (text.splitlines() for text in self.narratives)
        return "\n".join(difflib.unified_diff(first, second, lineterm="", n=4))


def normalised(text: str) -> str:
    """``text`` with action ids numbered by first appearance and scratch folders named alike."""
    ids: dict[str, str] = {}
    text = _FULL_ID.sub(lambda m: ids.setdefault(m.group(0), f"ID{len(ids)}"), text)
    short = {full[:8]: name for full, name in ids.items()}
    text = _SHORT_ID.sub(lambda m: short.get(m.group(0), m.group(0)), text)
    return _SCRATCH.sub("dataoad-machine-X", text)


def _choices_of_this_run() -> tuple[Any, ...]:
    # Hypothesis's stateful driver holds the run's ConjectureData as ``cd``.
    frame = sys._getframe(1)
    while frame is not None:
        data = frame.f_locals.get("cd")
        if data is not None and hasattr(data, "choices"):
            return tuple(data.choices)
        frame = frame.f_back  # type: ignore[assignment]
    raise RuntimeError("no Hypothesis run found on the stack (its internals changed?)")


@dataclass
class _Search:
    """What one search ran: each run's (choices, narrative), and how it ended."""

    runs: list[tuple[tuple[Any, ...], str]]
    ended: str = "ended"


def _search(machine: type[RuleBasedStateMachine], examples: int, seed: int) -> _Search:
    search = _Search([])

    class Recorded(machine):  # type: ignore[misc, valid-type]
        def teardown(self) -> None:
            try:
                history = getattr(self, "history", None)
                text = history.narrative() if history is not None else ""
                search.runs.append((_choices_of_this_run(), normalised(text)))
            finally:
                super().teardown()

    Recorded.__name__ = machine.__name__
    Recorded._hypothesis_internal_use_seed = seed
    # One failure is enough: after it Hypothesis keeps searching for others
    # for up to 10 s of its own clock, which would part the searches itself.
    once = settings(settings(), max_examples=examples, database=None, report_multiple_bugs=False)
    try:
        run_state_machine_as_test(Recorded, settings=once)
    except Exception as error:  # what ran before it still counts; how it ended is compared
        search.ended = f"raised {type(error).__name__}: {str(error).splitlines()[0][:200]}"
    return search


def first_parting(
    machine: type[RuleBasedStateMachine], *, examples: int, seed: int
) -> Parting | None:
    """Search ``machine`` twice with ``seed``; the first run whose choices differ, if any.

    Searches that ran a different number of runs, or ended differently,
    part where the shorter one stopped. Two searches that recorded no run
    at all are an error of this check, not a pass.
    """
    first = _search(machine, examples, seed)
    second = _search(machine, examples, seed)
    if not first.runs and not second.runs:
        raise RuntimeError(f"no run was recorded ({first.ended}; {second.ended})")
    for index, (one, other) in enumerate(zip(first.runs, second.runs, strict=False)):
        if one[0] != other[0]:
            return Parting(index, (one[1], other[1]))
    if len(first.runs) != len(second.runs) or first.ended != second.ended:
        index = min(len(first.runs), len(second.runs))
        return Parting(
            index,
            (
                f"{len(first.runs)} runs; the search {first.ended}",
                f"{len(second.runs)} runs; the search {second.ended}",
            ),
        )
    return None


def main(argv: list[str] | None = None) -> int:
    """Exit 1 and print the diff when the two searches parted, else 0."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("machine", help="module:Class of a RuleBasedStateMachine")
    parser.add_argument("--examples", type=int, default=200)
    parser.add_argument("--seed", type=int, default=0)
    arguments = parser.parse_args(argv)
    module, _, name = arguments.machine.partition(":")
    machine = getattr(importlib.import_module(module), name)
    parting = first_parting(machine, examples=arguments.examples, seed=arguments.seed)
    if parting is None:
        print(f"seed {arguments.seed}: the two searches made the same choices")
        return 0
    print(f"seed {arguments.seed}: the searches parted at run {parting.index}")
    print(parting.diff())
    return 1


if __name__ == "__main__":
    raise SystemExit(main())
