"""``python -m models``: bounded exhaustive checks of the protocol and the real runner.

Every scenario below is explored completely: every interleaving of its
contenders, every placement of up to ``fault budget`` faults (each provider
fault, ledger fault and verifier answer, at every gate), and up to one
crash at every point: first on the abstract protocol (``models.abstract``,
the design itself), then on the real ActionRunner with InMemoryLedger
through the deterministic scheduler of the state machines. Exit 0 when
nothing is violated, 1 with the trace otherwise.

    python -m models                   # the default bound (the test suite runs it)
    python -m models --bound large     # two faults per run, more scenarios
    python -m models --planted all     # each planted bug must be found
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

from models.explore import ContenderPlan, ExplorationResult, explore

P = ContenderPlan
RETRYING, ESCAPE = "retry-failed", "retry-unknown (escape hatch)"

#: name -> [(scenario, contenders, fault budget per run, crashes per run)]
BOUNDS: dict[str, list[tuple[str, list[ContenderPlan], int, int]]] = {
    "default": [
        ("2 contenders, 1 key", [P("order-1"), P("order-1")], 1, 1),
        (
            "2 contenders, 1 key, retrying policy and no verifier",
            [P("order-1", policy=RETRYING), P("order-1", with_verifier=False)],
            1,
            1,
        ),
        ("2 contenders, 2 keys", [P("order-1"), P("order-2")], 1, 1),
        (
            "3 contenders, 1 key, one an operator's recovery",
            [P("order-1"), P("order-1"), P("order-1", kind="recover")],
            1,
            0,
        ),
        ("1 contender, 2 faults", [P("order-1")], 2, 1),
        ("1 contender, escape-hatch policy, 2 faults", [P("order-1", policy=ESCAPE)], 2, 0),
        (
            "an execute and an operator's release",
            [P("order-1"), P("order-1", kind="release")],
            1,
            1,
        ),
        (
            "a duplicate that waits for the claim holder",
            [P("order-1"), P("order-1", wait="wait 0 s")],
            1,
            1,
        ),
        (
            "1 contender, retrying policy, 3 faults",
            [P("order-1", policy=RETRYING, with_verifier=False)],
            3,
            0,
        ),
        (
            "3 contenders, 1 key, the same request written three ways",
            [
                P("order-1"),
                P("order-1", form="keys reversed"),
                P("order-1", form="amount as float"),
            ],
            0,
            0,
        ),
        # The largest, last: a planted bug is usually found before it.
        ("3 contenders, 2 keys", [P("order-1"), P("order-2"), P("order-1")], 1, 0),
    ],
}
BOUNDS["large"] = [
    *[(name, plans, faults + 1, 1) for name, plans, faults, _ in BOUNDS["default"]],
    (
        "3 contenders, 1 key, escape-hatch policy",
        [P("order-1", policy=ESCAPE), P("order-1"), P("order-1", kind="reconcile")],
        1,
        1,
    ),
]


def _build(
    plans: Sequence[ContenderPlan], faults: int, crashes: int, overrides: dict[str, Any]
) -> Callable[[], Any]:
    from models.real_runner import RealRunnerRun

    return lambda: RealRunnerRun(plans, fault_budget=faults, crashes=crashes, overrides=overrides)


def run_real(
    bound: str, overrides: dict[str, Any] | None = None, depth: int = 40
) -> list[ExplorationResult]:
    """Explore every scenario of ``bound`` on the real runner; stops at the first violation."""
    from models.real_runner import quiet_hypothesis

    results = []
    with quiet_hypothesis():
        for name, plans, faults, crashes in BOUNDS[bound]:
            result = explore(
                f"real runner: {name}, {faults} fault(s), {crashes} crash(es)",
                _build(plans, faults, crashes, overrides or {}),
                depth=depth,
            )
            results.append(result)
            if result.violation is not None:
                break
    return results


def run_abstract(bound: str, depth: int = 40) -> list[ExplorationResult]:
    """Explore every scenario of ``bound`` on the abstract protocol (``models.abstract``)."""
    from models.abstract import AbstractRun

    results = []
    for name, plans, faults, crashes in BOUNDS[bound]:
        result = explore(
            f"abstract protocol: {name}, {faults} fault(s), {crashes} crash(es)",
            lambda plans=plans, faults=faults, crashes=crashes: AbstractRun(plans, faults, crashes),
            depth=depth,
        )
        results.append(result)
        if result.violation is not None:
            break
    return results


def report(results: Sequence[ExplorationResult]) -> bool:
    """Print each exploration; True when none found a violation."""
    for r in results:
        rate = r.steps / r.seconds if r.seconds else 0.0
        print(
            f"{r.label}: {r.states} distinct states, {r.schedules} schedules, "
            f"{r.steps} steps in {r.seconds:.1f} s ({rate:.0f} steps/s)"
        )
        if r.violation is not None:
            print(f"\nVIOLATION of {r.violation.name}: {r.violation.detail}")
            print(f"Run ({len(r.actions)} actions):\n{r.violation.trace}")
            return False
    return True


#: Planted bugs of the ledger and merge machines that the runner explorer
#: cannot reach, and why; their own machines find them.
OUT_OF_REACH = {
    "non-atomic-claim": "the race is inside one ledger call; the scheduler gates between calls",
    "first-writer-wins-merge": "losing an observation is judged by the merge machine's model",
    "latest-observation-wins": "losing an observation is judged by the merge machine's model",
    "memory-record-ignores-version": "a ledger-level bug: the ledger machine compares with the model",
    "memory-starts-attempts-on-completed-claims": "a ledger-level bug (the ledger machine)",
    "memory-claim-always-created": "a ledger-level bug (the ledger machine)",
    "sqlite-record-reopens-completed-claims": "a SQLite bug; this explorer runs InMemoryLedger",
    "sqlite-releases-started-claims": "a SQLite bug; this explorer runs InMemoryLedger",
    "sqlite-lock-wait-unbounded": "a SQLite bug; this explorer runs InMemoryLedger",
    "observations-truncated-oldest-first": "losing an observation is judged by the merge machine",
    "sync-operation-on-the-loop": "this explorer's operations are async; the runner machine has sync ones",
}


def planted(names: list[str]) -> int:
    """Run the default bound against each planted bug; each must be found."""
    from stateful_tests.planted_bugs import PLANTED_BUGS
    from stateful_tests.planted_bugs import planted as plant

    chosen = [b for b in PLANTED_BUGS if "all" in names or b.name in names]
    if not chosen:
        print(f"no planted bug named {', '.join(names)}", file=sys.stderr)
        return 2
    missed = 0
    for bug in chosen:
        if bug.name in OUT_OF_REACH:
            print(f"{bug.name:<40} out of this explorer's reach: {OUT_OF_REACH[bug.name]}")
            continue
        started = time.monotonic()
        with plant(bug) as overrides:
            results = run_real("default", overrides)
        found = next((r.violation for r in results if r.violation is not None), None)
        seconds = time.monotonic() - started
        verdict = "NOT FOUND"
        if found is not None:
            verdict = f"found as {found.name}"
            if found.name not in bug.expected:
                verdict += f" (expected {', '.join(sorted(bug.expected))})"
                missed += 1
        print(f"{bug.name:<40} {verdict} in {seconds:.1f} s")
        missed += found is None
    return 1 if missed else 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m models", description=__doc__.splitlines()[0])
    parser.add_argument("--bound", choices=sorted(BOUNDS), default="default")
    parser.add_argument("--planted", nargs="+", metavar="NAME", help="planted bug names, or all")
    args = parser.parse_args(argv)
    if args.planted:
        return planted(args.planted)
    started = time.monotonic()
    results = run_abstract(args.bound)
    ok = report(results)
    if ok:
        real = run_real(args.bound)
        ok = report(real)
        results += real
    print(
        f"\ntotal: {sum(r.states for r in results)} distinct states, "
        f"{sum(r.schedules for r in results)} schedules, {sum(r.steps for r in results)} steps "
        f"in {time.monotonic() - started:.1f} s"
    )
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
