"""Ledger write failures and lost acknowledgements (seed: Local claim deduplication)."""

from __future__ import annotations

import pickle
from typing import Any

import pytest

from dataoad import (
    ActionInProgressError,
    ActionPersistenceError,
    ActionReceipt,
    ActionRunner,
    ActionStatus,
    ClaimState,
    InMemoryLedger,
    LedgerUnusableError,
    NothingInvokedError,
    OutcomeNotRecordedError,
)
from dataoad.testing import FaultyLedger, LedgerFault, ManualClock
from suite_support import REF, REQUEST, CountingOperation, confirmed, fixed_verifier, unstarted

BEFORE, LOST_ACK = LedgerFault.FAIL_BEFORE_WRITE, LedgerFault.LOSE_ACKNOWLEDGEMENT


def setup() -> tuple[InMemoryLedger, FaultyLedger, ActionRunner, CountingOperation]:
    inner = InMemoryLedger()
    faulty = FaultyLedger(inner)
    return inner, faulty, ActionRunner(faulty), CountingOperation("value")


async def taking_over() -> tuple[InMemoryLedger, FaultyLedger, ActionRunner, CountingOperation]:
    """Key "k" held by an expired claim whose attempt 1 never started (a v0.1 runner's).

    A new claim counts attempt 1 itself, so a call's first attempt start of
    its own is a takeover's: the write these tests break.
    """
    clock = ManualClock()
    inner = InMemoryLedger(clock=clock)
    await unstarted(
        inner, action_name="a", request=REQUEST, provider_reference=None, owner="old", lease=1.0
    )
    clock.advance(1.0)
    faulty = FaultyLedger(inner)
    return inner, faulty, ActionRunner(faulty, owner="new"), CountingOperation("value")


async def test_lost_acknowledgement_of_attempt_start_continues_after_exact_read_back() -> None:
    _inner, faulty, runner, op = await taking_over()
    faulty.inject("start_attempt", LOST_ACK)
    result = await runner.execute("a", op, request=REQUEST, idempotency_key="k")
    assert op.calls == 1
    assert result.status is ActionStatus.CONFIRMED
    # The attempt was counted once, not again after the lost acknowledgement.
    assert result.receipt.attempts == 1
    assert faulty.calls.count("start_attempt") == 1


async def test_failed_attempt_start_does_not_invoke_and_keeps_the_claim() -> None:
    inner, faulty, runner, op = await taking_over()
    faulty.inject("start_attempt", BEFORE)
    with pytest.raises(ActionPersistenceError) as info:
        await runner.execute("a", op, request=REQUEST, idempotency_key="k")
    assert op.calls == 0
    assert info.value.operation_invoked is False
    [stored] = inner.snapshot()
    assert stored.claim_state is ClaimState.PENDING
    assert stored.attempts == 0
    # The claim remains a barrier against a duplicate.
    with pytest.raises(ActionInProgressError):
        await runner.execute("a", op, request=REQUEST, idempotency_key="k")
    assert op.calls == 0


async def test_unprovable_attempt_start_does_not_invoke() -> None:
    inner, faulty, runner, op = await taking_over()
    # The write commits, the acknowledgement is lost, and the read-back fails too.
    faulty.inject("start_attempt", LOST_ACK)
    faulty.inject("get", BEFORE)
    with pytest.raises(ActionPersistenceError):
        await runner.execute("a", op, request=REQUEST, idempotency_key="k")
    assert op.calls == 0
    [stored] = inner.snapshot()
    assert stored.attempts == 1  # durable, so only read-only recovery applies


async def test_read_back_showing_a_different_transition_does_not_invoke() -> None:
    inner, faulty, runner, op = await taking_over()

    async def interfering_start(receipt: ActionReceipt, **lease: Any) -> bool:
        # Another writer changes the claim, then our write "fails".
        stored = await inner.get(receipt.action_id)
        assert stored is not None
        await inner.record(stored.evolve(version=stored.version + 1, risk=stored.risk))
        raise ConnectionError("acknowledgement lost")

    faulty.start_attempt = interfering_start  # type: ignore[method-assign]
    with pytest.raises(ActionPersistenceError):
        await runner.execute("a", op, request=REQUEST, idempotency_key="k")
    assert op.calls == 0


async def test_lost_acknowledgement_of_claim_is_resolved_by_read_back() -> None:
    inner, faulty, runner, op = setup()
    faulty.inject("claim", LOST_ACK)
    result = await runner.execute("a", op, request=REQUEST, idempotency_key="k")
    assert result.status is ActionStatus.CONFIRMED
    assert op.calls == 1
    assert len(inner.snapshot()) == 1


