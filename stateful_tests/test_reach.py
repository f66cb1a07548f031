"""The reach check itself fails when a rule never runs or a pair is never reached."""

from __future__ import annotations

import pytest
from hypothesis import settings
from hypothesis.stateful import RuleBasedStateMachine, precondition

from stateful_tests.harness import REACHED
from stateful_tests.reach import reach_checked, rule

_QUICK = settings(max_examples=20, stateful_step_count=5, database=None, deadline=None)
# Hypothesis starts from small runs and swarm testing leaves rules out of
# each run: 20 runs of 5 steps missed one of eight rules in about 1 of 15
# tests (measured on CI too), so the test that everything is reached gets
# 100 runs of 10 steps and two more rounds: no miss in 300 tests.
_AMPLE = settings(max_examples=100, stateful_step_count=10, database=None, deadline=None)


class _Toy(RuleBasedStateMachine):
    """Eight rules that always run, and one whose precondition is never true."""

    @rule()
    def a(self) -> None:
        REACHED[("gate", "reached")] += 1

    @rule()
    def b(self) -> None: ...

    @rule()
    def c(self) -> None: ...

    @rule()
    def d(self) -> None: ...

    @rule()
    def e(self) -> None: ...

    @rule()
    def f(self) -> None: ...

    @rule()
    def g(self) -> None: ...

    @rule()
    def h(self) -> None: ...

    @precondition(lambda self: False)
    @rule()
    def never(self) -> None: ...


def test_a_rule_that_never_runs_and_a_pair_never_reached_are_named() -> None:
    case = reach_checked(
        _Toy,
        _QUICK,
        pairs=lambda: {("gate", "reached"), ("gate", "never")},
        round_=_QUICK,
        more_rounds=2,
    )
    with pytest.raises(AssertionError) as failed:
        case().runTest()
    assert "never reached in 60 examples: ['rule never', 'gate: never']" in str(failed.value)


def test_everything_reached_passes() -> None:
    class Reachable(_Toy):
        never = None  # type: ignore[assignment]

    case = reach_checked(
        Reachable, _AMPLE, pairs=lambda: {("gate", "reached")}, round_=_AMPLE, more_rounds=2
    )
    case().runTest()
