"""A ledger read that fails during reconcile, recover_pending or release_unstarted
surfaces as ActionPersistenceError (never a raw driver error), on every backend.
"""

from __future__ import annotations

from typing import Any

import pytest

from dataoad import (
    ActionPersistenceError,
    ActionReceipt,
    ActionRunner,
    ActionStatus,
    VerificationResult,
)
from dataoad.testing import FaultyLedger, LedgerFault
from tests.support import REF, REQUEST, CountingOperation, closing

pytestmark = pytest.mark.asyncio


class LosingRaces(FaultyLedger):
    """Every conditional write loses its race (another writer got there first)."""

    def __init__(self, inner: Any) -> None:
        super().__init__(inner)
        self.losing = False

    async def record(self, receipt: ActionReceipt) -> bool:
        if self.losing:
            return False
        return await super().record(receipt)

    async def release(self, action_id: str, version: int) -> bool:
        if self.losing:
            return False
        return await super().release(action_id, version)


async def stranded(runner: ActionRunner, faulty: FaultyLedger, *, started: bool) -> str:
    """A PENDING claim: with one attempt started, or none."""
    if started:
        faulty.inject("record", LedgerFault.FAIL_BEFORE_WRITE)
    else:
        faulty.inject("start_attempt", LedgerFault.FAIL_BEFORE_WRITE)
        faulty.inject("get", LedgerFault.FAIL_BEFORE_WRITE)  # the start's read-back
    with pytest.raises(ActionPersistenceError) as raised:
        await runner.execute(
            "charge",
            CountingOperation(TimeoutError("lost")),
            request=REQUEST,
            idempotency_key="k",
            provider_reference=REF,
        )
    assert raised.value.action_id is not None
    return raised.value.action_id


def fail_the_second_get(faulty: FaultyLedger) -> None:
    """The first ``get`` (reading the receipt) works; the re-read after it fails."""
    gets = 0
    original = faulty._fault

    async def second_get_fails(method: str) -> LedgerFault | None:
        nonlocal gets
        if method == "get":
            gets += 1
            return LedgerFault.FAIL_BEFORE_WRITE if gets == 2 else None
        return await original(method)

    faulty._fault = second_get_fails  # type: ignore[method-assign]


def unknown(receipt: Any) -> VerificationResult:
    return VerificationResult.unknown(reason="read path down")


async def test_a_failed_re_read_after_a_lost_merge_race_in_reconcile(new_ledger: Any) -> None:
    ledger = new_ledger()
    faulty = LosingRaces(ledger)
    runner = ActionRunner(faulty)
    try:
        done = await runner.execute(
            "charge",
            CountingOperation(TimeoutError("lost")),
            request=REQUEST,
            idempotency_key="k",
            provider_reference=REF,
        )
        assert done.status is ActionStatus.UNKNOWN
        faulty.losing = True
        fail_the_second_get(faulty)
        with pytest.raises(ActionPersistenceError) as raised:
            await runner.reconcile(done.receipt.action_id, unknown)
        assert raised.value.operation_invoked is False
        assert "could not be re-read" in str(raised.value)
    finally:
        await closing(ledger)


async def test_a_failed_re_read_after_a_lost_race_in_recover_pending(new_ledger: Any) -> None:
    ledger = new_ledger()
    faulty = LosingRaces(ledger)
    runner = ActionRunner(faulty)
    try:
        action_id = await stranded(runner, faulty, started=True)
        faulty.losing = True
        fail_the_second_get(faulty)
        with pytest.raises(ActionPersistenceError) as raised:
            await runner.recover_pending(action_id, unknown)
        assert raised.value.operation_invoked is False
    finally:
        await closing(ledger)


async def test_a_failed_re_read_after_a_refused_release(new_ledger: Any) -> None:
    ledger = new_ledger()
    faulty = LosingRaces(ledger)
    runner = ActionRunner(faulty)
    try:
        action_id = await stranded(runner, faulty, started=False)
        faulty.losing = True
        fail_the_second_get(faulty)
        with pytest.raises(ActionPersistenceError) as raised:
            await runner.release_unstarted(action_id)
        assert raised.value.operation_invoked is False
        assert "nothing was released" in str(raised.value)
    finally:
        await closing(ledger)
