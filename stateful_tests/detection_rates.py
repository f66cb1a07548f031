"""``python -m stateful_tests.detection_rates``: how reliably each planted bug is found.

For every planted bug, run its machine under the ``ci`` profile, at the budget
CI gives that machine on memory, with fresh seeds (10 by default) and report how many seeds found it; the median time to
the first counterexample (the first failing run, before any shrinking, machine
set-up included); and the median time to, and number of steps in, the shrunk
counterexample Hypothesis reports (shrinking runs to Hypothesis's own
limit; ``--no-shrink`` stops at the first counterexample, like
``test_planted_bugs.py``). ``--markdown`` prints the table for
``stateful_tests/LOG.md``.
"""

from __future__ import annotations

import argparse
import math
import re
import statistics
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, NamedTuple

from hypothesis import Phase, seed, settings
from hypothesis.stateful import run_state_machine_as_test

import stateful_tests.profiles  # noqa: F401  (registers and loads the Hypothesis profiles)
from dataoad import SQLiteLedger
from stateful_tests.exhaustive import quiet_hypothesis
from stateful_tests.harness import IN_MEMORY_RUNNER_FACTOR
from stateful_tests.planted import PlantedBug
from stateful_tests.planted_bugs import PLANTED_BUGS, planted
from stateful_tests.search import machine
from stateful_tests.violations import InvariantViolation

STEP = re.compile(r"^\s*\d+\. ", re.M)


class Run(NamedTuple):
    """One seed's search for one planted bug."""

    found: bool
    first_seconds: float  # to the first failing run, before shrinking
    shrunk_seconds: float  # to the reported, shrunk counterexample
    steps: int  # numbered steps in the shrunk counterexample


@contextmanager
def first_violation_clock() -> Iterator[list[float]]:
    """Record when each property violation is raised (the first one is the find)."""
    stamps: list[float] = []
    original = InvariantViolation.__init__

    def stamped(self: InvariantViolation, name: str, detail: str) -> None:
        stamps.append(time.monotonic())
        original(self, name, detail)

    InvariantViolation.__init__ = stamped  # type: ignore[method-assign]
    try:
        yield stamps
    finally:
        InvariantViolation.__init__ = original  # type: ignore[method-assign]


def ledgers(bug: PlantedBug, backend: str) -> str:
    """The ledgers the bug's machine drives."""
    if bug.machine == "ledger":
        return "memory+sqlite"
    if bug.machine == "shared":
        return "sqlite, shared"
    return (bug.backend or backend) if bug.machine == "runner" else "memory"


def runs_on(bug: PlantedBug, backend: str) -> bool:
    """Whether the bug exists on ``backend``: a broken in-memory ledger has no SQLite form.

    On PostgreSQL only the runner machine's bugs that plant no ledger class
    are hunted: the others are a broken in-memory or SQLite ledger, or not the
    runner machine's, and their tables are the memory and SQLite runs.
    """
    with planted(bug) as overrides:
        ledger = overrides.get("ledger_class")
    if backend == "postgres":
        return bug.machine == "runner" and bug.backend is None and ledger is None
    if bug.backend is not None:
        return True  # it exists on one backend only, and is always hunted there
    return (
        bug.machine != "runner"
        or ledger is None
        or backend == "memory"
        or issubclass(ledger, SQLiteLedger)
    )


def one_seed(
    bug: PlantedBug, n: int, backend: str, max_examples: int | None = None, shrink: bool = True
) -> Run:
    """Search for ``bug`` with seed ``n`` under the ci profile, at its machine's CI budget.

    The runner machine's bugs get the in-memory runner machine's budget
    (``IN_MEMORY_RUNNER_FACTOR`` times the profile's), on either backend; the
    shared-connection machine's the profile's, as CI gives it.
    """
    ci = settings.get_profile("ci")
    if bug.machine == "runner":
        ci = settings(ci, max_examples=ci.max_examples * IN_MEMORY_RUNNER_FACTOR)
    if max_examples is not None:
        ci = settings(ci, max_examples=max_examples)
    if not shrink:
        ci = settings(ci, phases=[p for p in Phase if p is not Phase.shrink])
    started = time.monotonic()
    with planted(bug) as overrides, first_violation_clock() as stamps:
        cls = seed(n)(machine(bug, overrides, bug.backend or backend))
        try:
            run_state_machine_as_test(
                cls, settings=settings(ci, print_blob=False, report_multiple_bugs=False)
            )
        except InvariantViolation as violation:
            now = time.monotonic()
            return Run(True, stamps[0] - started, now - started, len(STEP.findall(str(violation))))
        except Exception as exc:  # for example Hypothesis's flakiness report: not a find
            print(f"  {bug.name}, seed {n}: {type(exc).__name__}", flush=True)
    return Run(False, math.nan, time.monotonic() - started, 0)


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m stateful_tests.detection_rates")
    parser.add_argument("--seeds", type=int, default=10)
    parser.add_argument("--bugs", nargs="*", help="planted bug names (default: all)")
    parser.add_argument(
        "--backend",
        choices=["memory", "sqlite", "postgres"],
        default="memory",
        help="the ledger under the runner machine (the ledger machine runs memory and SQLite; "
        "PostgreSQL needs a server: DATAOAD_TEST_POSTGRES_DSN, or PostgreSQL's binaries)",
    )
    parser.add_argument(
        "--max-examples", type=int, help="override the ci profile's budget (for experiments)"
    )
    parser.add_argument(
        "--no-shrink",
        action="store_true",
        help="stop at the first counterexample (detection only; steps are then unshrunk)",
    )
    parser.add_argument("--markdown", action="store_true")
    args = parser.parse_args()
    rows: list[tuple[Any, ...]] = []
    with quiet_hypothesis():
        for bug in PLANTED_BUGS:
            if args.bugs and bug.name not in args.bugs:
                continue
            if not runs_on(bug, args.backend):
                why = (
                    "not hunted there"
                    if args.backend == "postgres"
                    else "it plants a broken in-memory ledger"
                )
                print(f"{bug.name:<44} not on {args.backend}: {why}")
                continue
            runs = [
                one_seed(bug, n, args.backend, args.max_examples, not args.no_shrink)
                for n in range(args.seeds)
            ]
            found = [r for r in runs if r.found]

            def median(values: list[float]) -> float:
                return statistics.median(values) if values else math.nan

            first = median([r.first_seconds for r in found])
            shrunk = median([r.shrunk_seconds for r in found])
            steps = median([r.steps for r in found])
            rows.append(
                (bug.name, ledgers(bug, args.backend), len(found), args.seeds, first, shrunk, steps)
            )
            print(
                f"{bug.name:<44} {ledgers(bug, args.backend):<13} found {len(found):>2}/{args.seeds}  "
                f"median first {first:5.2f} s, shrunk {shrunk:5.1f} s, {steps:4.0f} steps",
                flush=True,
            )
    if args.markdown:
        print(
            "\n| planted bug | ledger | found | median to first | median to shrunk | median steps |"
        )
        print("| --- | --- | ---: | ---: | ---: | ---: |")
        for name, backend, hits, total, first, shrunk, steps in rows:
            print(
                f"| `{name}` | {backend} | {hits}/{total} | {first:.2f} s | {shrunk:.1f} s "
                f"| {steps:.0f} |"
            )


if __name__ == "__main__":
    main()
