"""The replay check names a machine whose draws depend on more than its choices."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, precondition, rule

from stateful_tests import replay_check
from stateful_tests.replay_check import first_parting

#: State outside the choices: how many runs of the machine below came before.
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
    """A precondition reads how many runs came before: true only in the first search's first runs."""

    def __init__(self) -> None:
        super().__init__()
        self.run = next(_RUNS)

    @precondition(lambda self: self.run < 3)
    @rule(n=st.integers(0, 3))
    def sometimes(self, n: int) -> None:
        self.total += n


def test_a_machine_whose_draws_follow_its_choices_does_not_part() -> None:
    assert first_parting(_Steady, examples=30, seed=5) is None


def test_a_precondition_reading_outside_state_parts_the_searches() -> None:
    global _RUNS
    _RUNS = itertools.count()
    parting = first_parting(_Swayed, examples=30, seed=5)
    # The rule is enabled in the first search's first three runs alone.
    assert parting is not None
    assert parting.index < 3, parting


def test_a_search_that_records_nothing_is_an_error_not_a_pass(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def lost() -> tuple[object, ...]:
        raise RuntimeError("no Hypothesis run found on the stack")

    monkeypatch.setattr(replay_check, "_choices_of_this_run", lost)
    with pytest.raises(RuntimeError, match="no run was recorded"):
        first_parting(_Steady, examples=5, seed=5)


def test_ids_and_scratch_folders_are_normalised_alike() -> None:
    one = replay_check.normalised(
        "claim 0123456789abcdef0123456789abcdef (01234567) in /tmp/dataoad-machine-ab_1"
    )
    other = replay_check.normalised(
        "claim fedcba9876543210fedcba9876543210 (fedcba98) in /tmp/dataoad-machine-zz9"
    )
    assert one == other == "claim ID0 (ID0) in /tmp/dataoad-machine-X"
