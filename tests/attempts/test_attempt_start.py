"""Attempt start: the attempt is counted durably before the operation runs, or nothing runs.

Attempt 1 of a new claim is counted by the claim itself (the fused claim:
see test_operation_counts); here, the starts that are writes of their own.
"""

from __future__ import annotations

import logging
from typing import Any, TypeVar

import pytest

from dataoad import (
    ActionPersistenceError,
    ActionReceipt,
    ActionRunner,
    ActionStatus,
    ClaimState,
    InMemoryLedger,
    VerificationResult,
)
from dataoad.testing import FaultyLedger, LedgerFault, ManualClock
from suite_support import (
    REF,
    REQUEST,
    CountingOperation,
    events,
    execute,
    fixed_verifier,
    refuse,
    unstarted,
)

T = TypeVar("T")


async def legacy_ledger() -> InMemoryLedger:
    """A ledger holding key "k" as an expired claim whose attempt 1 never started.

    The runner counts attempt 1 in the claim itself, so the one attempt start
    that can be a call's first is a takeover's of such a claim (left by a
    v0.1 runner): these tests exercise that write.
    """
    clock = ManualClock()
    ledger = InMemoryLedger(clock=clock)
    await unstarted(ledger, owner="v0.1-worker", lease=1.0)
    clock.advance(1.0)
    return ledger


FAIL = LedgerFault.FAIL_BEFORE_WRITE
LOSE = LedgerFault.LOSE_ACKNOWLEDGEMENT


@pytest.mark.parametrize("read_back_fails", [False, True])
async def test_an_unproven_attempt_start_carries_the_durable_claim(
    read_back_fails: bool, caplog: pytest.LogCaptureFixture
) -> None:
    ledger = FaultyLedger(await legacy_ledger())
    ledger.inject("start_attempt", FAIL)
    if read_back_fails:
        ledger.on_call = None
        original_get = ledger.get

        async def get(action_id: str) -> ActionReceipt | None:
            raise ConnectionError("read-back failed")

        ledger.get = get  # type: ignore[method-assign]
        del original_get
    op = CountingOperation("ok")
    with pytest.raises(ActionPersistenceError) as info:
        await execute(ActionRunner(ledger), op)
    error = info.value
    assert op.calls == 0
    assert error.operation_invoked is False
    # Either way the error carries the claim as durably stored: PENDING, no attempt.
    assert isinstance(error.receipt, ActionReceipt)
    assert error.receipt.claim_state is ClaimState.PENDING
    assert error.receipt.attempts == 0
    assert str(error).startswith(f"attempt 1 of action {error.receipt.action_id} could not")
    assert "injected: start_attempt failed before write" in str(error)
    (event, level, fields) = events(caplog)[-1]
    assert (event, level) == ("attempt_not_started", logging.WARNING)
    assert fields["attempt"] == 0


async def test_a_recovered_attempt_start_acknowledgement_is_logged(
    caplog: pytest.LogCaptureFixture,
) -> None:
    ledger = FaultyLedger(await legacy_ledger())
    ledger.inject("start_attempt", LOSE)
    result = await execute(ActionRunner(ledger))
    assert result.status is ActionStatus.CONFIRMED
    names = [(e, lvl) for e, lvl, _ in events(caplog)]
    assert names == [
        ("taken_over", logging.WARNING),
        ("attempt_start_acknowledgement_recovered", logging.INFO),
        ("attempt_started", logging.INFO),
        ("completed", logging.INFO),
    ]
    recovered = events(caplog)[1][2]
    assert recovered["attempt"] == 1


async def test_an_attempt_start_refused_by_the_ledger_carries_what_is_stored() -> None:
    inner = await legacy_ledger()
    ledger = FaultyLedger(inner)
    runner = ActionRunner(ledger)
    held: dict[str, ActionReceipt] = {}

    async def release_first(receipt: ActionReceipt, **lease: Any) -> bool:
        # Someone releases the claim between its creation and the attempt start.
        stored = await inner.find("charge", "k")
        assert stored is not None
        assert await inner.release(stored.action_id, stored.version)
        held["stored"] = stored
        return await inner.start_attempt(receipt, **lease)

    ledger.start_attempt = release_first  # type: ignore[method-assign]
    op = CountingOperation("ok")
    with pytest.raises(ActionPersistenceError) as info:
        await execute(runner, op)
    error = info.value
    assert op.calls == 0
    assert error.operation_invoked is False
    # Nothing is stored any more, so the error carries the claim it last knew.
    assert error.receipt == held["stored"]
    assert str(error).startswith(f"action {held['stored'].action_id} changed before attempt 1")


