"""reconcile, recover_pending, release_unstarted and verification merging."""

from __future__ import annotations

import asyncio
import dataclasses

import pytest

from dataoad import (
    ActionNotFoundError,
    ActionPersistenceError,
    ActionRunner,
    ActionStatus,
    ClaimState,
    InMemoryLedger,
    RecoveryRefusedError,
    ResultValueUnavailableError,
    UnresolvedActionError,
    VerificationResult,
)
from dataoad.testing import FaultyLedger, LedgerFault
from tests.support import REF, REQUEST, CountingOperation, confirmed, fenced_absent, fixed_verifier

CONFIRMED, FAILED, UNKNOWN = ActionStatus.CONFIRMED, ActionStatus.FAILED, ActionStatus.UNKNOWN


def run(coro):
    return asyncio.run(coro)


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


async def stranded_pending(attempted: bool) -> tuple[InMemoryLedger, str, CountingOperation]:
    """A PENDING claim left behind by a failed ledger write."""
    inner = InMemoryLedger()
    faulty = FaultyLedger(inner)
    op = CountingOperation(TimeoutError())
    faulty.inject("record" if attempted else "start_attempt", LedgerFault.FAIL_BEFORE_WRITE)
    with pytest.raises(ActionPersistenceError) as info:
        await ActionRunner(faulty).execute(
            "a", op, request=REQUEST, idempotency_key="k", provider_reference=REF
        )
    assert info.value.receipt is not None
    return inner, info.value.receipt.action_id, op


# -- reconcile -------------------------------------------------------------------


def test_reconcile_confirms_unknown_without_invoking() -> None:
    async def scenario() -> None:
        runner = ActionRunner(InMemoryLedger())
        action_id = await unknown_action(runner)
        result = await runner.reconcile(action_id, fixed_verifier(confirmed()))
        assert result.status is CONFIRMED
        assert result.receipt.execution_status is UNKNOWN
        assert result.receipt.verification_status is CONFIRMED
        assert result.receipt.claim_state is ClaimState.COMPLETED

    run(scenario())


def test_reconcile_fails_unknown_only_on_fenced_absence() -> None:
    async def scenario() -> None:
        runner = ActionRunner(InMemoryLedger())
        action_id = await unknown_action(runner)
        plain = VerificationResult.absent(verified_provider_reference=REF)
        assert (await runner.reconcile(action_id, fixed_verifier(plain))).status is UNKNOWN
        assert (await runner.reconcile(action_id, fixed_verifier(fenced_absent()))).status is FAILED

    run(scenario())


def test_reconcile_of_settled_receipt_changes_nothing() -> None:
    async def scenario() -> None:
        ledger = InMemoryLedger()
        runner = ActionRunner(ledger)
        done = await runner.execute("a", lambda: 1, request=REQUEST, idempotency_key="k")
        verifier = fixed_verifier(fenced_absent())
        again = await runner.reconcile(done.receipt.action_id, verifier)
        assert again.receipt == done.receipt
        assert verifier.calls == []  # type: ignore[attr-defined]

    run(scenario())


def test_reconcile_refuses_pending_and_unknown_ids() -> None:
    async def scenario() -> None:
        inner, action_id, _ = await stranded_pending(attempted=True)
        runner = ActionRunner(inner)
        with pytest.raises(RecoveryRefusedError):
            await runner.reconcile(action_id, fixed_verifier(confirmed()))
        with pytest.raises(ActionNotFoundError):
            await runner.reconcile("nope", fixed_verifier(confirmed()))
        with pytest.raises(ActionNotFoundError):
            await runner.receipt("nope")

    run(scenario())


# -- recover_pending -------------------------------------------------------------


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
def test_recover_pending_completes_with_what_evidence_supports(
    verification: object, expected: ActionStatus
) -> None:
    async def scenario() -> None:
        inner, action_id, op = await stranded_pending(attempted=True)
        result = await ActionRunner(inner).recover_pending(action_id, fixed_verifier(verification))
        assert result.status is expected
        assert result.receipt.claim_state is ClaimState.COMPLETED
        assert result.receipt.metadata["recovery"]["method"] == "recover_pending"
        assert op.calls == 1

    run(scenario())


def test_recover_pending_unknown_can_be_reconciled_later() -> None:
    async def scenario() -> None:
        inner, action_id, _ = await stranded_pending(attempted=True)
        runner = ActionRunner(inner)
        first = await runner.recover_pending(
            action_id, fixed_verifier(VerificationResult.unknown(reason="x"))
        )
        assert first.status is UNKNOWN
        second = await runner.reconcile(action_id, fixed_verifier(confirmed()))
        assert second.status is CONFIRMED

    run(scenario())


