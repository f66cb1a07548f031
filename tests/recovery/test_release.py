"""release_unstarted: only a claim that never invoked its operation is freed, atomically."""

from __future__ import annotations

import pytest

from dataoad import (
    ActionPersistenceError,
    ActionReceipt,
    ActionRunner,
    ActionStatus,
    ClaimState,
    InMemoryLedger,
    NothingInvokedError,
    RecoveryRefusedError,
)
from dataoad.testing import FaultyLedger, LedgerFault
from suite_support import (
    events,
    refuse,
    stranded_pending,
    unstarted,
)

FAIL = LedgerFault.FAIL_BEFORE_WRITE
LOSE = LedgerFault.LOSE_ACKNOWLEDGEMENT


async def test_a_completed_claim_with_no_attempt_cannot_be_released() -> None:
    # Not produced by the runner, but a ledger may hold one (an import, a repair):
    # "completed" alone must refuse the release.
    ledger = InMemoryLedger()
    claim = await unstarted(ledger)
    completed = claim.evolve(
        claim_state=ClaimState.COMPLETED,
        execution_status=ActionStatus.FAILED,
        final_status=ActionStatus.FAILED,
        version=claim.version + 1,
    )
    assert await ledger.record(completed)
    with pytest.raises(RecoveryRefusedError):
        await ActionRunner(ledger).release_unstarted(claim.action_id)
    assert await ledger.get(claim.action_id) == completed


@pytest.mark.parametrize("committed", [False, True])
async def test_an_unacknowledged_release_is_settled_by_reading_back(
    committed: bool, caplog: pytest.LogCaptureFixture
) -> None:
    ledger = InMemoryLedger()
    claim = await unstarted(ledger)
    faulty = FaultyLedger(ledger)
    faulty.inject("release", LOSE if committed else FAIL)
    runner = ActionRunner(faulty)
    if committed:
        # Gone, but the absence cannot say whose delete it was (see the next test).
        with pytest.raises(NothingInvokedError) as unconfirmed:
            await runner.release_unstarted(claim.action_id)
        assert str(unconfirmed.value).startswith(
            f"the release of action {claim.action_id} could not be confirmed"
        )
        message = str(unconfirmed.value)
        # Why it is unconfirmed, in the words an operator reads, and the write's own error.
        assert "the claim is gone, removed by this release or by another writer" in message
        assert "(a release, or a prune once it had completed)" in message
        assert "injected: release committed, acknowledgement lost" in message
        # The claim it meant to release, as the other unconfirmed releases carry it.
        assert unconfirmed.value.receipt == claim
        assert unconfirmed.value.operation_invoked is False
        assert await ledger.get(claim.action_id) is None
    else:
        with pytest.raises(ActionPersistenceError) as failed:
            await runner.release_unstarted(claim.action_id)
        assert failed.value.receipt == claim
        assert failed.value.operation_invoked is False
        assert str(failed.value).startswith(f"the release of action {claim.action_id} failed")
        assert await ledger.get(claim.action_id) == claim
    assert "released" not in [e[0] for e in events(caplog)]


async def test_a_failed_release_is_not_reported_when_the_claim_went_another_way() -> None:
    """The release's delete fails; meanwhile another worker takes the claim over, runs
    it, and an operator prunes it. The release read back no receipt, and once counted
    that as its own delete: it reported releasing a claim that had been started."""
    ledger = InMemoryLedger()
    claim = await unstarted(ledger)
    faulty = FaultyLedger(ledger)
    faulty.inject("release", FAIL)

    def started_and_pruned_meanwhile(method: str) -> None:
        if method == "release":
            del ledger._by_id[claim.action_id]

    faulty.on_call = started_and_pruned_meanwhile
    with pytest.raises(NothingInvokedError, match="could not be confirmed"):
        await ActionRunner(faulty).release_unstarted(claim.action_id)


async def test_a_release_whose_read_back_fails_carries_the_claim_it_meant_to_release() -> None:
    ledger = InMemoryLedger()
    claim = await unstarted(ledger)
    faulty = FaultyLedger(ledger)
    faulty.inject("release", FAIL)
    original = faulty.get
    reads = 0

    async def get(action_id: str) -> ActionReceipt | None:
        nonlocal reads
        reads += 1
        if reads == 2:  # the read-back after the release
            raise ConnectionError("read-back failed")
        return await original(action_id)

    faulty.get = get  # type: ignore[method-assign]
    with pytest.raises(ActionPersistenceError) as failed:
        await ActionRunner(faulty).release_unstarted(claim.action_id)
    assert failed.value.receipt == claim
    assert failed.value.operation_invoked is False
    assert str(failed.value).startswith(
        f"the release of action {claim.action_id} could not be confirmed"
    )


async def test_a_release_that_loses_a_race_carries_the_newer_receipt() -> None:
    ledger = InMemoryLedger()
    claim = await unstarted(ledger)
    faulty = FaultyLedger(ledger)

    faulty.release = refuse  # type: ignore[method-assign]
    with pytest.raises(RecoveryRefusedError) as refused:
        await ActionRunner(faulty).release_unstarted(claim.action_id)
    assert refused.value.receipt == claim


async def test_a_release_that_loses_a_race_says_nothing_was_released(
    caplog: pytest.LogCaptureFixture,
) -> None:
    ledger = InMemoryLedger()
    claim = await unstarted(ledger)
    faulty = FaultyLedger(ledger)
    faulty.release = refuse  # type: ignore[method-assign]
    with pytest.raises(RecoveryRefusedError) as info:
        await ActionRunner(faulty).release_unstarted(claim.action_id)
    assert str(info.value) == (
        f"action {claim.action_id} changed before it could be released (an attempt may "
        "have started); nothing was released"
    )
    await ActionRunner(ledger).release_unstarted(claim.action_id)
    released = [(lvl, f) for e, lvl, f in events(caplog) if e == "released"]
    assert len(released) == 1
    assert released[0][1]["action_id"]


async def test_release_refused_when_claim_changes_before_release() -> None:
    inner = InMemoryLedger()
    aid = (await unstarted(inner)).action_id

    class Racing(FaultyLedger):
        async def release(self, action_id: str, version: int) -> bool:
            from dataoad import AttemptRecord
            from dataoad._receipt import utc_now

            c = await inner.get(action_id)
            assert c is not None
            await inner.start_attempt(
                c.evolve(
                    attempts=1,
                    attempt_records=(AttemptRecord(number=1, started_at=utc_now()),),
                    version=c.version + 1,
                )
            )
            return await inner.release(action_id, version)

    with pytest.raises(RecoveryRefusedError):
        await ActionRunner(Racing(inner)).release_unstarted(aid)
    assert (await inner.get(aid)) is not None


async def test_release_unstarted_refuses_started_or_completed_claims() -> None:
    inner, action_id, _ = await stranded_pending(attempted=True)
    runner = ActionRunner(inner)
    with pytest.raises(RecoveryRefusedError):
        await runner.release_unstarted(action_id)
    assert (await inner.get(action_id)) is not None
    done = await runner.execute("b", lambda: 1, request={}, idempotency_key="k")
    with pytest.raises(RecoveryRefusedError):
        await runner.release_unstarted(done.receipt.action_id)


async def test_ledger_refuses_release_after_attempt_started() -> None:
    inner, action_id, _ = await stranded_pending(attempted=True)
    stored = await inner.get(action_id)
    assert stored is not None
    assert await inner.release(action_id, stored.version) is False
