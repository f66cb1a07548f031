"""What a worker that lost its claim is told, and what it leaves behind.

A fenced worker learns it in one of three places: its outcome write (its
operation ran), the start of its next attempt (an earlier one ran), or the
merge of a verification it made as a taker (nothing ran). Each raises
ClaimFencedError; these pin its words and facts, and that what the worker
saw lands in the new owner's receipt, never over it.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import pytest

from dataoad import (
    ActionReceipt,
    ActionRunner,
    ActionStatus,
    ClaimFencedError,
    DefinitiveFailure,
    EventKind,
    InMemoryLedger,
    RetryPolicy,
    SQLiteLedger,
    VerificationResult,
)
from dataoad import _evidence as evidence_module
from dataoad.testing import FaultyLedger, LedgerFault, ManualClock
from suite_support import Recorder, unstarted
from suite_support.leases import LEASE, REQUEST, counting

REF = "ref-k"


def confirms(receipt: ActionReceipt) -> VerificationResult:
    return VerificationResult.confirmed(verified_provider_reference=REF)


async def zombie_and_taker(
    operation: Any,
    verifier: Any = None,
    policy: RetryPolicy | None = None,
    observers: tuple[Any, ...] = (),
) -> tuple[InMemoryLedger, asyncio.Task[Any], ActionReceipt, asyncio.Event]:
    """A holds the claim mid-call past its lease; B takes it over and settles it UNKNOWN.

    A's call is paused until the returned event is set.
    """
    clock = ManualClock()
    ledger = InMemoryLedger(clock=clock)
    started = asyncio.Event()
    finish = asyncio.Event()

    async def paused() -> Any:
        started.set()
        await finish.wait()
        return await operation()

    zombie = asyncio.create_task(
        ActionRunner(ledger, owner="A", policy=policy, observers=list(observers)).execute(
            "charge",
            paused,
            request=REQUEST,
            idempotency_key="k",
            provider_reference=REF,
            verifier=verifier,
            metadata={"order": "o-1"},
        )
    )
    await started.wait()
    clock.advance(LEASE)
    taken = await ActionRunner(ledger, owner="B").execute(
        "charge", counting(), request=REQUEST, idempotency_key="k", provider_reference=REF
    )
    assert taken.taken_over
    assert taken.status is ActionStatus.UNKNOWN
    return ledger, zombie, taken.receipt, finish


async def charge() -> str:
    return "ch_1"


async def test_a_zombie_fenced_at_its_outcome_is_told_so_with_what_it_saw() -> None:
    seen = Recorder()
    ledger, zombie, taken, finish = await zombie_and_taker(charge, observers=(seen,))
    finish.set()
    with pytest.raises(ClaimFencedError) as info:
        await zombie
    error = info.value
    assert str(error) == (
        f"action {taken.action_id} was taken over by 'B' (its lease had run out); this "
        "worker's outcome (CONFIRMED) is evidence only. The operation WAS invoked: do not "
        "repeat it"
    )
    assert error.operation_invoked is True
    assert error.observed_status is ActionStatus.CONFIRMED
    assert error.value_available is True
    assert error.observed_value == "ch_1"
    assert error.observed_metadata is not None
    assert error.observed_metadata["order"] == "o-1"
    stored = await ledger.get(taken.action_id)
    assert error.receipt == stored
    assert stored is not None
    assert stored.owner == "B"
    assert stored.final_status is ActionStatus.CONFIRMED
    assert stored.observations == ()  # A had no verifier: no observation to merge
    # B's takeover is still on record: the merge rebuilt the metadata with it.
    assert stored.recovery is not None
    assert stored.recovery.method == "take_over"
    (event,) = seen.of(EventKind.FENCED)
    assert event.level == logging.WARNING
    assert event.receipt is not None
    assert event.receipt.owner == "B"  # the receipt that shows who holds it now


# 0: the receipt keeps only observations that prove something new, judged
# against the claim's attempts (the state machines lower the bound too).
@pytest.mark.parametrize("kept", [None, 0], ids=["default bound", "tightest bound"])
async def test_a_zombie_with_a_verifier_leaves_its_bound_confirmation(
    kept: int | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    if kept is not None:
        monkeypatch.setattr(evidence_module, "MAX_KEPT_OBSERVATIONS", kept)
    ledger, zombie, taken, finish = await zombie_and_taker(charge, verifier=confirms)
    finish.set()
    with pytest.raises(ClaimFencedError):
        await zombie
    stored = await ledger.get(taken.action_id)
    assert stored is not None
    assert stored.owner == "B"
    assert [o.verified_provider_reference for o in stored.observations] == [REF]
    assert stored.final_status is ActionStatus.CONFIRMED
    # The settlement's own facts are derived again from the merged evidence.
    assert stored.metadata["verification_conflict"] is False
    assert stored.metadata["provider_request_id_conflict"] is False
    assert "provider_request_ids" in stored.metadata
    assert stored.recovery is not None


async def declined() -> str:
    raise DefinitiveFailure("card declined", retryable=True)


def absent(receipt: ActionReceipt) -> VerificationResult:
    return VerificationResult.absent(verified_provider_reference=REF, retry_safe=True)


RETRY_FAILED = RetryPolicy(max_attempts=2, retry_on_failed=True)


async def test_a_zombie_fenced_before_its_retry_is_told_its_earlier_attempt_ran() -> None:
    seen = Recorder()
    ledger, zombie, taken, finish = await zombie_and_taker(
        declined, policy=RETRY_FAILED, observers=(seen,)
    )
    finish.set()
    with pytest.raises(ClaimFencedError) as info:
        await zombie
    error = info.value
    assert str(error) == (
        f"action {taken.action_id} was taken over by 'B' (its lease had run out) after "
        "attempt 1 of this call WAS invoked: do not repeat it. What this worker saw was "
        "merged into the receipt as evidence"
    )
    assert error.operation_invoked is True
    assert error.observed_status is ActionStatus.FAILED
    assert error.observed_metadata is not None
    assert error.observed_metadata["order"] == "o-1"
    assert error.value_available is False
    assert error.observed_value is None
    stored = await ledger.get(taken.action_id)
    assert error.receipt == stored
    assert stored is not None
    assert stored.owner == "B"
    assert stored.attempts == 1  # the retry never started
    (event,) = seen.of(EventKind.FENCED)
    assert event.level == logging.WARNING
    assert event.receipt is not None
    assert event.receipt.owner == "B"
    assert stored.attempt_records[0].execution_status is ActionStatus.FAILED


async def times_out() -> str:
    raise TimeoutError("no answer")


async def test_a_zombie_fenced_before_its_retry_leaves_its_verifiers_answer() -> None:
    # Attempt 1's answer was lost; A's verifier found it absent (retry-safe),
    # so A would retry, but B took the claim over meanwhile.
    ledger, zombie, taken, finish = await zombie_and_taker(
        times_out, verifier=absent, policy=RETRY_FAILED
    )
    finish.set()
    with pytest.raises(ClaimFencedError) as info:
        await zombie
    assert info.value.observed_status is ActionStatus.FAILED
    assert "after attempt 1 of this call WAS invoked" in str(info.value)  # at the retry's start
    # What A saw, with its verifier's word and the settlement it supports.
    seen_metadata = info.value.observed_metadata
    assert seen_metadata is not None
    assert seen_metadata["verification"]["verified_provider_reference"] == REF
    assert seen_metadata["verification_conflict"] is False
    stored = await ledger.get(taken.action_id)
    assert stored is not None
    assert stored.owner == "B"
    assert stored.attempts == 1
    assert [o.verified_provider_reference for o in stored.observations] == [REF]
    assert stored.final_status is ActionStatus.FAILED


async def stranded_claim() -> tuple[ManualClock, InMemoryLedger, str]:
    """A claim whose worker died mid-call; its lease has run out."""
    clock = ManualClock()
    ledger = InMemoryLedger(clock=clock)

    class Crash(BaseException):
        pass

    async def dies() -> None:
        raise Crash

    with pytest.raises(Crash):
        await ActionRunner(ledger, owner="A").execute(
            "charge", dies, request=REQUEST, idempotency_key="k", provider_reference=REF
        )
    clock.advance(LEASE)
    stored = await ledger.find("charge", "k")
    assert stored is not None
    return clock, ledger, stored.action_id


async def test_a_taker_whose_claim_is_taken_again_while_it_verifies_writes_nothing() -> None:
    clock, ledger, action_id = await stranded_claim()
    third: list[ActionReceipt] = []

    async def slow_confirmation(receipt: ActionReceipt) -> VerificationResult:
        # B verifies so long that its own lease runs out and C takes over.
        clock.advance(LEASE)
        done = await ActionRunner(ledger, owner="C").execute(
            "charge", counting(), request=REQUEST, idempotency_key="k", provider_reference=REF
        )
        third.append(done.receipt)
        return confirms(receipt)

    with pytest.raises(ClaimFencedError) as info:
        await ActionRunner(ledger, owner="B").execute(
            "charge",
            counting(),
            request=REQUEST,
            idempotency_key="k",
            provider_reference=REF,
            verifier=slow_confirmation,
        )
    error = info.value
    assert str(error) == (
        f"action {action_id} was taken over by 'C' while this runner verified it; "
        "nothing was invoked"
    )
    assert error.operation_invoked is False
    assert error.receipt == third[0]
    assert await ledger.get(action_id) == third[0]  # C's settlement stands, untouched


async def test_an_operator_recovery_merges_into_a_claim_taken_over_meanwhile() -> None:
    _, ledger, action_id = await stranded_claim()

    def confirmation_after_a_takeover(receipt: ActionReceipt) -> VerificationResult:
        # Another worker takes the claim over (a new fence) while the
        # operator's verifier runs; the evidence is bound all the same.
        current = ledger._by_id[action_id]
        ledger._by_id[action_id] = current.evolve(
            owner="C", fencing_token=current.fencing_token + 1, version=current.version + 1
        )
        return confirms(receipt)

    result = await ActionRunner(ledger, owner="operator").recover_pending(
        action_id, confirmation_after_a_takeover
    )
    assert result.status is ActionStatus.CONFIRMED
    assert not result.taken_over
    stored = await ledger.get(action_id)
    assert stored == result.receipt
    assert stored is not None
    assert stored.owner == "C"
    assert stored.fencing_token == 2


async def test_a_zombie_fenced_before_its_third_attempt_reports_all_it_ran() -> None:
    # Attempt 1 failed (retryable), attempt 2's answer was lost: UNKNOWN over
    # both, whatever attempt 1 alone said.
    clock = ManualClock()
    ledger = InMemoryLedger(clock=clock)
    second_started = asyncio.Event()
    finish = asyncio.Event()
    calls = 0

    async def op() -> str:
        nonlocal calls
        calls += 1
        if calls == 1:
            raise DefinitiveFailure("try again", retryable=True)
        second_started.set()
        await finish.wait()
        raise TimeoutError("no answer")

    with pytest.warns(RuntimeWarning):  # the escape hatch says what it risks
        policy = RetryPolicy(max_attempts=3, retry_on_failed=True, retry_on_unknown=True)
    zombie = asyncio.create_task(
        ActionRunner(ledger, owner="A", policy=policy).execute(
            "charge", op, request=REQUEST, idempotency_key="k"
        )
    )
    await second_started.wait()
    clock.advance(LEASE)
    taken = await ActionRunner(ledger, owner="B").execute(
        "charge", counting(), request=REQUEST, idempotency_key="k"
    )
    assert taken.taken_over
    finish.set()
    with pytest.raises(ClaimFencedError) as info, pytest.warns(RuntimeWarning):
        await zombie
    assert info.value.observed_status is ActionStatus.UNKNOWN
    assert "after attempt 2 of this call WAS invoked" in str(info.value)
    assert calls == 2


async def test_a_holder_fenced_before_its_first_attempt_is_told_nothing_ran() -> None:
    clock = ManualClock()
    ledger = InMemoryLedger(clock=clock)
    # A claim whose attempt 1 never started (a v0.1 runner's): A takes it
    # over, and its own attempt start is the write that gets fenced.
    await unstarted(ledger, request=REQUEST, provider_reference=None, owner="old", lease=LEASE)
    clock.advance(LEASE)
    seen = Recorder()
    original = ledger.start_attempt

    async def late_start(receipt: ActionReceipt, **lease: Any) -> bool:
        if receipt.owner == "A":
            clock.advance(LEASE)  # A stalls before its write lands; B takes over
            await ActionRunner(ledger, owner="B").execute(
                "charge", counting(), request=REQUEST, idempotency_key="k"
            )
        return await original(receipt, **lease)

    ledger.start_attempt = late_start  # type: ignore[method-assign]
    op = counting()
    with pytest.raises(ClaimFencedError) as info:
        await ActionRunner(ledger, owner="A", observers=[seen]).execute(
            "charge", op, request=REQUEST, idempotency_key="k"
        )
    error = info.value
    stored = await ledger.find("charge", "k")
    assert stored is not None
    assert str(error) == (
        f"action {stored.action_id} was taken over by 'B' before attempt 1 could start; "
        "the operation was not invoked"
    )
    assert error.operation_invoked is False
    assert op.calls == []
    (event,) = seen.of(EventKind.FENCED)
    assert event.level == logging.WARNING
    assert event.receipt is not None
    assert event.receipt.owner == "B"


@pytest.mark.parametrize("backend", ["memory", "sqlite"])
async def test_a_zombie_whose_outcome_write_fails_is_still_told_it_was_fenced(
    backend: str, tmp_path: Any
) -> None:
    # The fenced holder's write raised (a transient error) instead of being
    # refused. The read-back shows the new owner either way: what the holder
    # saw is evidence, merged, not an outcome "not recorded" and lost.
    clock = ManualClock()
    inner: Any = (
        InMemoryLedger(clock=clock)
        if backend == "memory"
        else SQLiteLedger(tmp_path / "l.sqlite3", clock=clock)
    )
    seen_by_a = FaultyLedger(inner)
    started, finish = asyncio.Event(), asyncio.Event()

    async def paused() -> str:
        started.set()
        await finish.wait()
        return "ch_1"

    zombie = asyncio.create_task(
        ActionRunner(seen_by_a, owner="A").execute(
            "charge", paused, request=REQUEST, idempotency_key="k", provider_reference=REF
        )
    )
    await started.wait()
    clock.advance(LEASE)
    taken = await ActionRunner(inner, owner="B").execute(
        "charge", counting(), request=REQUEST, idempotency_key="k", provider_reference=REF
    )
    assert taken.taken_over
    assert taken.status is ActionStatus.UNKNOWN
    seen_by_a.inject("record", LedgerFault.FAIL_BEFORE_WRITE)
    finish.set()
    with pytest.raises(ClaimFencedError) as info:
        await zombie
    assert info.value.operation_invoked is True
    assert info.value.observed_status is ActionStatus.CONFIRMED
    stored = await inner.get(taken.receipt.action_id)
    assert stored is not None
    assert info.value.receipt == stored
    assert stored.owner == "B"
    assert stored.final_status is ActionStatus.CONFIRMED  # A's direct success, merged
    assert stored.attempt_records[0].execution_status is ActionStatus.CONFIRMED
    if backend == "sqlite":
        await inner.close()
