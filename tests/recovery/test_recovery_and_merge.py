"""reconcile, recover_pending, release_unstarted and verification merging."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import pytest

from dataoad import (
    ActionNotFoundError,
    ActionPersistenceError,
    ActionReceipt,
    ActionResult,
    ActionRunner,
    ActionStatus,
    ClaimState,
    DefinitiveFailure,
    InMemoryLedger,
    RecoveryRefusedError,
    ResultValueUnavailableError,
    UnresolvedActionError,
    VerificationResult,
)
from dataoad.testing import FaultyLedger, LedgerFault, ManualClock
from suite_support import (
    REF,
    REQUEST,
    CountingOperation,
    confirmed,
    execute,
    fenced_absent,
    fixed_verifier,
    refuse,
    stranded,
    stranded_pending,
    unknown,
    unstarted,
)

C, F, U = ActionStatus.CONFIRMED, ActionStatus.FAILED, ActionStatus.UNKNOWN

T = TypeVar("T")
FAIL = LedgerFault.FAIL_BEFORE_WRITE
LOSE = LedgerFault.LOSE_ACKNOWLEDGEMENT

CONFIRMED, FAILED, UNKNOWN = ActionStatus.CONFIRMED, ActionStatus.FAILED, ActionStatus.UNKNOWN


async def unknown_action(runner: ActionRunner, key: str = "k") -> str:
    result = await runner.execute(
        "a",
        CountingOperation(TimeoutError()),
        request=REQUEST,
        idempotency_key=key,
        provider_reference=REF,
    )
    assert result.status is UNKNOWN
    return result.receipt.action_id


# -- reconcile -------------------------------------------------------------------


async def test_reconcile_confirms_unknown_without_invoking() -> None:
    runner = ActionRunner(InMemoryLedger())
    action_id = await unknown_action(runner)
    result = await runner.reconcile(action_id, fixed_verifier(confirmed()))
    assert result.status is CONFIRMED
    assert result.receipt.execution_status is UNKNOWN
    assert result.receipt.verification_status is CONFIRMED
    assert result.receipt.claim_state is ClaimState.COMPLETED


async def test_a_reconciliation_keeps_the_error_the_attempt_recorded() -> None:
    """Settling an UNKNOWN receipt adds evidence; it does not rewrite what the attempt
    saw: the error of the lost response stays on the receipt."""
    ledger = InMemoryLedger()
    runner = ActionRunner(ledger)
    action_id = await unknown_action(runner)
    before = await ledger.get(action_id)
    assert before is not None
    assert before.error is not None
    assert before.error.startswith("TimeoutError")
    result = await runner.reconcile(action_id, fixed_verifier(confirmed()))
    assert result.status is CONFIRMED
    assert result.receipt.error == before.error


async def test_reconcile_fails_unknown_only_on_fenced_absence() -> None:
    runner = ActionRunner(InMemoryLedger())
    action_id = await unknown_action(runner)
    plain = VerificationResult.absent(verified_provider_reference=REF)
    assert (await runner.reconcile(action_id, fixed_verifier(plain))).status is UNKNOWN
    assert (await runner.reconcile(action_id, fixed_verifier(fenced_absent()))).status is FAILED


async def test_reconcile_of_settled_receipt_changes_nothing() -> None:
    ledger = InMemoryLedger()
    runner = ActionRunner(ledger)
    done = await runner.execute("a", lambda: 1, request=REQUEST, idempotency_key="k")
    verifier = fixed_verifier(fenced_absent())
    again = await runner.reconcile(done.receipt.action_id, verifier)
    assert again.receipt == done.receipt
    assert verifier.calls == []  # type: ignore[attr-defined]


async def test_reconcile_refuses_pending_and_unknown_ids() -> None:
    inner, action_id, _ = await stranded_pending(attempted=True)
    runner = ActionRunner(inner)
    with pytest.raises(RecoveryRefusedError):
        await runner.reconcile(action_id, fixed_verifier(confirmed()))
    with pytest.raises(ActionNotFoundError):
        await runner.reconcile("nope", fixed_verifier(confirmed()))
    with pytest.raises(ActionNotFoundError):
        await runner.receipt("nope")


# -- recover_pending -------------------------------------------------------------


# -- release_unstarted -----------------------------------------------------------


async def test_release_unstarted_frees_the_key() -> None:
    inner, action_id, op = await stranded_pending(attempted=False)
    runner = ActionRunner(inner)
    await runner.release_unstarted(action_id)
    assert await inner.get(action_id) is None
    result = await runner.execute(
        "a", op, request=REQUEST, idempotency_key="k", provider_reference=REF
    )
    assert result.receipt.action_id != action_id


async def test_release_races_atomically_with_attempt_start() -> None:
    clock = ManualClock()
    inner = InMemoryLedger(clock=clock)
    # Only a claim made before the fused claim can be unstarted; its
    # taker starts attempt 1 with a write of its own, racing a release.
    await unstarted(inner, action_name="a", owner="dead", lease=30.0)
    clock.advance(30.0)
    faulty = FaultyLedger(inner)
    runner = ActionRunner(faulty, owner="taker", lease=30.0)
    op = CountingOperation()
    released: list[object] = []

    # Just before the attempt-start write lands, an operator tries to release.
    async def racing_start(receipt: ActionReceipt, **lease: float | None) -> bool:
        try:
            await ActionRunner(inner).release_unstarted(receipt.action_id)
            released.append(True)
        except RecoveryRefusedError as exc:
            released.append(exc)
        return await inner.start_attempt(receipt, **lease)

    faulty.start_attempt = racing_start  # type: ignore[method-assign]
    with pytest.raises(ActionPersistenceError) as info:
        await runner.execute("a", op, request=REQUEST, idempotency_key="k", provider_reference=REF)
    assert info.value.operation_invoked is False
    assert released == [True]
    assert op.calls == 0  # the released claim was never invoked


# -- merging concurrent observations ----------------------------------------------


async def concurrent_reconcile(
    first: VerificationResult,
    second: VerificationResult,
    *,
    results: list[ActionResult[Any]] | None = None,
) -> tuple[ActionRunner, str]:
    runner = ActionRunner(InMemoryLedger())
    action_id = await unknown_action(runner)
    gate = asyncio.Event()
    arrived = 0

    def verifier_for(
        answer: VerificationResult,
    ) -> Callable[[object], Awaitable[VerificationResult]]:
        async def verify(receipt: object) -> VerificationResult:
            nonlocal arrived
            arrived += 1
            if arrived == 2:
                gate.set()
            await gate.wait()  # both observe the same UNKNOWN receipt
            return answer

        return verify

    outcomes = await asyncio.gather(
        runner.reconcile(action_id, verifier_for(first)),
        runner.reconcile(action_id, verifier_for(second)),
    )
    if results is not None:
        results.extend(outcomes)
    return runner, action_id


@pytest.mark.parametrize("order", ["confirmed-first", "absent-first"])
async def test_contradictory_observations_merge_to_unknown_keeping_both(order: str) -> None:
    answers = [confirmed(), fenced_absent()]
    if order == "absent-first":
        answers.reverse()

    runner, action_id = await concurrent_reconcile(*answers)
    receipt = await runner.receipt(action_id)
    assert receipt.final_status is UNKNOWN
    assert receipt.metadata["verification_conflict"] is True
    statuses = sorted(o["status"] for o in receipt.metadata["verification_observations"])
    assert statuses == ["CONFIRMED", "FAILED"]


async def test_two_confirmations_with_different_request_ids_stay_confirmed_with_conflict() -> None:
    runner, action_id = await concurrent_reconcile(
        confirmed(rid="pr_1", value="a"), confirmed(rid="pr_2", value="b")
    )
    receipt = await runner.receipt(action_id)
    assert receipt.final_status is CONFIRMED
    assert receipt.metadata["provider_request_id_conflict"] is True
    assert sorted(receipt.metadata["provider_request_ids"]) == ["pr_1", "pr_2"]


async def test_recovered_value_needs_matching_non_null_request_ids() -> None:
    runner = ActionRunner(InMemoryLedger())
    a = await unknown_action(runner, "k1")
    got = await runner.reconcile(a, fixed_verifier(confirmed(rid="pr_9", value="charge")))
    assert got.value == "charge"

    b = await unknown_action(runner, "k2")
    got = await runner.reconcile(b, fixed_verifier(confirmed(rid=None, value="charge")))
    assert got.status is CONFIRMED
    assert got.value_available is False
    with pytest.raises(ResultValueUnavailableError):
        _ = got.value


async def test_conflicting_request_ids_withhold_the_value() -> None:
    results: list[ActionResult[Any]] = []
    await concurrent_reconcile(
        confirmed(rid="pr_1", value="a"), confirmed(rid="pr_2", value="b"), results=results
    )
    # The merge that saw the conflict must not expose its own value.
    last = max(results, key=lambda r: r.receipt.version)
    assert last.status is CONFIRMED
    assert last.receipt.metadata["provider_request_id_conflict"] is True
    assert last.value_available is False


async def test_value_is_unreadable_for_failed_and_unknown() -> None:
    runner = ActionRunner(InMemoryLedger())
    action_id = await unknown_action(runner)
    unknown = await runner.receipt(action_id)
    from dataoad import ActionResult

    with pytest.raises(UnresolvedActionError):
        _ = ActionResult(unknown, value="secret").value
    failed = await runner.reconcile(action_id, fixed_verifier(fenced_absent()))
    assert failed.value_available is False
    with pytest.raises(UnresolvedActionError):
        _ = failed.value


def test_stale_observation_does_not_settle_a_newer_attempt() -> None:
    from dataoad._evidence import settle
    from dataoad._receipt import AttemptRecord, utc_now
    from dataoad._records import ObservationSource, VerificationObservation

    now = utc_now()
    attempts = [
        AttemptRecord(1, now, ActionStatus.FAILED, finished_at=now, retry_decision="retry"),
        AttemptRecord(2, now),  # in flight
    ]
    stale = VerificationObservation(ObservationSource.RECOVER, 1, FAILED, now)
    assert settle(attempts, [stale]).final_status is UNKNOWN
    fresh = dataclasses.replace(stale, attempt=2)
    assert settle(attempts, [fresh]).final_status is FAILED


async def test_a_failed_read_of_a_receipt_says_nothing_was_invoked() -> None:
    ledger = FaultyLedger(InMemoryLedger())
    ledger.inject("get", FAIL)
    with pytest.raises(ActionPersistenceError) as info:
        await ActionRunner(ledger).receipt("a1")
    assert info.value.operation_invoked is False
    assert info.value.receipt is None
    assert str(info.value).startswith("could not read action a1 from the ledger: ")
    with pytest.raises(ActionNotFoundError) as missing:
        await ActionRunner(ledger).receipt("a2")
    assert missing.value.action_id == "a2"
    assert str(missing.value) == "no action with id 'a2'"


async def test_refusals_carry_the_receipt_they_refused() -> None:
    ledger = InMemoryLedger()
    runner = ActionRunner(ledger)
    done = await execute(runner, key="done")
    claim = await unstarted(ledger, key="unstarted")
    unstarted_id = claim.action_id
    stuck = await stranded(ledger)
    refusing: list[tuple[Callable[[str], Awaitable[object]], str]] = [
        (runner.release_unstarted, done.receipt.action_id),
        (runner.release_unstarted, stuck.action_id),
        (lambda a: runner.recover_pending(a, fixed_verifier(confirmed())), unstarted_id),
        (lambda a: runner.reconcile(a, fixed_verifier(confirmed())), stuck.action_id),
    ]
    for call, action_id in refusing:
        with pytest.raises(RecoveryRefusedError) as info:
            await call(action_id)
        assert info.value.receipt == await ledger.get(action_id)


async def test_a_failed_reconciliation_write_carries_what_is_stored_and_what_was_seen() -> None:
    ledger = InMemoryLedger()
    unknown_result = await unknown(ledger)
    faulty = FaultyLedger(ledger)
    faulty.inject("record", FAIL)
    with pytest.raises(ActionPersistenceError) as info:
        await ActionRunner(faulty).reconcile(
            unknown_result.receipt.action_id, fixed_verifier(confirmed())
        )
    error = info.value
    assert error.receipt == unknown_result.receipt
    assert error.operation_invoked is False
    assert error.observed_status is ActionStatus.CONFIRMED
    assert error.observed_metadata is not None
    assert error.observed_metadata["verification"]["status"] == "CONFIRMED"
    assert str(error).startswith(
        f"the verification of action {unknown_result.receipt.action_id} could not be recorded"
    )


async def test_a_lost_reconciliation_acknowledgement_is_a_success() -> None:
    ledger = InMemoryLedger()
    unknown_result = await unknown(ledger)
    faulty = FaultyLedger(ledger)
    faulty.inject("record", LOSE)
    result = await ActionRunner(faulty).reconcile(
        unknown_result.receipt.action_id, fixed_verifier(confirmed(value="v"))
    )
    assert result.status is ActionStatus.CONFIRMED
    assert result.receipt == await ledger.get(unknown_result.receipt.action_id)
    assert result.value == "v"
    # Written once: a recovered acknowledgement is not merged a second time.
    assert len(result.receipt.metadata["verification_observations"]) == 1
    assert result.receipt.version == unknown_result.receipt.version + 1


async def test_a_claim_that_disappears_during_reconciliation_is_reported_by_id() -> None:
    ledger = InMemoryLedger()
    unknown_result = await unknown(ledger)
    faulty = FaultyLedger(ledger)
    reads = 0
    original = faulty.get

    async def get(action_id: str) -> ActionReceipt | None:
        nonlocal reads
        reads += 1
        return None if reads > 1 else await original(action_id)

    faulty.get = get  # type: ignore[method-assign]
    faulty.record = refuse  # type: ignore[method-assign]
    with pytest.raises(ActionNotFoundError) as info:
        await ActionRunner(faulty).reconcile(
            unknown_result.receipt.action_id, fixed_verifier(confirmed())
        )
    assert info.value.action_id == unknown_result.receipt.action_id
    assert unknown_result.receipt.action_id in str(info.value)


async def test_a_reconciliation_that_keeps_losing_races_gives_up_with_the_latest_receipt() -> None:
    ledger = InMemoryLedger()
    unknown_result = await unknown(ledger)
    faulty = FaultyLedger(ledger)

    faulty.record = refuse  # type: ignore[method-assign]
    with pytest.raises(ActionPersistenceError) as info:
        await ActionRunner(faulty).reconcile(
            unknown_result.receipt.action_id, fixed_verifier(confirmed())
        )
    assert info.value.receipt == unknown_result.receipt
    assert info.value.operation_invoked is False
    assert "races in a row; nothing was invoked" in str(info.value)


async def test_operator_refusals_say_what_to_do_instead() -> None:
    ledger = InMemoryLedger()
    stuck = await stranded(ledger)
    claim = await unstarted(ledger, key="unstarted")
    runner = ActionRunner(ledger)
    verifier = fixed_verifier(confirmed())
    with pytest.raises(RecoveryRefusedError) as info:
        await runner.reconcile(stuck.action_id, verifier)
    assert str(info.value).endswith("make sure its worker has stopped, then use recover_pending")
    with pytest.raises(RecoveryRefusedError) as info:
        await runner.recover_pending(claim.action_id, verifier)
    assert str(info.value).endswith("so use release_unstarted instead")
    with pytest.raises(RecoveryRefusedError) as info:
        await runner.release_unstarted(stuck.action_id)
    assert str(info.value).endswith("only a claim that never invoked its operation can be released")


async def test_a_failed_reconciliation_write_carries_the_newer_stored_receipt() -> None:
    ledger = InMemoryLedger()
    unknown_result: ActionResult[Any] = await unknown(ledger)
    other = await ActionRunner(ledger).reconcile(
        unknown_result.receipt.action_id,
        fixed_verifier(VerificationResult.unknown(reason="lag")),
    )
    faulty = FaultyLedger(ledger)

    async def fails(receipt: ActionReceipt) -> bool:
        raise ConnectionError("write failed")

    faulty.record = fails  # type: ignore[method-assign]
    # The runner read the claim before the other reconciliation landed: its first read
    # of the ledger answers the older receipt, the read-back after the failed write not.
    reads = 0
    original = faulty.get

    async def stale_first(action_id: str) -> ActionReceipt | None:
        nonlocal reads
        reads += 1
        return unknown_result.receipt if reads == 1 else await original(action_id)

    faulty.get = stale_first  # type: ignore[method-assign]
    runner = ActionRunner(faulty)
    assert other.receipt != unknown_result.receipt
    with pytest.raises(ActionPersistenceError) as info:
        await runner.reconcile(unknown_result.receipt.action_id, fixed_verifier(confirmed()))
    assert reads >= 2  # the stale read, then the read-back
    assert info.value.receipt == other.receipt


async def test_a_failed_reconciliation_write_and_read_back_carries_the_receipt_it_read() -> None:
    ledger = InMemoryLedger()
    unknown_result = await unknown(ledger)
    faulty = FaultyLedger(ledger)
    faulty.inject("record", FAIL)
    reads = 0
    original = faulty.get

    async def get(action_id: str) -> ActionReceipt | None:
        nonlocal reads
        reads += 1
        if reads > 1:
            raise ConnectionError("read-back failed")
        return await original(action_id)

    faulty.get = get  # type: ignore[method-assign]
    with pytest.raises(ActionPersistenceError) as info:
        await ActionRunner(faulty).reconcile(
            unknown_result.receipt.action_id, fixed_verifier(confirmed())
        )
    assert info.value.receipt == unknown_result.receipt
    assert "ConnectionError" not in str(info.value)  # the write's error, not the read's
    assert "injected: record failed before write" in str(info.value)


async def test_ledger_errors_are_quoted_in_what_the_operator_reads() -> None:
    ledger = InMemoryLedger()
    faulty = FaultyLedger(ledger)
    faulty.inject("get", FAIL)
    with pytest.raises(ActionPersistenceError) as info:
        await ActionRunner(faulty).receipt("a1")
    assert "injected: get failed" in str(info.value)
    claim = await unstarted(ledger)
    faulty.inject("release", FAIL)
    with pytest.raises(ActionPersistenceError) as info:
        await ActionRunner(faulty).release_unstarted(claim.action_id)
    assert "(LedgerFaultError: injected: release failed before write)" in str(info.value)
    original = faulty.get
    reads = 0

    async def get(action_id: str) -> ActionReceipt | None:
        nonlocal reads
        reads += 1
        if reads == 2:
            raise ConnectionError("read-back failed")
        return await original(action_id)

    faulty.inject("release", FAIL)
    faulty.get = get  # type: ignore[method-assign]
    with pytest.raises(ActionPersistenceError) as info:
        await ActionRunner(faulty).release_unstarted(claim.action_id)
    assert str(info.value) == (
        f"the release of action {claim.action_id} could not be confirmed "
        "(LedgerFaultError: injected: release failed before write)"
    )


async def test_a_reconciliation_moves_the_receipts_update_time() -> None:
    ledger = InMemoryLedger()
    unknown_result = await unknown(ledger)
    await asyncio.sleep(0.001)
    settled = await ActionRunner(ledger).reconcile(
        unknown_result.receipt.action_id, fixed_verifier(confirmed())
    )
    assert settled.receipt.updated_at > unknown_result.receipt.updated_at
    assert settled.receipt.execution_status is ActionStatus.UNKNOWN


async def test_reconcile_of_failed_receipt_does_not_call_verifier() -> None:
    r = ActionRunner(InMemoryLedger())
    done = await r.execute(
        "a",
        CountingOperation(DefinitiveFailure("no")),
        request=REQUEST,
        idempotency_key="k",
        provider_reference=REF,
    )
    assert done.status is F
    v = fixed_verifier(confirmed())
    again = await r.reconcile(done.receipt.action_id, v)
    assert again.receipt == done.receipt
    assert v.calls == []  # type: ignore[attr-defined]


async def test_failed_reconcile_write_raises_persistence_error() -> None:
    inner = InMemoryLedger()
    faulty = FaultyLedger(inner)
    r = ActionRunner(faulty)
    first = await r.execute(
        "a",
        CountingOperation(TimeoutError()),
        request=REQUEST,
        idempotency_key="k",
        provider_reference=REF,
    )
    faulty.inject("record", LedgerFault.FAIL_BEFORE_WRITE)
    with pytest.raises(ActionPersistenceError) as info:
        await r.reconcile(first.receipt.action_id, fixed_verifier(confirmed()))
    assert info.value.operation_invoked is False
    assert info.value.observed_status is C
    stored = await inner.get(first.receipt.action_id)
    assert stored is not None
    assert stored.final_status is U