async def test_failed_claim_does_not_invoke() -> None:
    inner, faulty, runner, op = setup()
    faulty.inject("claim", BEFORE)
    with pytest.raises(ActionPersistenceError) as info:
        await runner.execute("a", op, request=REQUEST, idempotency_key="k")
    assert op.calls == 0
    assert info.value.operation_invoked is False
    assert inner.snapshot() == []
    assert str(info.value).endswith(
        "the operation was not invoked. Re-read the ledger: if the claim was stored, it "
        "counts attempt 1 (claim and attempt start are one write) and settles read-only "
        "(recover_pending) or by a lease takeover"
    )


async def test_a_claim_on_a_ledger_that_cannot_be_used_gives_no_recovery_advice() -> None:
    class NotSetUp(InMemoryLedger):
        async def claim(self, receipt: Any, **options: Any) -> Any:
            raise LedgerUnusableError("no schema yet: run migrate")

    op = CountingOperation()
    with pytest.raises(NothingInvokedError) as info:
        await ActionRunner(NotSetUp()).execute("a", op, request=REQUEST, idempotency_key="k")
    assert op.calls == 0
    assert str(info.value).endswith(
        "(LedgerUnusableError: no schema yet: run migrate); the operation was not invoked. "
        "The ledger cannot be used as set up: fix it and call again"
    )


async def test_unprovable_claim_does_not_invoke_and_keeps_the_claim_as_a_barrier() -> None:
    inner, faulty, runner, op = setup()
    # The claim lands, its acknowledgement is lost, and so is the read-back.
    faulty.inject("claim", LOST_ACK)
    faulty.inject("find", BEFORE)
    with pytest.raises(ActionPersistenceError) as info:
        await runner.execute("a", op, request=REQUEST, idempotency_key="k")
    assert op.calls == 0
    assert info.value.operation_invoked is False
    [stored] = inner.snapshot()
    # Attempt 1 is counted with the claim although nothing ran: only
    # read-only recovery (or a takeover) settles it, never a release.
    assert stored.attempts == 1
    assert stored.claim_state is ClaimState.PENDING
    with pytest.raises(ActionInProgressError):
        await runner.execute("a", op, request=REQUEST, idempotency_key="k")
    assert op.calls == 0


async def test_lost_completion_acknowledgement_is_recovered_by_reading_back() -> None:
    inner, faulty, runner, op = setup()
    faulty.inject("record", LOST_ACK)
    result = await runner.execute("a", op, request=REQUEST, idempotency_key="k")
    assert op.calls == 1
    assert result.status is ActionStatus.CONFIRMED
    assert result.value == "value"
    [stored] = inner.snapshot()
    assert stored == result.receipt
    assert stored.claim_state is ClaimState.COMPLETED


async def test_lost_completion_acknowledgement_with_failed_read_back_is_a_persistence_error() -> (
    None
):
    inner, faulty, runner, op = setup()
    faulty.inject("record", LOST_ACK)
    faulty.inject("get", BEFORE, times=2)  # both read-backs of the outcome write fail
    with pytest.raises(ActionPersistenceError) as info:
        await runner.execute("a", op, request=REQUEST, idempotency_key="k")
    assert op.calls == 1
    assert info.value.operation_invoked is True
    assert info.value.observed_status is ActionStatus.CONFIRMED
    [stored] = inner.snapshot()
    assert stored.claim_state is ClaimState.COMPLETED


async def test_an_outcome_a_second_read_back_shows_stored_is_reported_recorded() -> None:
    # The write landed, its answer was lost and the first read-back failed:
    # the next read shows the outcome stored, which proves it as the first would have.
    from dataoad import EventKind
    from suite_support import Recorder

    inner, faulty, _, op = setup()
    seen = Recorder()
    runner = ActionRunner(faulty, observers=[seen])
    faulty.inject("record", LOST_ACK)
    faulty.inject("get", BEFORE)
    result = await runner.execute("a", op, request=REQUEST, idempotency_key="k")
    assert op.calls == 1
    assert result.status is ActionStatus.CONFIRMED
    assert result.value == "value"
    [stored] = inner.snapshot()
    assert stored == result.receipt
    assert faulty.calls.count("record") == 1  # read, never written again
    (recovered,) = seen.of(EventKind.OUTCOME_ACKNOWLEDGEMENT_RECOVERED)
    assert recovered.receipt == stored


@pytest.mark.parametrize("fault", [BEFORE])
async def test_failed_completion_raises_persistence_error_with_observed_evidence(
    fault: LedgerFault,
) -> None:
    inner, faulty, runner, op = setup()
    faulty.inject("record", fault)
    with pytest.raises(ActionPersistenceError) as info:
        await runner.execute("a", op, request=REQUEST, idempotency_key="k")
    err = info.value
    assert op.calls == 1
    assert err.operation_invoked is True
    assert err.observed_status is ActionStatus.CONFIRMED
    assert err.value_available is True
    assert err.observed_value == "value"
    assert err.observed_metadata is not None
    assert err.receipt is not None
    assert err.receipt.claim_state is ClaimState.PENDING  # last safely observed
    assert err.receipt.attempts == 1
    [stored] = inner.snapshot()
    expected = ClaimState.PENDING if fault is BEFORE else ClaimState.COMPLETED
    assert stored.claim_state is expected
    # Whatever the durable state, a retry of the same call never re-invokes.
    try:
        again = await runner.execute("a", op, request=REQUEST, idempotency_key="k")
    except ActionInProgressError:
        pass
    else:
        assert again.replayed
    assert op.calls == 1


