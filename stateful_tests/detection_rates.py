"""``python -m stateful_tests.detection_rates``: how reliably each planted bug is found.

For every planted bug, run its machine under the ``ci`` profile with fresh
seeds (10 by default) and report how many seeds found it, and the median
time and number of steps to the first shrunk counterexample. Shrinking is
capped like in ``test_planted_bugs.py``. ``--markdown`` prints the table for
``stateful_tests/README.md``.
"""

from __future__ import annotations

import argparse
import re
import statistics
import time
from typing import Any

from hypothesis import seed, settings
from hypothesis.internal.conjecture import engine
from hypothesis.stateful import run_state_machine_as_test

import conftest  # noqa: F401  (registers the Hypothesis profiles)
from models.real_runner import quiet_hypothesis
from stateful_tests.invariants import InvariantViolation
from stateful_tests.planted_bugs import PLANTED_BUGS, PlantedBug, planted
from stateful_tests.test_planted_bugs import SHRINK_SECONDS, machine

STEP = re.compile(r"^\s*\d+\. ", re.M)


def one_seed(bug: PlantedBug, n: int) -> tuple[bool, float, int]:
    """(found, seconds, steps in the shrunk trace) for one seed."""
    ci = settings.get_profile("ci")
    started = time.monotonic()
    with planted(bug) as overrides:
        cls = seed(n)(machine(bug, overrides))
        try:
            run_state_machine_as_test(
                cls, settings=settings(ci, print_blob=False, report_multiple_bugs=False)
            )
        except InvariantViolation as violation:
            return True, time.monotonic() - started, len(STEP.findall(str(violation)))
        except Exception as exc:  # for example Hypothesis's flakiness report: not a find
            print(f"  {bug.name}, seed {n}: {type(exc).__name__}", flush=True)
    return False, time.monotonic() - started, 0


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m stateful_tests.detection_rates")
    parser.add_argument("--seeds", type=int, default=10)
    parser.add_argument("--bugs", nargs="*", help="planted bug names (default: all)")
    parser.add_argument("--markdown", action="store_true")
    args = parser.parse_args()
    engine.MAX_SHRINKING_SECONDS = SHRINK_SECONDS  # type: ignore[attr-defined]
    rows: list[tuple[Any, ...]] = []
    with quiet_hypothesis():
        for bug in PLANTED_BUGS:
            if args.bugs and bug.name not in args.bugs:
                continue
            runs = [one_seed(bug, n) for n in range(args.seeds)]
            found = [r for r in runs if r[0]]
            median_s = statistics.median(r[1] for r in found) if found else float("nan")
            median_steps = statistics.median(r[2] for r in found) if found else float("nan")
            rows.append((bug.name, bug.machine, len(found), args.seeds, median_s, median_steps))
            print(
                f"{bug.name:<44} {bug.machine:<7} found {len(found):>2}/{args.seeds}  "
                f"median {median_s:5.1f} s, {median_steps:4.0f} steps",
                flush=True,
            )
    if args.markdown:
        print("\n| planted bug | machine | found | median time | median steps |")
        print("| --- | --- | ---: | ---: | ---: |")
        for name, kind, hits, total, secs, steps in rows:
            print(f"| `{name}` | {kind} | {hits}/{total} | {secs:.1f} s | {steps:.0f} |")


if __name__ == "__main__":
    main()
