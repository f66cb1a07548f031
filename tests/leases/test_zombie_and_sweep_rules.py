"""The rules of ``dataoad._leases`` one by one: merging a zombie's facts, sweeping, settling.

``test_leases.py`` shows the behaviour end to end; these pin each rule's
parts (which record a zombie's attempt lands in, which fact outranks
which, what a sweep lists and passes on), so that changing any one of them
fails a test that names it.
"""

from __future__ import annotations

import dataclasses
import logging
from datetime import timedelta
from typing import Any

import pytest

from dataoad import (
    ActionReceipt,
    ActionRunner,
    ActionStatus,
    ClaimState,
    EventKind,
    InMemoryLedger,
    InvalidArgumentError,
    NothingInvokedError,
    ObservationSource,
    RetryPolicy,
    VerificationResult,
)
from dataoad import _evidence as evidence_module
from dataoad._receipt import AttemptRecord
from dataoad._records import VerificationObservation
from dataoad._settled import zombie_merged
from dataoad.testing import FaultyLedger, LedgerFault, ManualClock
from suite_support import Recorder, Unlisted, unstarted
from suite_support.leases import LEASE, REQUEST, counting, crash_after_start, paused_holder

CONFIRMED, FAILED, UNKNOWN = ActionStatus.CONFIRMED, ActionStatus.FAILED, ActionStatus.UNKNOWN


async def two_attempt_claim() -> ActionReceipt:
    """A PENDING claim with two attempts: a retryable failure, then a crash mid-call."""
    ledger = InMemoryLedger()
    runner = ActionRunner(
        ledger, owner="A", policy=RetryPolicy(max_attempts=2, retry_on_failed=True)
    )
    calls = 0

    class Crash(BaseException):
        pass

    async def op() -> str:
        nonlocal calls
        calls += 1
        if calls == 1:
            from dataoad import DefinitiveFailure

            raise DefinitiveFailure("rejected", retryable=True)
        raise Crash

    with pytest.raises(Crash):
        await runner.execute("charge", op, request=REQUEST, idempotency_key="k")
    stored = await ledger.find("charge", "k")
    assert stored is not None
    assert stored.attempts == 2
    assert stored.is_pending
    return stored


def seen(number: int, status: ActionStatus | None, **facts: Any) -> AttemptRecord:
    start = facts.pop("started_at", None)
    return AttemptRecord(
        number=number,
        started_at=start or ManualClock()(),
        execution_status=status,
        **facts,
    )


# -- zombie_merged ------------------------------------------------------------


async def test_a_zombie_attempt_outside_the_claims_attempts_is_not_merged() -> None:
    claim = await two_attempt_claim()
    assert zombie_merged(claim, seen(0, CONFIRMED), None) is None
    assert zombie_merged(claim, seen(3, CONFIRMED), None) is None


async def test_a_zombie_attempt_lands_in_its_own_record_only() -> None:
    claim = await two_attempt_claim()
    merged = zombie_merged(claim, seen(2, CONFIRMED), None)
    assert merged is not None
    assert merged.attempt_records[0] == claim.attempt_records[0]
    assert merged.attempt_records[1].execution_status is CONFIRMED
    first = zombie_merged(claim, seen(1, CONFIRMED), None)
    assert first is not None
    assert first.attempt_records[1] == claim.attempt_records[1]
    assert first.attempt_records[0].execution_status is CONFIRMED


@pytest.mark.parametrize(
    ("stored", "zombie", "kept"),
    [
        (None, CONFIRMED, CONFIRMED),
        (None, FAILED, FAILED),
        (UNKNOWN, FAILED, FAILED),
        (UNKNOWN, CONFIRMED, CONFIRMED),
        (FAILED, CONFIRMED, CONFIRMED),  # a success seen outranks everything
        (FAILED, UNKNOWN, FAILED),  # an ambiguous sighting never weakens a definite one
        (CONFIRMED, FAILED, CONFIRMED),
        (FAILED, None, FAILED),
    ],
    ids=str,
)
async def test_which_execution_fact_wins(
    stored: ActionStatus | None, zombie: ActionStatus | None, kept: ActionStatus
) -> None:
    claim = await two_attempt_claim()
    records = list(claim.attempt_records)
    records[1] = dataclasses.replace(records[1], execution_status=stored)
    current = claim.evolve(attempt_records=tuple(records))
    merged = zombie_merged(current, seen(2, zombie, error="late"), None)
    assert merged is not None
    assert merged.attempt_records[1].execution_status is kept


