"""The outcome: what a finished attempt records, and what happens when the outcome write fails."""

from __future__ import annotations

import logging
from typing import Any

import pytest

from dataoad import (
    ActionPersistenceError,
    ActionRunner,
    ActionStatus,
    InMemoryLedger,
    VerificationResult,
)
from dataoad.testing import FaultyLedger, LedgerFault
from suite_support import (
    REF,
    REQUEST,
    CountingOperation,
    confirmed,
    events,
    execute,
    fixed_verifier,
    refuse,
)

C, F, U = ActionStatus.CONFIRMED, ActionStatus.FAILED, ActionStatus.UNKNOWN

FAIL = LedgerFault.FAIL_BEFORE_WRITE
LOSE = LedgerFault.LOSE_ACKNOWLEDGEMENT


async def test_a_finished_attempt_record_keeps_its_number_error_and_confirmed_request_id() -> None:
    ledger = InMemoryLedger()
    verifier = fixed_verifier(confirmed(rid="pr_9"))
    result = await execute(
        ActionRunner(ledger), CountingOperation(TimeoutError("lost")), verifier=verifier
    )
    (attempt,) = result.receipt.attempt_records
    assert attempt.number == 1
    assert attempt.error is not None
    assert "TimeoutError" in attempt.error
    assert attempt.provider_request_id == "pr_9"
    assert attempt.finished_at is not None
    assert attempt.execution_status is ActionStatus.UNKNOWN
    assert attempt.verification_status is ActionStatus.CONFIRMED
    assert result.receipt.provider_request_id == "pr_9"


async def test_an_attempt_confirmed_by_nothing_records_no_request_id() -> None:
    absent = VerificationResult.absent(verified_provider_reference=REF, retry_safe=True)
    result = await execute(
        ActionRunner(InMemoryLedger()),
        CountingOperation(TimeoutError("lost")),
        verifier=fixed_verifier(absent),
    )
    (attempt,) = result.receipt.attempt_records
    assert attempt.verification_status is ActionStatus.FAILED
    assert attempt.provider_request_id is None


@pytest.mark.parametrize(
    ("answer", "status", "value"),
    [
        ("charged", ActionStatus.CONFIRMED, "charged"),
        (TimeoutError("lost"), ActionStatus.UNKNOWN, None),
    ],
)
async def test_an_unrecorded_outcome_says_the_operation_ran_and_what_was_seen(
    answer: Any, status: ActionStatus, value: Any, caplog: pytest.LogCaptureFixture
) -> None:
    ledger = FaultyLedger(InMemoryLedger())
    ledger.inject("record", FAIL)
    with pytest.raises(ActionPersistenceError) as info:
        await execute(ActionRunner(ledger), CountingOperation(answer))
    error = info.value
    assert error.operation_invoked is True
    assert error.observed_status is status
    # A failed call has no value to expose, and none is made up.
    assert error.value_available is (value is not None)
    assert error.observed_value == value
    assert "injected: record failed before write" in str(error)
    event, level, fields = events(caplog)[-1]
    assert (event, level) == ("outcome_not_recorded", logging.ERROR)
    assert fields["observed_status"] == status.value
    assert fields["action_id"]
    assert fields["attempt"] == 1


async def test_an_outcome_refused_by_the_ledger_names_the_concurrent_change() -> None:
    ledger = FaultyLedger(InMemoryLedger())

    ledger.record = refuse  # type: ignore[method-assign]
    with pytest.raises(ActionPersistenceError) as info:
        await execute(ActionRunner(ledger), CountingOperation(None))
    assert "(the claim changed concurrently)" in str(info.value)
    assert info.value.value_available is True
    assert info.value.observed_value is None


async def test_a_lost_outcome_acknowledgement_is_logged_as_recovered(
    caplog: pytest.LogCaptureFixture,
) -> None:
    ledger = FaultyLedger(InMemoryLedger())
    ledger.inject("record", LOSE)
    result = await execute(ActionRunner(ledger))
    assert result.status is ActionStatus.CONFIRMED
    assert [e for e, _, _ in events(caplog)][-2:] == [
        "outcome_acknowledgement_recovered",
        "completed",
    ]


async def test_an_unrecorded_outcome_tells_the_operator_not_to_repeat_it() -> None:
    ledger = FaultyLedger(InMemoryLedger())
    ledger.inject("record", FAIL)
    with pytest.raises(ActionPersistenceError) as info:
        await execute(ActionRunner(ledger))
    assert str(info.value).endswith(
        "The operation WAS invoked: do not repeat it. Re-read the ledger; a PENDING claim "
        "needs read-only recover_pending"
    )


async def test_persistence_error_carries_final_not_execution_status() -> None:
    inner = InMemoryLedger()
    faulty = FaultyLedger(inner)
    r = ActionRunner(faulty)
    faulty.inject("record", LedgerFault.FAIL_BEFORE_WRITE)
    with pytest.raises(ActionPersistenceError) as info:
        await r.execute(
            "a",
            CountingOperation(TimeoutError()),
            request=REQUEST,
            idempotency_key="k",
            provider_reference=REF,
            verifier=fixed_verifier(confirmed(rid="pr_1")),
        )
    e = info.value
    assert e.observed_status is C
    assert e.observed_metadata is not None
    assert e.observed_metadata["verification"]["status"] == "CONFIRMED"
    assert tuple(e.observed_metadata["provider_request_ids"]) == ("pr_1",)
