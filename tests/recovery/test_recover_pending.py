"""recover_pending: a stranded PENDING claim completed from read-only evidence, never by invoking again."""

from __future__ import annotations

import dataclasses
from typing import TypeVar

import pytest

from dataoad import (
    ActionPersistenceError,
    ActionReceipt,
    ActionRunner,
    ActionStatus,
    ClaimState,
    InMemoryLedger,
    RecoveryRefusedError,
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
    fenced_absent,
    fixed_verifier,
    stranded,
    stranded_pending,
)

C, F, U = ActionStatus.CONFIRMED, ActionStatus.FAILED, ActionStatus.UNKNOWN
T = TypeVar("T")
FAIL = LedgerFault.FAIL_BEFORE_WRITE
CONFIRMED, FAILED, UNKNOWN = ActionStatus.CONFIRMED, ActionStatus.FAILED, ActionStatus.UNKNOWN


@pytest.mark.parametrize(
    ("verification", "expected"),
    [
        (confirmed(), CONFIRMED),
        (fenced_absent(), FAILED),
        (VerificationResult.absent(verified_provider_reference=REF), UNKNOWN),
        (VerificationResult.unknown(reason="down"), UNKNOWN),
        (RuntimeError("boom"), UNKNOWN),
    ],
)
async def test_recover_pending_completes_with_what_evidence_supports(
    verification: object, expected: ActionStatus
) -> None:
    inner, action_id, op = await stranded_pending(attempted=True)
    result = await ActionRunner(inner).recover_pending(action_id, fixed_verifier(verification))
    assert result.status is expected
    assert result.receipt.claim_state is ClaimState.COMPLETED
    assert result.receipt.metadata["recovery"]["method"] == "recover_pending"
    assert op.calls == 1


async def test_recover_pending_unknown_can_be_reconciled_later() -> None:
    inner, action_id, _ = await stranded_pending(attempted=True)
    runner = ActionRunner(inner)
    first = await runner.recover_pending(
        action_id, fixed_verifier(VerificationResult.unknown(reason="x"))
    )
    assert first.status is UNKNOWN
    second = await runner.reconcile(action_id, fixed_verifier(confirmed()))
    assert second.status is CONFIRMED


async def test_recover_pending_refuses_unstarted_claims() -> None:
    inner, action_id, op = await stranded_pending(attempted=False)
    with pytest.raises(RecoveryRefusedError, match="release_unstarted"):
        await ActionRunner(inner).recover_pending(action_id, fixed_verifier(confirmed()))
    assert op.calls == 0


async def test_recover_pending_settles_a_completed_unknown_and_leaves_a_settled_one() -> None:
    ledger = InMemoryLedger()
    runner = ActionRunner(ledger)
    unknown_result = await execute(runner, CountingOperation(TimeoutError("lost")), key="u")
    settled = await execute(runner, key="c")
    verifier = fixed_verifier(confirmed())
    recovered = await runner.recover_pending(unknown_result.receipt.action_id, verifier)
    assert recovered.status is ActionStatus.CONFIRMED
    assert recovered.replayed is False
    assert recovered.receipt.metadata["verification"]["source"] == "reconcile"
    assert "recovery" not in recovered.receipt.metadata
    again = await runner.recover_pending(settled.receipt.action_id, verifier)
    assert again.receipt == settled.receipt
    assert len(verifier.calls) == 1  # type: ignore[attr-defined]


async def test_recovering_a_stranded_claim_records_how_and_keeps_caller_metadata() -> None:
    inner = InMemoryLedger()
    faulty = FaultyLedger(inner)
    faulty.inject("record", FAIL)
    with pytest.raises(ActionPersistenceError) as info:
        await ActionRunner(faulty).execute(
            "charge",
            CountingOperation("ok"),
            request=REQUEST,
            idempotency_key="k",
            provider_reference=REF,
            metadata={"ticket": "T-1"},
        )
    assert info.value.receipt is not None
    action_id = info.value.receipt.action_id
    recovered = await ActionRunner(inner).recover_pending(action_id, fixed_verifier(confirmed()))
    metadata = recovered.receipt.metadata
    assert recovered.replayed is False
    assert recovered.status is ActionStatus.CONFIRMED
    assert metadata["ticket"] == "T-1"
    assert metadata["recovery"]["method"] == "recover_pending"
    assert metadata["recovery"]["attempts"] == 1
    assert metadata["verification"]["source"] == "recover"
    assert recovered.receipt.provider_request_id == "pr_1"
    # Reconciling later keeps both the caller's metadata and the recovery note.
    later = await ActionRunner(inner).reconcile(action_id, fixed_verifier(confirmed()))
    assert later.receipt.metadata["ticket"] == "T-1"
    assert later.receipt.metadata["recovery"] == metadata["recovery"]
    # Settled already: the receipt is the earlier one, unchanged (API.md's replayed).
    assert later.replayed is True
    assert later.receipt == recovered.receipt