async def test_the_stored_record_keeps_its_own_facts_and_gains_the_missing_ones() -> None:
    claim = await two_attempt_claim()
    later = claim.attempt_records[1].started_at + timedelta(seconds=5)
    zombie = seen(
        2,
        CONFIRMED,
        verification_status=CONFIRMED,
        error="zombie error",
        provider_request_id="ch_zombie",
        finished_at=later,
    )
    merged = zombie_merged(claim, zombie, None)
    assert merged is not None
    record = merged.attempt_records[1]
    assert record.verification_status is CONFIRMED
    assert record.error == "zombie error"
    assert record.provider_request_id == "ch_zombie"
    assert record.finished_at == later
    # A record that already has them keeps its own.
    records = list(claim.attempt_records)
    records[1] = dataclasses.replace(
        records[1],
        verification_status=FAILED,
        error="own error",
        provider_request_id="ch_own",
        finished_at=later - timedelta(seconds=1),
    )
    mine = claim.evolve(attempt_records=tuple(records))
    merged = zombie_merged(mine, zombie, None)
    assert merged is not None
    record = merged.attempt_records[1]
    assert (record.verification_status, record.error, record.provider_request_id) == (
        FAILED,
        "own error",
        "ch_own",
    )
    assert record.finished_at == later - timedelta(seconds=1)


async def test_nothing_new_merges_nothing_and_a_merge_is_a_new_version() -> None:
    claim = await two_attempt_claim()
    same = claim.attempt_records[1]
    assert zombie_merged(claim, same, None) is None
    merged = zombie_merged(claim, seen(2, CONFIRMED), None)
    assert merged is not None
    assert merged.version == claim.version + 1
    assert merged.updated_at is not None
    assert merged.updated_at > claim.updated_at
    assert merged.owner == claim.owner
    assert merged.fencing_token == claim.fencing_token
    assert merged.is_pending
    assert merged.final_status is None


def observation(status: ActionStatus, number: int | None = None) -> VerificationObservation:
    return VerificationObservation(
        number=number,
        source=ObservationSource.EXECUTE,
        attempt=2,
        status=status,
        observed_at=ManualClock()(),
        claimed=status,
        verified_provider_reference=None,
    )


async def test_a_zombies_observation_is_kept_once_and_counted() -> None:
    claim = await two_attempt_claim()
    merged = zombie_merged(claim, claim.attempt_records[1], observation(UNKNOWN))
    assert merged is not None
    assert [o.status for o in merged.observations] == [UNKNOWN]
    assert merged.metadata["verification_observation_count"] == 1
    # The same observation again (its number aside) adds nothing.
    again = zombie_merged(merged, merged.attempt_records[1], observation(UNKNOWN, number=7))
    assert again is None


async def test_merging_into_a_completed_receipt_settles_it_again() -> None:
    clock = ManualClock()
    ledger = InMemoryLedger(clock=clock)
    await crash_after_start(ActionRunner(ledger, owner="A"), key="k")
    clock.advance(LEASE)
    taken = await ActionRunner(ledger, owner="B").execute(
        "charge", counting(), request=REQUEST, idempotency_key="k"
    )
    completed = taken.receipt
    assert completed.claim_state is ClaimState.COMPLETED
    assert completed.final_status is UNKNOWN
    merged = zombie_merged(completed, seen(1, CONFIRMED, provider_request_id="ch_1"), None)
    assert merged is not None
    assert merged.claim_state is ClaimState.COMPLETED
    assert (merged.execution_status, merged.final_status) == (CONFIRMED, CONFIRMED)
    assert merged.owner == "B"
    # What the holder recorded stays: the zombie's facts are added, nothing is rewritten.
    noted = completed.evolve(error="TimeoutError: the response was lost")
    merged = zombie_merged(noted, seen(1, CONFIRMED, provider_request_id="ch_1"), None)
    assert merged is not None
    assert merged.error == "TimeoutError: the response was lost"


# -- recover_stale ---------------------------------------------------------------


class Crash(BaseException):
    """A worker dying mid-call."""


async def crash_with_reference(runner: ActionRunner, key: str) -> None:
    async def dies() -> None:
        raise Crash

    with pytest.raises(Crash):
        await runner.execute(
            "charge", dies, request=REQUEST, idempotency_key=key, provider_reference=f"ref-{key}"
        )


