"""Checks added because mutation testing showed them missing (see stateful_tests/README.md).

Each asserts a behaviour a surviving mutant changed: the contradiction flag
of merging and combining evidence, the statuses derived for unfinished or
absent attempts, and that every refusal of a bad retry argument names what
was wrong. (Where the escape hatch's warning points is checked in
``test_input_validation.py``: mutmut's trampoline adds a stack frame.)
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest

from dataoad import ActionStatus, AttemptRecord, InvalidArgumentError, RetryPolicy
from dataoad._evidence import combine, merge_observations, settle

C, F, U = ActionStatus.CONFIRMED, ActionStatus.FAILED, ActionStatus.UNKNOWN


@pytest.mark.parametrize(
    ("statuses", "expected"),
    [([], (None, False)), ([U], (U, False)), ([U, U], (U, False)), ([C, F], (U, True))],
)
def test_merge_flags_a_contradiction_only_for_confirmed_against_failed(
    statuses: list[ActionStatus], expected: tuple[Any, bool]
) -> None:
    assert merge_observations(statuses) == expected


@pytest.mark.parametrize(
    ("attempts", "observed", "expected"),
    [
        (None, None, (U, False)),
        (F, None, (F, False)),
        (C, U, (C, False)),
        (None, C, (C, False)),
        (U, F, (F, False)),
        (C, C, (C, False)),
        (C, F, (U, True)),
    ],
)
def test_combine_flags_a_contradiction_only_for_opposite_evidence(
    attempts: ActionStatus | None, observed: ActionStatus | None, expected: tuple[Any, bool]
) -> None:
    assert combine(attempts, observed, False) == expected


def test_an_unfinished_attempt_counts_as_unknown_execution() -> None:
    started = datetime(2026, 1, 1, tzinfo=UTC)
    settlement = settle((AttemptRecord(number=1, started_at=started),), ())
    assert settlement.execution_status is U
    assert settlement.final_status is U


def test_no_attempts_and_no_observations_settle_without_error() -> None:
    settlement = settle((), ())
    assert settlement.verification_status is None
    assert settlement.final_status is U


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda: RetryPolicy(max_attempts="2"), "max_attempts must be an int, not str"),
        (lambda: RetryPolicy(max_attempts=0), "max_attempts must be >= 1, got 0"),
        (lambda: RetryPolicy(retry_on_failed=1), "retry_on_failed must be a bool, not int"),
        (
            lambda: RetryPolicy().should_retry("FAILED", 1, True),
            "status must be an ActionStatus, not str",
        ),
        (lambda: RetryPolicy().should_retry(F, 1.0, True), "attempts must be an int, not float"),
        (lambda: RetryPolicy().should_retry(F, 0, True), "attempts must be >= 1, got 0"),
        (
            lambda: RetryPolicy().should_retry(F, 1, 1),
            "failure_is_retryable must be a bool, not int",
        ),
    ],
)
def test_each_refusal_names_what_was_wrong(make: Any, message: str) -> None:
    with pytest.raises(InvalidArgumentError) as info:
        make()
    assert str(info.value) == message
