"""Every planted bug is found, and the shrunk trace names the property it breaks."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest
from hypothesis import HealthCheck, settings
from hypothesis.internal.conjecture import engine
from hypothesis.stateful import run_state_machine_as_test

from stateful_tests.invariants import InvariantViolation
from stateful_tests.planted_bugs import PLANTED_BUGS, PlantedBug, planted
from stateful_tests.test_ledger_machine import LedgerMachineBase
from stateful_tests.test_merge_machine import MergeMachineBase
from stateful_tests.test_runner_machine import machine_for

#: Generous, because each search stops at the first counterexample anyway; and
#: derandomized, so CI reruns the same search and a green run stays green.
#: (Detection rates over fresh seeds are measured separately, not gated here.)
SEARCH = settings(
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
SHRINK_SECONDS = 5


@pytest.fixture(autouse=True)
def _bounded_shrinking(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    # Hypothesis has no public knob for this; its engine constant is the knob.
    if hasattr(engine, "MAX_SHRINKING_SECONDS"):
        monkeypatch.setattr(engine, "MAX_SHRINKING_SECONDS", SHRINK_SECONDS)
    return


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


@pytest.mark.parametrize("bug", PLANTED_BUGS, ids=lambda b: b.name)
def test_planted_bug_is_found_and_named(bug: PlantedBug) -> None:
    """The machine finds the bug; the violated property is one that states its rule."""
    violation, _ = find_violation(bug)
    assert violation.name in bug.expected, (
        f"{bug.name} was reported as {violation.name}, expected one of {sorted(bug.expected)}"
    )
    assert f"invariant {violation.name} broken" in str(violation)


def test_the_correct_code_passes_the_same_search() -> None:
    """The search that finds every planted bug finds nothing in the real code."""
    run_state_machine_as_test(machine_for("memory"), settings=settings(SEARCH, max_examples=300))
