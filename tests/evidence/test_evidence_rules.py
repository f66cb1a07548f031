"""The pure evidence rules: merging, combining and settling what attempts and verifiers established."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest

from dataoad import ActionStatus, AttemptRecord
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


def test_trimming_observations_looks_past_one_it_must_keep() -> None:
    """``keep_observations`` drops, oldest first, every observation that proves nothing
    more; one that decides the status is kept, and the next one is still considered."""
    from dataoad._evidence import keep_observations
    from dataoad._records import ObservationSource, VerificationObservation

    at = datetime(2026, 1, 1, tzinfo=UTC)
    attempts = [AttemptRecord(number=1, started_at=at, execution_status=ActionStatus.UNKNOWN)]

    def seen(status: ActionStatus, number: int) -> VerificationObservation:
        return VerificationObservation(
            source=ObservationSource.RECONCILE,
            attempt=1,
            status=status,
            observed_at=at,
            provider_request_id="p1" if status is ActionStatus.CONFIRMED else None,
            number=number,
        )

    deciding = seen(ActionStatus.CONFIRMED, 1)
    nothing_more = seen(ActionStatus.UNKNOWN, 2)
    newest = seen(ActionStatus.UNKNOWN, 3)
    kept = keep_observations(attempts, (deciding, nothing_more, newest), limit=2)
    assert kept == (deciding, newest)
    assert settle(attempts, kept) == settle(attempts, (deciding, nothing_more, newest))