def test_recover_pending_refuses_unstarted_claims() -> None:
    async def scenario() -> None:
        inner, action_id, op = await stranded_pending(attempted=False)
        with pytest.raises(RecoveryRefusedError, match="release_unstarted"):
            await ActionRunner(inner).recover_pending(action_id, fixed_verifier(confirmed()))
        assert op.calls == 0

    run(scenario())


# -- release_unstarted -----------------------------------------------------------


def test_release_unstarted_frees_the_key() -> None:
    async def scenario() -> None:
        inner, action_id, op = await stranded_pending(attempted=False)
        runner = ActionRunner(inner)
        await runner.release_unstarted(action_id)
        assert await inner.get(action_id) is None
        result = await runner.execute(
            "a", op, request=REQUEST, idempotency_key="k", provider_reference=REF
        )
        assert result.receipt.action_id != action_id

    run(scenario())


def test_release_unstarted_refuses_started_or_completed_claims() -> None:
    async def scenario() -> None:
        inner, action_id, _ = await stranded_pending(attempted=True)
        runner = ActionRunner(inner)
        with pytest.raises(RecoveryRefusedError):
            await runner.release_unstarted(action_id)
        assert (await inner.get(action_id)) is not None
        done = await runner.execute("b", lambda: 1, request={}, idempotency_key="k")
        with pytest.raises(RecoveryRefusedError):
            await runner.release_unstarted(done.receipt.action_id)

    run(scenario())


def test_release_races_atomically_with_attempt_start() -> None:
    async def scenario() -> None:
        inner = InMemoryLedger()
        faulty = FaultyLedger(inner)
        runner = ActionRunner(faulty)
        op = CountingOperation()
        released: list[object] = []

        # Just before the attempt-start write lands, an operator tries to release.
        async def racing_start(receipt):
            try:
                await ActionRunner(inner).release_unstarted(receipt.action_id)
                released.append(True)
            except RecoveryRefusedError as exc:
                released.append(exc)
            return await inner.start_attempt(receipt)

        faulty.start_attempt = racing_start  # type: ignore[method-assign]
        with pytest.raises(ActionPersistenceError):
            await runner.execute("a", op, request=REQUEST, idempotency_key="k")
        assert released == [True]
        assert op.calls == 0  # the released claim was never invoked

    run(scenario())


def test_ledger_refuses_release_after_attempt_started() -> None:
    async def scenario() -> None:
        inner, action_id, _ = await stranded_pending(attempted=True)
        stored = await inner.get(action_id)
        assert stored is not None
        assert await inner.release(action_id, stored.version) is False

    run(scenario())


# -- merging concurrent observations ----------------------------------------------


async def concurrent_reconcile(
    first: object, second: object, results: list[object] | None = None
) -> tuple[ActionRunner, str]:
    runner = ActionRunner(InMemoryLedger())
    action_id = await unknown_action(runner)
    gate = asyncio.Event()
    arrived = 0

    def verifier_for(answer: object):
        async def verify(receipt: object) -> object:
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
def test_contradictory_observations_merge_to_unknown_keeping_both(order: str) -> None:
    answers = [confirmed(), fenced_absent()]
    if order == "absent-first":
        answers.reverse()

    async def scenario() -> None:
        runner, action_id = await concurrent_reconcile(*answers)
        receipt = await runner.receipt(action_id)
        assert receipt.final_status is UNKNOWN
        assert receipt.metadata["verification_conflict"] is True
        statuses = sorted(o["status"] for o in receipt.metadata["verification_observations"])
        assert statuses == ["CONFIRMED", "FAILED"]

    run(scenario())


def test_two_confirmations_with_different_request_ids_stay_confirmed_with_conflict() -> None:
    async def scenario() -> None:
        runner, action_id = await concurrent_reconcile(
            confirmed(rid="pr_1", value="a"), confirmed(rid="pr_2", value="b")
        )
        receipt = await runner.receipt(action_id)
        assert receipt.final_status is CONFIRMED
        assert receipt.metadata["provider_request_id_conflict"] is True
        assert sorted(receipt.metadata["provider_request_ids"]) == ["pr_1", "pr_2"]

    run(scenario())


def test_recovered_value_needs_matching_non_null_request_ids() -> None:
    async def scenario() -> None:
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

    run(scenario())


def test_conflicting_request_ids_withhold_the_value() -> None:
    async def scenario() -> None:
        results: list[object] = []
        await concurrent_reconcile(
            confirmed(rid="pr_1", value="a"), confirmed(rid="pr_2", value="b"), results
        )
        # The merge that saw the conflict must not expose its own value.
        last = max(results, key=lambda r: r.receipt.version)  # type: ignore[attr-defined]
        assert last.status is CONFIRMED  # type: ignore[attr-defined]
        assert last.receipt.metadata["provider_request_id_conflict"] is True  # type: ignore[attr-defined]
        assert last.value_available is False  # type: ignore[attr-defined]


def test_value_is_unreadable_for_failed_and_unknown() -> None:
    async def scenario() -> None:
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

    run(scenario())


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
