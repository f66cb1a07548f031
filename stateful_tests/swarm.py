"""Which rules each run of a state machine may leave out (our swarm testing).

Shared by the runner and ledger machines.
"""

from __future__ import annotations

from typing import Any

from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine

__all__ = ["RulesThisRun", "swarm_over"]


class RulesThisRun:
    """Which rules one run uses: every rule but those it leaves out."""

    def __init__(self, left_out: frozenset[str]) -> None:
        self.left_out = left_out

    def is_enabled(self, name: str) -> bool:
        return name not in self.left_out

    def __repr__(self) -> str:
        return f"RulesThisRun(left_out={sorted(self.left_out)})"


def swarm_over(machine: RuleBasedStateMachine, optional: tuple[str, ...]) -> None:
    """Let each run of ``machine`` leave out only ``optional`` rules, each with probability 1/4.

    This replaces Hypothesis's swarm testing, which leaves a random subset
    of *all* rules out of each run. On the runner machine that included the
    rules that move parked contenders on: a run then stuck after its first
    three starts and was thrown away as invalid (36% of runs), and many
    others never reached a provider call. Leaving out only kinds of
    interference keeps what swarm testing is for (a run without crashes or
    operators lets a holder and its waiters go deep) without runs that cannot
    progress. Shrinking puts left-out rules back. Measured in
    stateful_tests/README.md ("Which rules a run leaves out").

    Hypothesis has no setting for this: its rule strategy draws the flags
    from ``enabled_rules_strategy`` (anything with ``is_enabled(name)``). If a
    release renames that attribute this raises, rather than silently
    searching differently.
    """
    strategy: Any = machine._rules_strategy
    if not hasattr(strategy, "enabled_rules_strategy"):
        raise RuntimeError(
            "this Hypothesis release no longer draws rule flags from "
            "RuleStrategy.enabled_rules_strategy: update stateful_tests.swarm.swarm_over"
        )
    names = {rule.function.__name__ for rule in strategy.rules}
    unknown = set(optional) - names
    if unknown:
        raise ValueError(f"no such rules in {type(machine).__name__}: {sorted(unknown)}")
    left_out = st.tuples(*(st.sampled_from([False, False, False, True]) for _ in optional)).map(
        lambda leave: frozenset(n for n, out in zip(optional, leave, strict=True) if out)
    )
    strategy.enabled_rules_strategy = st.shared(
        left_out.map(RulesThisRun), key="rules this run leaves out"
    )