async def stranded(keys: tuple[str, ...] = ("a", "b")) -> tuple[ManualClock, InMemoryLedger]:
    """Claims whose worker died mid-call, each with a provider reference, leases run out."""
    clock = ManualClock()
    ledger = InMemoryLedger(clock=clock)
    dead = ActionRunner(ledger, owner="A")
    for key in keys:
        await crash_with_reference(dead, key)
    clock.advance(LEASE)
    return clock, ledger


async def test_a_sweep_passes_its_verifier_and_a_policy_that_never_retries() -> None:
    _, ledger = await stranded(("a",))
    confirmed = await ActionRunner(ledger, owner="S").recover_stale(
        lambda r: VerificationResult.confirmed(verified_provider_reference=r.provider_reference)
    )
    assert [r.status for r in confirmed] == [CONFIRMED]
    _, ledger = await stranded(("a",))
    absent = await ActionRunner(ledger, owner="S").recover_stale(
        lambda r: VerificationResult.absent(
            verified_provider_reference=r.provider_reference,
            retry_safe=True,
        )
    )
    assert [r.status for r in absent] == [FAILED]  # never a retry: a sweep has no operation


async def test_a_sweep_lists_only_stale_claims_and_at_most_its_limit() -> None:
    _clock, ledger = await stranded(("a", "b", "c"))
    await crash_with_reference(ActionRunner(ledger, owner="L"), "live")  # its lease runs from now
    faulty = FaultyLedger(ledger)
    first = await ActionRunner(faulty, owner="S").recover_stale(limit=2)
    assert len(first) == 2
    assert faulty.calls.count("take_over") == 2  # nothing else was even tried
    rest = await ActionRunner(faulty, owner="S").recover_stale()
    assert [r.receipt.idempotency_key for r in rest] == ["c"]
    assert faulty.calls.count("take_over") == 3  # the live claim was never listed
    held = await ledger.find("charge", "live")
    assert held is not None
    assert held.owner == "L"


async def test_a_sweep_goes_on_past_a_released_claim_and_a_renewed_one() -> None:
    clock = ManualClock()
    ledger = InMemoryLedger(clock=clock)
    # Only a v0.1 runner (before the fused claim) left a claim with no attempt started.
    await unstarted(
        ledger, "a-unstarted", request=REQUEST, provider_reference=None, owner="A", lease=LEASE
    )
    await crash_with_reference(ActionRunner(ledger, owner="A"), "b-started")
    await crash_with_reference(ActionRunner(ledger, owner="A"), "c-started")
    clock.advance(LEASE)
    faulty = FaultyLedger(ledger)

    def renew_b(method: str) -> None:
        if method == "take_over" and faulty.calls.count("take_over") == 2:
            (b,) = [r for r in ledger._by_id.values() if r.idempotency_key == "b-started"]
            ledger._by_id[b.action_id] = dataclasses.replace(
                b, lease_expires_at=clock() + timedelta(seconds=LEASE)
            )

    faulty.on_call = renew_b
    results = await ActionRunner(faulty, owner="S").recover_stale()
    assert [r.receipt.idempotency_key for r in results] == ["c-started"]
    assert await ledger.find("charge", "a-unstarted") is None  # released
    b = await ledger.find("charge", "b-started")
    assert b is not None
    assert b.owner == "A"
    assert b.is_pending


@pytest.mark.parametrize("meanwhile", ["its write failed", "another sweep took it"])
async def test_a_refused_take_over_is_tried_again_only_over_merged_evidence(meanwhile: str) -> None:
    """A sweep takes a claim over again, within the same sweep, only when a zombie's
    evidence was merged into it meanwhile (same holder, same fence, same lease). A
    take-over whose write failed, or a claim another sweep now holds, is tried once:
    the first is left stale for the next sweep, the second is not this sweep's."""
    clock, ledger = await stranded(("a",))
    faulty = FaultyLedger(ledger)
    (claim,) = list(ledger._by_id.values())
    if meanwhile == "its write failed":
        faulty.inject("take_over", LedgerFault.FAIL_BEFORE_WRITE)
    else:

        def taken_by_another_sweep(method: str) -> None:
            if method == "take_over":
                ledger._by_id[claim.action_id] = dataclasses.replace(
                    claim,
                    owner="T",
                    fencing_token=claim.fencing_token + 1,
                    lease_expires_at=clock() + timedelta(seconds=LEASE),
                    version=claim.version + 1,
                )

        faulty.on_call = taken_by_another_sweep
    assert await ActionRunner(faulty, owner="S").recover_stale() == []
    assert faulty.calls.count("take_over") == 1
    stored = await ledger.get(claim.action_id)
    assert stored is not None
    assert stored.is_pending
    assert stored.owner == ("A" if meanwhile == "its write failed" else "T")
    if meanwhile == "its write failed":
        faulty.on_call = None
        (settled,) = await ActionRunner(faulty, owner="S").recover_stale()  # the next sweep
        assert settled.receipt.owner == "S"