async def test_an_attempt_start_refused_carries_the_newer_stored_receipt() -> None:
    inner = await legacy_ledger()
    ledger = FaultyLedger(inner)

    ledger.start_attempt = refuse  # type: ignore[method-assign]
    with pytest.raises(ActionPersistenceError) as info:
        await execute(ActionRunner(ledger))
    stored = await inner.find("charge", "k")
    assert stored is not None
    assert info.value.receipt == stored
    assert info.value.operation_invoked is False
    assert str(info.value).startswith(f"action {stored.action_id} changed before attempt 1")


async def test_a_started_attempt_is_stored_numbered_with_the_callers_metadata() -> None:
    ledger = InMemoryLedger()
    faulty = FaultyLedger(ledger)
    faulty.inject("record", FAIL)
    with pytest.raises(ActionPersistenceError):
        await ActionRunner(faulty).execute(
            "charge",
            CountingOperation(),
            request=REQUEST,
            idempotency_key="k",
            provider_reference=REF,
            risk="financial",
            metadata={"ticket": "T-1"},
        )
    stored = await ledger.find("charge", "k")
    assert stored is not None
    assert stored.risk == "financial"
    assert stored.metadata == {"ticket": "T-1"}
    (attempt,) = stored.attempt_records
    assert attempt.number == 1
    assert stored.updated_at == attempt.started_at


async def test_a_retry_starts_with_the_earlier_observations_stored() -> None:
    from dataoad import RetryPolicy

    ledger = InMemoryLedger()
    faulty = FaultyLedger(ledger)
    faulty.inject("record", FAIL)
    runner = ActionRunner(faulty, policy=RetryPolicy(max_attempts=2, retry_on_failed=True))
    absent = VerificationResult.absent(verified_provider_reference=REF, retry_safe=True)
    with pytest.raises(ActionPersistenceError):
        await execute(
            runner,
            CountingOperation(TimeoutError("lost"), TimeoutError("lost")),
            verifier=fixed_verifier(absent, VerificationResult.unknown(reason="lag")),
        )
    stored = await ledger.find("charge", "k")
    assert stored is not None
    assert stored.attempts == 2
    observations = stored.metadata["verification_observations"]
    assert [o["attempt"] for o in observations] == [1]
    assert observations[0]["status"] == "FAILED"


async def test_an_attempt_start_error_carries_what_a_concurrent_writer_stored() -> None:
    from dataoad.testing._contract_receipts import started

    for raises in (True, False):
        inner = await legacy_ledger()
        ledger = FaultyLedger(inner)

        async def start_attempt(
            receipt: ActionReceipt,
            inner: InMemoryLedger = inner,
            raises: bool = raises,
            **lease: Any,
        ) -> bool:
            # Another worker (holding the same claim) starts its attempt first.
            previous = await inner.get(receipt.action_id)
            assert previous is not None
            assert await inner.start_attempt(started(previous, seconds=5))
            if raises:
                raise ConnectionError("write failed")
            return False

        ledger.start_attempt = start_attempt  # type: ignore[method-assign]
        op = CountingOperation()
        with pytest.raises(ActionPersistenceError) as info:
            await execute(ActionRunner(ledger), op)
        stored = await inner.find("charge", "k")
        assert op.calls == 0
        assert info.value.receipt == stored
        assert stored is not None
        assert stored.attempts == 1
        if not raises:
            assert str(info.value).endswith(
                "start (released or recovered concurrently, or a fenced worker's evidence that "
                "the effect may have happened merged in?); the operation was not invoked"
            )


async def test_a_refused_attempt_start_whose_read_back_fails_carries_the_claim() -> None:
    ledger = FaultyLedger(await legacy_ledger())
    ledger.start_attempt = refuse  # type: ignore[method-assign]
    ledger.inject("get", FAIL)
    with pytest.raises(ActionPersistenceError) as info:
        await execute(ActionRunner(ledger))
    assert isinstance(info.value.receipt, ActionReceipt)
    assert info.value.receipt.attempts == 0
    assert "changed before attempt 1 could start" in str(info.value)