async def test_reconciling_an_inconclusive_recovery_keeps_its_recovery_note(
    caplog: pytest.LogCaptureFixture,
) -> None:
    ledger = InMemoryLedger()
    stuck = await stranded(ledger)
    runner = ActionRunner(ledger)
    lagging = VerificationResult.unknown(reason="lagging")
    recovered = await runner.recover_pending(stuck.action_id, fixed_verifier(lagging))
    assert recovered.status is ActionStatus.UNKNOWN
    note = recovered.receipt.metadata["recovery"]
    later = await runner.reconcile(stuck.action_id, fixed_verifier(confirmed()))
    assert later.status is ActionStatus.CONFIRMED
    assert later.replayed is False
    assert later.receipt.metadata["recovery"] == note
    assert len(later.receipt.metadata["verification_observations"]) == 2
    settled = [
        (e, f["action_id"]) for e, _, f in events(caplog) if e in ("recovered", "reconciled")
    ]
    assert [e for e, _ in settled] == ["recovered", "reconciled"]


async def test_a_recovery_refuses_when_the_worker_starts_another_attempt_meanwhile() -> None:
    from dataoad.testing._contract_receipts import started

    ledger = InMemoryLedger()
    stuck = await stranded(ledger)

    async def verifier(receipt: ActionReceipt) -> VerificationResult:
        # The "dead" worker was alive after all: it starts attempt 2.
        assert await ledger.start_attempt(started(receipt))
        return confirmed()

    with pytest.raises(RecoveryRefusedError) as info:
        await ActionRunner(ledger).recover_pending(stuck.action_id, verifier)
    assert info.value.receipt == await ledger.get(stuck.action_id)
    assert info.value.receipt is not None
    assert info.value.receipt.attempts == 2
    assert str(info.value).endswith(
        "its worker is still active, so this observation is out of date"
    )


async def test_recover_pending_refuses_if_new_attempt_starts_during_verification() -> None:
    inner = InMemoryLedger()
    faulty = FaultyLedger(inner)
    faulty.inject("record", LedgerFault.FAIL_BEFORE_WRITE)
    with pytest.raises(ActionPersistenceError) as info:
        await ActionRunner(faulty).execute(
            "a",
            CountingOperation(TimeoutError()),
            request=REQUEST,
            idempotency_key="k",
            provider_reference=REF,
        )
    assert info.value.receipt is not None
    aid = info.value.receipt.action_id

    async def verify(receipt: ActionReceipt) -> VerificationResult:
        cur = await inner.get(aid)
        assert cur is not None
        recs = (*cur.attempt_records, dataclasses.replace(cur.attempt_records[0], number=2))
        assert await inner.start_attempt(
            cur.evolve(attempts=2, attempt_records=recs, version=cur.version + 1)
        )
        return fenced_absent()

    with pytest.raises(RecoveryRefusedError):
        await ActionRunner(inner).recover_pending(aid, verify)
    stored = await inner.get(aid)
    assert stored is not None
    assert stored.claim_state is ClaimState.PENDING


async def test_recovery_absence_racing_worker_confirmation_is_unknown_conflict() -> None:
    inner = InMemoryLedger()
    faulty = FaultyLedger(inner)
    faulty.inject("record", LedgerFault.FAIL_BEFORE_WRITE)
    with pytest.raises(ActionPersistenceError) as info:
        await ActionRunner(faulty).execute(
            "a",
            CountingOperation("v"),
            request=REQUEST,
            idempotency_key="k",
            provider_reference=REF,
        )
    assert info.value.receipt is not None
    aid = info.value.receipt.action_id

    async def verify(receipt: ActionReceipt) -> VerificationResult:
        cur = await inner.get(aid)  # the original worker finally records CONFIRMED
        assert cur is not None
        recs = (dataclasses.replace(cur.attempt_records[0], execution_status=C),)
        assert await inner.record(
            cur.evolve(
                claim_state=ClaimState.COMPLETED,
                attempt_records=recs,
                execution_status=C,
                final_status=C,
                version=cur.version + 1,
            )
        )
        return fenced_absent()

    res = await ActionRunner(inner).recover_pending(aid, verify)
    assert res.status is U
    assert res.receipt.metadata["verification_conflict"] is True
