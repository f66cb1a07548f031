"""Cancellation after invocation leaves a safe barrier, never a silent retry."""

from __future__ import annotations

import asyncio

import pytest

from dataoad import ActionRunner, ActionStatus, ClaimState, InMemoryLedger


def test_cancelled_operation_is_recorded_unknown_and_cancellation_propagates() -> None:
    async def scenario() -> None:
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

    asyncio.run(scenario())
