"""The replay check names a machine whose draws depend on more than its choices."""

from __future__ import annotations

import itertools

from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, precondition, rule

from stateful_tests.replay_check import first_parting, normalised

#: State outside the choices: it moves on with every run of the machine below.
_RUNS = itertools.count()


class _Steady(RuleBasedStateMachine):
    """Every draw depends on the choices alone."""

    def __init__(self) -> None:
        super().__init__()
        self.total = 0

    @rule(n=st.integers(0, 3))
    def add(self, n: int) -> None:
        self.total += n

    @precondition(lambda self: self.total > 2)
    @rule(n=st.integers(0, 3))
    def take(self, n: int) -> None:
        self.total -= n


class _Swayed(_Steady):
    """A precondition reads how many runs came before: the second search draws otherwise."""

    def __init__(self) -> None:
        super().__init__()
        self.run = next(_RUNS)

    @precondition(lambda self: self.run % 7 == 3)
    @rule(n=st.integers(0, 3))
    def sometimes(self, n: int) -> None:
        self.total += n


def test_a_machine_whose_draws_follow_its_choices_does_not_part() -> None:
    assert first_parting(_Steady, examples=30, seed=5) is None


def test_a_precondition_reading_outside_state_parts_the_searches() -> None:
    parting = first_parting(_Swayed, examples=30, seed=5)
    assert parting is not None


def test_ids_and_scratch_folders_are_normalised_alike() -> None:
    one = normalised(
        "claim 0123456789abcdef0123456789abcdef (01234567) in /tmp/dataoad-machine-ab_1"
    )
    other = normalised(
        "claim fedcba9876543210fedcba9876543210 (fedcba98) in /tmp/dataoad-machine-zz9"
    )
    assert one == other == "claim ID0 (ID0) in /tmp/dataoad-machine-X"