async def test_failed_completion_of_unknown_carries_no_value() -> None:
    _inner, faulty, runner, _ = setup()
    op = CountingOperation(TimeoutError())
    faulty.inject("record", BEFORE)
    with pytest.raises(ActionPersistenceError) as info:
        await runner.execute("a", op, request=REQUEST, idempotency_key="k")
    assert info.value.observed_status is ActionStatus.UNKNOWN
    assert info.value.value_available is False
    assert info.value.observed_value is None


async def test_persistence_error_is_picklable() -> None:
    _inner, faulty, runner, op = setup()
    faulty.inject("record", BEFORE)
    with pytest.raises(ActionPersistenceError) as info:
        await runner.execute("a", op, request=REQUEST, idempotency_key="k")
    err = info.value
    copy = pickle.loads(pickle.dumps(err))
    assert copy.receipt == err.receipt
    assert copy.observed_status is err.observed_status
    assert str(copy) == str(err)


async def test_lost_acknowledgement_of_reconciliation_is_resolved_by_read_back() -> None:
    inner, faulty, runner, _ = setup()
    op = CountingOperation(TimeoutError())
    first = await runner.execute(
        "a", op, request=REQUEST, idempotency_key="k", provider_reference=REF
    )
    faulty.inject("record", LOST_ACK)
    result = await runner.reconcile(first.receipt.action_id, fixed_verifier(confirmed()))
    assert result.status is ActionStatus.CONFIRMED
    assert (await inner.get(first.receipt.action_id)) == result.receipt


async def test_an_outcome_refused_over_a_receipt_that_is_gone_is_not_recorded() -> None:
    class Vanishes(InMemoryLedger):
        """The outcome write is refused, and the receipt cannot be read back any more."""

        refused = False

        async def record(self, receipt: Any) -> bool:
            self.refused = True
            return False

        async def get(self, action_id: str) -> Any:
            return None if self.refused else await super().get(action_id)

    op = CountingOperation("value")
    with pytest.raises(OutcomeNotRecordedError) as info:
        await ActionRunner(Vanishes()).execute("a", op, request=REQUEST, idempotency_key="k")
    assert op.calls == 1
    assert info.value.operation_invoked is True
    assert "the claim changed concurrently" in str(info.value)


@pytest.mark.parametrize("taken_over", [True, False], ids=["then-taken-over", "still-moving"])
async def test_an_outcome_rebased_every_round_is_judged_on_a_last_read(taken_over: bool) -> None:
    # Each of the bounded rounds is refused (the claim moved, evidence merged
    # into it) and rebuilt; after the last, what is stored decides: a new
    # owner makes it a fenced worker's evidence, anything else "not recorded".
    from dataoad import ClaimFencedError, OutcomeNotRecordedError
    from dataoad._events import EventSink
    from dataoad._proven import ProvenLedger
    from dataoad.testing import make_receipt

    held = make_receipt(owner="A")
    final = held.evolve(
        version=2, claim_state=ClaimState.COMPLETED, final_status=ActionStatus.CONFIRMED
    )
    faulty = FaultyLedger(InMemoryLedger())
    stored = [held]
    writes: list[int] = []

    async def record(receipt: Any) -> bool:
        writes.append(receipt.version)
        moved = stored[-1].evolve(version=stored[-1].version + 1)
        stored.append(moved)  # another writer got there first
        return False

    async def get(action_id: str) -> Any:
        if action_id != held.action_id:
            raise LookupError(action_id)
        if taken_over and len(writes) == 16:
            return stored[-1].evolve(owner="B", fencing_token=2)
        return stored[-1]

    faulty.record = record  # type: ignore[method-assign]
    faulty.get = get  # type: ignore[method-assign]

    def rebase(mine: Any, base: Any, now: Any) -> Any:
        return mine.evolve(version=now.version + 1)

    expected = ClaimFencedError if taken_over else OutcomeNotRecordedError
    with pytest.raises(expected) as info:
        await ProvenLedger(faulty, "").record_outcome(
            final,
            held,
            EventSink((), "execute"),
            observed_status=ActionStatus.CONFIRMED,
            observed_metadata={},
            value="ch_1",
            has_value=True,
            rebase=rebase,
        )
    assert len(writes) == 16  # the bound: then one last read decides
    assert info.value.operation_invoked is True
    if taken_over:
        assert info.value.receipt is not None
        assert info.value.receipt.owner == "B"
