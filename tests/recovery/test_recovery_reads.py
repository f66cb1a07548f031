"""A ledger read that fails during reconcile, recover_pending or release_unstarted
surfaces as ActionPersistenceError (never a raw driver error), on every backend;
and each persistence error's class says what its caller must do.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from dataoad import (
    ActionPersistenceError,
    ActionReceipt,
    ActionRunner,
    ActionStatus,
    NothingInvokedError,
    VerificationResult,
)
from dataoad.testing import FaultyLedger, LedgerFault
from suite_support import REF, REQUEST, CountingOperation, closing, unstarted

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
    """A PENDING claim: with one attempt started, or none.

    The runner counts attempt 1 in the claim itself, so a claim with none
    started is one a v0.1 runner left: written straight to the ledger.
    """
    if not started:
        return (await unstarted(faulty.inner)).action_id
    faulty.inject("record", LedgerFault.FAIL_BEFORE_WRITE)
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
        with pytest.raises(NothingInvokedError) as raised:
            await runner.reconcile(done.receipt.action_id, unknown)
        error = raised.value
        assert error.operation_invoked is False
        assert str(error).startswith(
            f"the verification of action {done.receipt.action_id} lost a race and the receipt "
            "could not be re-read (LedgerFaultError: injected: get failed); nothing was invoked"
        )
        assert error.receipt == done.receipt  # the last one it safely saw
        assert error.observed_status is ActionStatus.UNKNOWN
        assert error.observed_metadata is not None
        assert error.observed_metadata["verification"]["reason"] == "read path down"
    finally:
        await closing(ledger)


async def test_a_failed_re_read_after_a_lost_race_in_recover_pending(new_ledger: Any) -> None:
    ledger = new_ledger()
    faulty = LosingRaces(ledger)
    runner = ActionRunner(faulty)
    try:
        action_id = await stranded(runner, faulty, started=True)
        before = await ledger.get(action_id)
        faulty.losing = True
        fail_the_second_get(faulty)
        with pytest.raises(NothingInvokedError) as raised:
            await runner.recover_pending(action_id, unknown)
        assert raised.value.operation_invoked is False
        # The race was lost and the re-read after it failed, not anything before it.
        assert str(raised.value) == (
            f"the verification of action {action_id} lost a race and the receipt could not be "
            "re-read (LedgerFaultError: injected: get failed); nothing was invoked"
        )
        assert raised.value.receipt == before  # the last one it safely saw
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
        before = await ledger.get(action_id)
        with pytest.raises(NothingInvokedError) as raised:
            await runner.release_unstarted(action_id)
        assert raised.value.operation_invoked is False
        assert str(raised.value) == (
            f"action {action_id} changed before it could be released, and it could not be "
            "re-read (LedgerFaultError: injected: get failed); nothing was released"
        )
        assert raised.value.receipt == before
    finally:
        await closing(ledger)


# -- what each persistence error tells its caller to do ---------------------------


@pytest.mark.parametrize(
    ("method", "fault", "read_back", "expected"),
    [
        # The claim is the first ledger call (the lookup is folded into it);
        # its read-back is by key. Lost or failed, with the read-back failing too.
        ("claim", LedgerFault.FAIL_BEFORE_WRITE, "find", "NothingInvokedError"),
        ("claim", LedgerFault.LOSE_ACKNOWLEDGEMENT, "find", "NothingInvokedError"),
        # A call's own first attempt start: taking over a legacy unstarted claim.
        ("start_attempt", LedgerFault.FAIL_BEFORE_WRITE, "get", "NothingInvokedError"),
        ("record", LedgerFault.FAIL_BEFORE_WRITE, "get", "OutcomeNotRecordedError"),
    ],
)
async def test_persistence_errors_are_named_by_what_the_caller_must_do(
    new_ledger: Any, method: str, fault: LedgerFault, read_back: str, expected: str
) -> None:
    import dataoad

    ledger = new_ledger()
    if method == "start_attempt":
        # Attempt 1 of a new claim is counted by the claim itself: the one first
        # attempt start left is the takeover's of an expired claim a v0.1 runner
        # left unstarted. (A real short lease: this fixture's ledgers take no clock.)
        await unstarted(ledger, provider_reference=None, owner="v0.1-worker", lease=0.01)
        await asyncio.sleep(0.1)
    faulty = FaultyLedger(ledger)
    faulty.inject(method, fault)
    faulty.inject(read_back, LedgerFault.FAIL_BEFORE_WRITE)  # the read-back fails too
    op = CountingOperation()
    try:
        with pytest.raises(ActionPersistenceError) as raised:
            await ActionRunner(faulty).execute("charge", op, request=REQUEST, idempotency_key="k")
    finally:
        await closing(ledger)
    assert faulty.pending_faults() == 0  # the faulted write and its read-back were both made
    error = raised.value
    assert type(error).__name__ == expected
    assert isinstance(error, getattr(dataoad, expected))
    # The class and the flag say the same thing, and both match what happened.
    assert error.operation_invoked is (expected == "OutcomeNotRecordedError")
    assert op.calls == (1 if error.operation_invoked else 0)


async def test_an_action_of_another_namespace_is_not_found_and_the_error_says_where() -> None:
    from dataoad import ActionNotFoundError, InMemoryLedger

    ledger = InMemoryLedger()
    done = await ActionRunner(ledger, namespace="tenant-a").execute(
        "charge", CountingOperation("ok"), request=REQUEST, idempotency_key="k"
    )
    action_id = done.receipt.action_id
    with pytest.raises(ActionNotFoundError) as elsewhere:
        await ActionRunner(ledger, namespace="tenant-b").receipt(action_id)
    assert str(elsewhere.value) == f"no action with id {action_id!r} in namespace 'tenant-b'"
    with pytest.raises(ActionNotFoundError) as default:
        await ActionRunner(ledger).receipt(action_id)
    assert str(default.value) == f"no action with id {action_id!r}"
    assert (await ActionRunner(ledger, namespace="tenant-a").receipt(action_id)) == done.receipt
