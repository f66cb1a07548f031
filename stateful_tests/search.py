"""How the planted-bug hunt searches: its settings and the machine for each bug.

Shared by ``test_planted_bugs.py`` and ``python -m stateful_tests.detection_rates``.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager

import pytest
from hypothesis import HealthCheck, settings
from hypothesis.internal.conjecture import engine
from hypothesis.stateful import run_state_machine_as_test

from stateful_tests.invariants import InvariantViolation
from stateful_tests.ledger_machine import LedgerMachineBase
from stateful_tests.merge_machine import MergeMachineBase
from stateful_tests.planted_bugs import PlantedBug, planted
from stateful_tests.profiles import PHASES
from stateful_tests.runner_machine import machine_for

__all__ = ["SEARCH", "SHRINK_SECONDS", "bounded_shrinking", "find_violation", "machine"]

#: Generous, because each search stops at the first counterexample anyway; and
#: derandomized, so CI reruns the same search and a green run stays green.
#: (Detection rates over fresh seeds are measured separately, not gated here.)
SEARCH = settings(
    phases=PHASES,
    max_examples=3000,
    derandomize=True,
    stateful_step_count=30,
    deadline=None,
    database=None,
    print_blob=False,
    report_multiple_bugs=False,
    # A planted bug may make most generated steps pointless (for example every
    # run ends early): that is the bug's doing, not a strategy problem.
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)
#: Shrinking seconds per bug. Finding takes under a few seconds; a full shrink
#: of a stateful run can take minutes, and a partly shrunk trace names the
#: same broken property. (Kept short: 25 bugs run in every CI job.)
SHRINK_SECONDS = 2


def machine(bug: PlantedBug, overrides: dict[str, object], backend: str = "memory") -> type:
    """The machine that hunts ``bug``; runner bugs on ``backend``'s ledger.

    The ledger machine always runs every embedded backend side by side.
    """
    if bug.machine == "runner":
        return machine_for(backend, **overrides)
    base = LedgerMachineBase if bug.machine == "ledger" else MergeMachineBase
    return type(f"{base.__name__}_{bug.name}", (base,), dict(overrides))


def find_violation(bug: PlantedBug, search: settings = SEARCH) -> tuple[InvariantViolation, float]:
    """Run the bug's machine until it fails; returns the violation and the seconds taken."""
    started = time.monotonic()
    with planted(bug) as overrides, pytest.raises(InvariantViolation) as info:
        run_state_machine_as_test(machine(bug, overrides, bug.backend or "memory"), settings=search)
    return info.value, time.monotonic() - started


@contextmanager
def bounded_shrinking(seconds: float = SHRINK_SECONDS) -> Iterator[None]:
    """Cap Hypothesis's shrinking time (its engine constant is the only knob)."""
    if not hasattr(engine, "MAX_SHRINKING_SECONDS"):
        yield
        return
    saved = engine.MAX_SHRINKING_SECONDS
    engine.MAX_SHRINKING_SECONDS = seconds
    try:
        yield
    finally:
        engine.MAX_SHRINKING_SECONDS = saved
