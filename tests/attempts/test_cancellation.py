"""Cancellation after invocation leaves a safe barrier, never a silent retry."""

from __future__ import annotations

import asyncio
from typing import TypeVar

import pytest

from dataoad import (
    ActionRunner,
    ActionStatus,
    ClaimState,
    InMemoryLedger,
    VerificationResult,
)
from suite_support import REF, REQUEST, execute, fixed_verifier, reached

T = TypeVar("T")


async def test_cancelled_operation_is_recorded_unknown_and_cancellation_propagates() -> None:
    ledger = InMemoryLedger()
    runner = ActionRunner(ledger)
    entered = asyncio.Event()
    calls = 0

    async def slow() -> None:
        nonlocal calls
        calls += 1
        entered.set()
        await asyncio.sleep(60)

    task = asyncio.create_task(runner.execute("a", slow, request={}, idempotency_key="k"))
    await entered.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    [receipt] = ledger.snapshot()
    assert receipt.claim_state is ClaimState.COMPLETED
    assert receipt.final_status is ActionStatus.UNKNOWN
    replay = await runner.execute("a", slow, request={}, idempotency_key="k")
    assert replay.status is ActionStatus.UNKNOWN
    assert calls == 1


async def test_a_cancelled_attempt_is_recorded_completed_unknown_with_its_evidence() -> None:
    ledger = InMemoryLedger()
    runner = ActionRunner(ledger)
    started = asyncio.Event()

    async def slow() -> None:
        started.set()
        await asyncio.sleep(3600)

    task = asyncio.create_task(
        runner.execute(
            "charge",
            slow,
            request=REQUEST,
            idempotency_key="k",
            provider_reference=REF,
            metadata={"ticket": "T-1"},
        )
    )
    await started.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    stored = await ledger.find("charge", "k")
    assert stored is not None
    assert stored.claim_state is ClaimState.COMPLETED
    assert stored.version == 2  # the fused claim (attempt 1 counted), then UNKNOWN
    assert stored.execution_status is ActionStatus.UNKNOWN
    assert stored.final_status is ActionStatus.UNKNOWN
    assert stored.verification_status is None
    assert stored.error == "CancelledError: cancelled after the operation was invoked"
    assert stored.metadata == {"ticket": "T-1"}
    (attempt,) = stored.attempt_records
    assert attempt.execution_status is ActionStatus.UNKNOWN
    assert attempt.error == "CancelledError: cancelled after the operation was invoked"
    assert attempt.retry_decision == "stop"
    assert attempt.finished_at is not None
    assert stored.updated_at >= attempt.finished_at


async def test_a_cancelled_attempt_keeps_the_observations_of_earlier_attempts() -> None:
    from dataoad import RetryPolicy

    ledger = InMemoryLedger()
    runner = ActionRunner(ledger, policy=RetryPolicy(max_attempts=2, retry_on_failed=True))
    retrying = asyncio.Event()
    calls = 0

    async def op() -> None:
        nonlocal calls
        calls += 1
        if calls == 1:
            raise TimeoutError("lost")
        retrying.set()
        await asyncio.sleep(3600)

    absent = VerificationResult.absent(verified_provider_reference=REF, retry_safe=True)
    task = asyncio.create_task(execute(runner, op, verifier=fixed_verifier(absent)))
    await reached(retrying, task)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    stored = await ledger.find("charge", "k")
    assert stored is not None
    assert stored.claim_state is ClaimState.COMPLETED
    assert stored.attempts == 2
    first, second = stored.attempt_records
    assert first.verification_status is ActionStatus.FAILED
    assert first.retry_decision == "retry"
    assert second.execution_status is ActionStatus.UNKNOWN
    assert stored.execution_status is ActionStatus.UNKNOWN
    assert stored.final_status is ActionStatus.UNKNOWN
    assert [o["attempt"] for o in stored.metadata["verification_observations"]] == [1]
    assert stored.metadata["verification_conflict"] is False