async def test_a_sweep_settles_the_stale_claims_of_its_own_namespace_only() -> None:
    clock = ManualClock()
    ledger = InMemoryLedger(clock=clock)
    for namespace in ("tenant-a", "tenant-b"):
        await crash_with_reference(ActionRunner(ledger, owner="A", namespace=namespace), "k")
    clock.advance(LEASE)
    results = await ActionRunner(ledger, owner="S", namespace="tenant-a").recover_stale()
    assert [(r.receipt.namespace, r.status) for r in results] == [("tenant-a", UNKNOWN)]
    other = await ledger.find("charge", "k", "tenant-b")
    assert other is not None
    assert other.is_pending
    assert other.owner == "A"  # not taken over: another tenant's claim


async def test_a_runner_without_leases_still_sweeps_under_the_default_lease() -> None:
    _, ledger = await stranded(("a",))
    results = await ActionRunner(ledger, owner="S", lease=None).recover_stale()
    assert [r.status for r in results] == [UNKNOWN]
    assert results[0].taken_over


async def test_a_sweep_error_event_carries_the_error_at_error_level() -> None:
    _, inner = await stranded(("a",))
    faulty = FaultyLedger(inner)
    faulty.inject("record", LedgerFault.FAIL_BEFORE_WRITE)
    seen_events = Recorder()
    assert await ActionRunner(faulty, owner="S", observers=[seen_events]).recover_stale() == []
    (event,) = seen_events.of(EventKind.STALE_CLAIM_NOT_SETTLED)
    assert event.level == logging.ERROR
    assert event.error is not None
    assert "injected" in str(event.error)


async def test_a_sweep_whose_verifier_raises_says_so_and_leaves_the_claim_unknown() -> None:
    _, ledger = await stranded(("a",))
    seen_events = Recorder()

    def broken(receipt: Any) -> VerificationResult:
        raise RuntimeError("provider API down")

    results = await ActionRunner(ledger, owner="S", observers=[seen_events]).recover_stale(broken)
    assert [r.status for r in results] == [UNKNOWN]
    (event,) = seen_events.of(EventKind.VERIFICATION_FAILED)
    assert event.receipt is not None
    assert event.receipt.idempotency_key == "a"
    assert event.level == logging.WARNING
    assert event.fields["source"] == "recover"
    assert "provider API down" in event.fields["said"]


async def test_a_listing_that_fails_stops_the_sweep_before_anything_is_settled() -> None:
    _, inner = await stranded(("a",))
    faulty = FaultyLedger(inner)
    faulty.inject("receipts", LedgerFault.FAIL_BEFORE_WRITE)
    with pytest.raises(NothingInvokedError) as info:
        await ActionRunner(faulty, owner="S").recover_stale()
    assert str(info.value).startswith("could not list the stale claims: ")
    assert "injected" in str(info.value)
    assert str(info.value).endswith("; nothing was settled")
    assert info.value.operation_invoked is False
    assert info.value.receipt is None
    assert faulty.calls == ["receipts"]


async def test_a_ledger_that_cannot_list_is_named_in_the_refusal() -> None:
    with pytest.raises(InvalidArgumentError) as info:
        await ActionRunner(Unlisted(), owner="S").recover_stale()
    assert str(info.value) == (
        "ledger Unlisted cannot list receipts, so it cannot be swept for stale claims"
    )


# -- settle_started and merge_zombie_evidence -----------------------------------------


