"""Run one crash scenario: a worker killed at a point, then a new worker's recovery.

Both are real processes, run as ``python -m <worker> CONFIG start|recover``
runs them (forked from one that imported the engine once:
``suite_support.worker_forks``); the first gets ``DATAOAD_CRASH_AT``. The
charges are read from the provider's file afterwards, so what the test sees
is what a customer's card saw.
"""

from __future__ import annotations

import dataclasses
import json
import os
import signal
from pathlib import Path
from typing import Any, Final

import pytest

from suite_support.payments_file import FilePayments
from suite_support.worker_forks import ForkedRun, run_forked
from tests.engines.crash_points import POINTS

__all__ = ["QUICK", "SAME_AS_ANOTHER", "CrashRun", "crash_matrix", "crash_scenarios", "run_crash"]

#: The one scenario per engine the quick loop keeps; the others are marked slow.
QUICK = ("after_commit", True)

#: Longest a worker may take (imports, engine start, a lease to run out).
WORKER_TIMEOUT = 120.0
ROOT = Path(__file__).resolve().parents[2]


#: Scenarios that would repeat another run for run: before the claim nothing
#: is stored, and after the outcome the receipt is settled, so a verifier is
#: never asked at either point. One of each pair is kept, with and without.
SAME_AS_ANOTHER: Final = frozenset({("before_claim", True), ("after_outcome", False)})


def crash_scenarios() -> list[tuple[str, bool]]:
    """Every (point, verifier) whose run differs from every other's."""
    return [
        (point, verifier)
        for point in POINTS
        for verifier in (True, False)
        if (point, verifier) not in SAME_AS_ANOTHER
    ]


def crash_matrix() -> list[Any]:
    """Every distinct (point, verifier) scenario as pytest parameters; all but ``QUICK`` are
    slow."""
    return [
        pytest.param(
            point,
            verifier,
            marks=[] if (point, verifier) == QUICK else [pytest.mark.slow],
            id=f"{point}-{'verifier' if verifier else 'no-verifier'}",
        )
        for point, verifier in crash_scenarios()
    ]


@dataclasses.dataclass(frozen=True)
class CrashRun:
    """What one scenario did: the first worker's end, the recovered outcome, the charges."""

    point: str
    first_returncode: int
    outcome: dict[str, Any]
    charges: list[tuple[str, str, int]]

    @property
    def killed(self) -> bool:
        """Whether the first worker died by SIGKILL (it reached its crash point)."""
        return self.first_returncode == -signal.SIGKILL


def _worker(module: str, config: Path, phase: str, env: dict[str, str]) -> ForkedRun:
    # Forked from a process that imported the engine once (see worker_forks):
    # a process of its own, killed alone at its crash point.
    return run_forked(module, [str(config), phase], env, ROOT, WORKER_TIMEOUT)


def run_crash(module: str, folder: Path, point: str, **config: Any) -> CrashRun:
    """Start the workflow in ``module`` dying at ``point``, recover it, count the charges."""
    settings = {
        "payments": str(folder / "payments.sqlite3"),
        "ledger": str(folder / "ledger.sqlite3"),
        "lease": 1.0,
        "workflow_id": "checkout-1",
        "order": "o-1",
        **config,
    }
    path = folder / "config.json"
    path.write_text(json.dumps(settings))
    env = {k: v for k, v in os.environ.items() if k != "DATAOAD_CRASH_AT"}
    first = _worker(module, path, "start", {**env, "DATAOAD_CRASH_AT": point})
    second = _worker(module, path, "recover", env)
    if second.returncode != 0 or not second.stdout.strip():
        raise AssertionError(
            f"the recovering worker failed ({second.returncode}):\n{second.stderr[-4000:]}\n"
            f"(the first worker: {first.returncode}, {first.stderr[-2000:]})"
        )
    outcome = json.loads(second.stdout.strip().splitlines()[-1])
    return CrashRun(point, first.returncode, outcome, FilePayments(settings["payments"]).charges())
