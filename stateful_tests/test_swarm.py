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
from stateful_tests.swarm import swarm_over

QUICK = settings(
    max_examples=60,
    stateful_step_count=20,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow],
)


def counted(machine: type[RuleBasedStateMachine]) -> tuple[type, Counter[str]]:
    """A subclass of ``machine`` that counts its runs and the rules each run left out."""
    counts: Counter[str] = Counter()

    class Counted(machine):  # type: ignore[misc, valid-type]
        def __init__(self) -> None:
            super().__init__()
            counts["runs"] += 1

        def teardown(self) -> None:
            # The rule strategy draws the run's flags at its first step.
            flags = self._rules_strategy._feature_flags
            if flags is not None:
                counts.update(f"left out {name}" for name in flags.left_out)
            super().teardown()

    Counted.__name__ = machine.__name__
    return Counted, counts


@pytest.mark.parametrize(
    ("machine", "optional"),
    [
        (RunnerMachineMemory, INTERFERENCE_RULES),
        (LedgerMachine, LedgerMachine.optional_rules),
    ],
    ids=["runner", "ledger"],
)
def test_runs_leave_out_only_optional_rules_and_none_is_thrown_away(
    machine: type[RuleBasedStateMachine], optional: tuple[str, ...]
) -> None:
    cls, counts = counted(machine)
    run_state_machine_as_test(seed(7)(cls), settings=QUICK)
    left_out = {k.removeprefix("left out ") for k in counts if k.startswith("left out ")}
    assert left_out <= set(optional), f"left out rules that must stay: {left_out - set(optional)}"
    # Each optional rule is left out of some runs (about a quarter), not all.
    for name in optional:
        assert 0 < counts[f"left out {name}"] < counts["runs"], (name, counts)
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