async def test_a_takeover_settlement_is_no_replay_and_records_a_recovery_read() -> None:
    _, ledger = await stranded(("a",))
    plain = await ActionRunner(ledger, owner="B").execute(
        "charge", counting(), request=REQUEST, idempotency_key="a", provider_reference="ref-a"
    )
    assert plain.taken_over
    assert plain.replayed is False
    assert plain.receipt.recovery is not None
    assert plain.receipt.recovery.method == "take_over"
    _, ledger = await stranded(("a",))
    events = Recorder()
    verified = await ActionRunner(ledger, owner="B", observers=[events]).execute(
        "charge",
        counting(),
        request=REQUEST,
        idempotency_key="a",
        provider_reference="ref-a",
        verifier=lambda r: VerificationResult.absent(verified_provider_reference="ref-a"),
    )
    assert verified.taken_over
    assert verified.replayed is False
    assert [o.source for o in verified.receipt.observations] == [ObservationSource.RECOVER]
    assert verified.receipt.recovery is not None
    assert verified.receipt.recovery.method == "take_over"
    assert verified.receipt.recovery.attempts == 1
    assert len(events.of(EventKind.RECOVERED)) == 1
    assert events.of(EventKind.RECONCILED) == []


# 0: every observation that proves nothing new is dropped (as the machines
# lower it), which the retry must judge against the claim's own attempts.
@pytest.mark.parametrize("kept", [None, 0], ids=["default bound", "tightest bound"])
async def test_a_retry_after_a_takeover_keeps_the_stranded_attempts_proof_of_absence(
    kept: int | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    if kept is not None:
        monkeypatch.setattr(evidence_module, "MAX_KEPT_OBSERVATIONS", kept)
    clock = ManualClock()
    ledger = InMemoryLedger(clock=clock)
    dead = ActionRunner(ledger, owner="A")

    class Crash(BaseException):
        pass

    async def dies() -> None:
        raise Crash

    with pytest.raises(Crash):
        await dead.execute(
            "charge", dies, request=REQUEST, idempotency_key="k", provider_reference="ref"
        )
    clock.advance(LEASE)
    op = counting("ch_2")
    result = await ActionRunner(
        ledger, owner="B", policy=RetryPolicy(max_attempts=2, retry_on_failed=True)
    ).execute(
        "charge",
        op,
        request=REQUEST,
        idempotency_key="k",
        provider_reference="ref",
        verifier=lambda r: (
            VerificationResult.absent(verified_provider_reference="ref", retry_safe=True)
            if r.attempts == 1
            else VerificationResult.confirmed(verified_provider_reference="ref")
        ),
    )
    assert op.calls == [1]
    assert result.status is CONFIRMED
    first, second = result.receipt.attempt_records
    assert (first.execution_status, first.verification_status) == (UNKNOWN, FAILED)
    assert first.retry_decision == "retry"
    assert first.finished_at is not None
    assert second.execution_status is not None
    sources = [(o.source, o.attempt, o.status) for o in result.receipt.observations]
    assert sources[-1] == (ObservationSource.EXECUTE, 2, CONFIRMED)
    # Under the tightest bound the absence is dropped: attempt 1's own record
    # (verified FAILED, above) proves the same.
    assert ((ObservationSource.RECOVER, 1, FAILED) in sources) is (kept is None)
    # Counted as made, kept or not: the takeover's and attempt 2's.
    assert result.receipt.metadata["verification_observation_count"] == 2


async def test_a_merged_zombie_is_announced_with_its_attempt_and_its_verifiers_word() -> None:

    clock = ManualClock()
    inner = InMemoryLedger(clock=clock)
    seen_events = Recorder()
    zombie = await paused_holder(
        ActionRunner(inner, owner="A", observers=[seen_events]),
        outcome=TimeoutError("response lost"),
        provider_reference="ref",
        verifier=lambda r: VerificationResult.confirmed(verified_provider_reference="ref"),
    )
    clock.advance(LEASE)
    await ActionRunner(inner, owner="B").execute(
        "charge", counting(), request=REQUEST, idempotency_key="k", provider_reference="ref"
    )
    zombie.finish.set()
    from dataoad import ClaimFencedError

    with pytest.raises(ClaimFencedError):
        await zombie.task
    (event,) = seen_events.of(EventKind.ZOMBIE_EVIDENCE_MERGED)
    assert event.fields["attempt"] == 1
    assert event.receipt is not None
    stored = await inner.find("charge", "k")
    assert stored is not None
    assert event.receipt == stored
    # The zombie's verifier confirmed: its observation is in the receipt.
    assert [o.status for o in stored.observations][-1] is CONFIRMED
    assert stored.final_status is CONFIRMED
