"""Which rules a run leaves out: only the optional ones, and no run is wasted.

``stateful_tests.swarm.swarm_over`` replaces Hypothesis's swarm testing on
the runner and ledger machines. These tests pin what it promises: a run may
leave out only the rules named optional, each in some runs and not in
others; the machines' runs are not thrown away as invalid (with Hypothesis's
own swarm testing, 36% of the runner machine's were); and a name that is not
a rule is refused rather than silently ignored.
"""

from __future__ import annotations

from collections import Counter

import pytest
from hypothesis import HealthCheck, seed, settings
from hypothesis.stateful import RuleBasedStateMachine, rule, run_state_machine_as_test

from stateful_tests.ledger_machine import LedgerMachine
from stateful_tests.runner_machine import INTERFERENCE_RULES, RunnerMachineMemory
from stateful_tests.swarm import RulesThisRun, swarm_over

QUICK = settings(
    max_examples=60,
    stateful_step_count=20,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow],
)


def counted_runs(machine: type[RuleBasedStateMachine]) -> tuple[type, Counter[str]]:
    """A subclass of ``machine`` that counts its runs."""
    counts: Counter[str] = Counter()

    class Counted(machine):  # type: ignore[misc, valid-type]
        def __init__(self) -> None:
            super().__init__()
            counts["runs"] += 1

    Counted.__name__ = machine.__name__
    return Counted, counts


@pytest.fixture
def drawn_flags(monkeypatch: pytest.MonkeyPatch) -> Counter[str]:
    """Counts each rule left out by the ``RulesThisRun`` a run draws (once per run)."""
    left: Counter[str] = Counter()
    original = RulesThisRun.__init__

    def counting(self: RulesThisRun, left_out: frozenset[str]) -> None:
        left.update(left_out)
        left["(draws)"] += 1
        original(self, left_out)

    monkeypatch.setattr(RulesThisRun, "__init__", counting)
    return left


@pytest.mark.parametrize(
    ("machine", "optional"),
    [
        (RunnerMachineMemory, INTERFERENCE_RULES),
        (LedgerMachine, LedgerMachine.optional_rules),
    ],
    ids=["runner", "ledger"],
)
def test_runs_leave_out_only_optional_rules_and_none_is_thrown_away(
    machine: type[RuleBasedStateMachine], optional: tuple[str, ...], drawn_flags: Counter[str]
) -> None:
    cls, counts = counted_runs(machine)
    run_state_machine_as_test(seed(7)(cls), settings=QUICK)
    draws = drawn_flags.pop("(draws)", 0)
    # Our flags are what the rule strategy draws: once in (nearly) every run.
    assert draws >= 0.9 * counts["runs"], (draws, counts)
    assert set(drawn_flags) <= set(optional), f"left out: {set(drawn_flags) - set(optional)}"
    # Each optional rule is left out of some runs (about a quarter), not all.
    for name in optional:
        assert 0 < drawn_flags[name] < draws, (name, drawn_flags)
    # Hypothesis counts only valid runs towards max_examples: with its own
    # swarm testing the runner machine needed 2.1 runs per counted example.
    assert counts["runs"] <= 1.3 * QUICK.max_examples, counts


class OneRule(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        swarm_over(self, ("no_such_rule",))

    @rule()
    def the_rule(self) -> None:
        pass


def test_a_name_that_is_not_a_rule_is_refused() -> None:
    with pytest.raises(ValueError, match="no_such_rule"):
        OneRule()
