"""``python -m models``: bounded exhaustive checks of the protocol design.

Every scenario of the bound (``models.bounds``) is explored completely on
the abstract protocol (``models.abstract``, the design itself): every
interleaving of its contenders, every placement of up to ``fault budget``
faults (each provider fault, ledger fault and verifier answer, at every
gate), up to one crash at every point, and (in the lease scenarios) a
lease running out at every point. Exit 0 when nothing is
violated, 1 with the trace otherwise. The same scenarios on the real
ActionRunner: ``python -m stateful_tests.exhaustive``.

    python -m models                   # the default bound
    python -m models --bound large     # two faults per run, more scenarios
"""

from __future__ import annotations

import argparse
import functools
import time
from collections.abc import Sequence

from models.bounds import BOUNDS, LEASE_BOUNDS
from models.explore import ExplorationResult, explore, report, report_total


def run_abstract(bound: str, depth: int = 40) -> list[ExplorationResult]:
    """Explore every scenario of ``bound`` on the abstract protocol (``models.abstract``)."""
    from models.abstract import AbstractRun

    results = []
    for name, plans, faults, crashes in BOUNDS[bound]:
        result = explore(
            f"abstract protocol: {name}, {faults} fault(s), {crashes} crash(es)",
            functools.partial(AbstractRun, plans, faults, crashes),
            depth=depth,
        )
        results.append(result)
        if result.violation is not None:
            return results
    for name, plans, faults, crashes, expiries in LEASE_BOUNDS[bound]:
        result = explore(
            f"abstract protocol: {name}, {faults} fault(s), {crashes} crash(es), "
            f"{expiries} lease expiry(ies)",
            functools.partial(AbstractRun, plans, faults, crashes, expiries),
            depth=depth,
        )
        results.append(result)
        if result.violation is not None:
            break
    return results


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m models", description=__doc__.splitlines()[0])
    parser.add_argument("--bound", choices=sorted(BOUNDS), default="default")
    args = parser.parse_args(argv)
    started = time.monotonic()
    results = run_abstract(args.bound)
    ok = report(results)
    report_total(results, time.monotonic() - started)
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
