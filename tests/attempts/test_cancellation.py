"""Cancellation after invocation leaves a safe barrier, never a silent retry."""

from __future__ import annotations

import asyncio
import threading
from typing import Any, TypeVar

import pytest

from dataoad import (
    ActionInProgressError,
    ActionRunner,
    ActionStatus,
    ClaimState,
    DefinitiveFailure,
    InMemoryLedger,
    RecoveryRefusedError,
    VerificationResult,
    current_attempt,
)
from dataoad.testing import Charge, FakePaymentProvider, ManualClock, PaymentVerifier
from suite_support import REF, REQUEST, execute, fixed_verifier, reached

T = TypeVar("T")


async def test_a_call_cancelled_during_its_operation_stays_held_and_the_cancellation_propagates() -> (
    None
):
    """What the operation started may still act, as a crashed worker's may: the claim stays
    PENDING with its attempt counted, a later call meets it in progress, nothing runs again."""
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
    assert receipt.claim_state is ClaimState.PENDING
    assert receipt.attempts == 1
    assert receipt.attempt_records[0].finished_at is None
    with pytest.raises(ActionInProgressError):
        await runner.execute("a", slow, request={}, idempotency_key="k")
    assert calls == 1


def _token() -> int:
    context = current_attempt()
    assert context is not None
    return context.fencing_token


@pytest.mark.parametrize("operation", ["sync", "async handing its work to a thread"])
async def test_a_cancelled_call_whose_thread_still_runs_stays_held_until_fenced(
    operation: str,
) -> None:
    """Cancelling the caller stops neither a sync operation's thread nor the thread an async
    one handed its work to (``asyncio.to_thread``, how a sync SDK is called from an engine's
    async step). Completed UNKNOWN at once, the claim could be reconciled at the same fencing
    token before the thread sent its charge: absent, so FAILED, the key free, a second
    charge, and then the thread's. The claim stays held instead; once its lease runs out a
    takeover settles it read-only under the next token, to which the provider holds the
    thread's request."""
    clock = ManualClock()
    ledger = InMemoryLedger(clock=clock)
    provider = FakePaymentProvider()
    verifier = PaymentVerifier(provider)
    in_thread, send, sent = threading.Event(), threading.Event(), threading.Event()
    late: list[BaseException] = []

    def slow_charge() -> Charge:
        token = _token()
        in_thread.set()
        send.wait(30)  # a slow network: the request goes out only now
        try:
            return asyncio.run(
                provider.charge(
                    customer_id="c1", amount_cents=100, client_reference=REF, fencing_token=token
                )
            )
        except BaseException as exc:
            late.append(exc)
            raise
        finally:
            sent.set()

    async def charge() -> Charge:
        token = _token()
        return await provider.charge(
            customer_id="c1", amount_cents=100, client_reference=REF, fencing_token=token
        )

    async def handed_to_a_thread() -> Charge:
        return await asyncio.to_thread(slow_charge)

    first = slow_charge if operation == "sync" else handed_to_a_thread
    call: dict[str, Any] = {"request": REQUEST, "idempotency_key": "k", "provider_reference": REF}
    runner = ActionRunner(ledger, owner="A")
    task = asyncio.create_task(runner.execute("charge", first, **call))
    assert await asyncio.to_thread(in_thread.wait, 10)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    stored = await ledger.find("charge", "k")
    assert stored is not None
    assert (stored.claim_state, stored.attempts, stored.fencing_token) == (ClaimState.PENDING, 1, 1)
    with pytest.raises(RecoveryRefusedError, match="still PENDING"):
        await runner.reconcile(stored.action_id, verifier)
    with pytest.raises(ActionInProgressError):
        await runner.execute("charge", charge, verifier=verifier, **call)
    clock.advance(30.0)  # the lease (DEFAULT_LEASE) runs out
    taken = await ActionRunner(ledger, owner="B").execute(
        "charge", charge, verifier=verifier, **call
    )
    assert taken.taken_over
    assert taken.receipt.fencing_token == 2
    send.set()
    assert await asyncio.to_thread(sent.wait, 10)
    assert len(late) == 1
    assert isinstance(late[0], DefinitiveFailure)  # fenced: token 1 is older than 2
    assert provider.charges == []
    assert taken.status is ActionStatus.FAILED  # absent, and no request can land any more


async def test_a_call_cancelled_after_its_operation_returned_is_recorded_unknown() -> None:
    """Cancelled while its verifier reads: the operation's call is over, so the attempt is
    recorded COMPLETED UNKNOWN at once, with its evidence."""
    ledger = InMemoryLedger()
    runner = ActionRunner(ledger)
    started = asyncio.Event()

    async def charge() -> str:
        return "ch_1"

    async def slow_verifier(receipt: Any) -> VerificationResult:
        started.set()
        await asyncio.sleep(3600)
        raise AssertionError("never answers")

    task = asyncio.create_task(
        runner.execute(
            "charge",
            charge,
            request=REQUEST,
            idempotency_key="k",
            provider_reference=REF,
            metadata={"ticket": "T-1"},
            verifier=slow_verifier,
        )
    )
    await started.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    stored = await ledger.find("charge", "k")
    assert stored is not None
    assert stored.claim_state is ClaimState.COMPLETED
    assert stored.version == 2  # the fused claim (attempt 1 counted), then UNKNOWN
    assert stored.execution_status is ActionStatus.UNKNOWN
    assert stored.final_status is ActionStatus.UNKNOWN
    assert stored.verification_status is None
    assert stored.error == "CancelledError: cancelled after the operation was invoked"
    assert stored.metadata == {"ticket": "T-1"}
    (attempt,) = stored.attempt_records
    assert attempt.execution_status is ActionStatus.UNKNOWN
    assert attempt.error == "CancelledError: cancelled after the operation was invoked"
    assert attempt.retry_decision == "stop"
    assert attempt.finished_at is not None
    assert stored.updated_at >= attempt.finished_at


async def test_a_cancelled_attempt_keeps_the_observations_of_earlier_attempts() -> None:
    from dataoad import RetryPolicy

    ledger = InMemoryLedger()
    runner = ActionRunner(ledger, policy=RetryPolicy(max_attempts=2, retry_on_failed=True))
    retrying = asyncio.Event()
    calls = 0

    async def op() -> None:
        nonlocal calls
        calls += 1
        if calls == 1:
            raise TimeoutError("lost")

    async def verifier(receipt: Any) -> VerificationResult:
        if calls == 1:
            return VerificationResult.absent(verified_provider_reference=REF, retry_safe=True)
        retrying.set()  # the second attempt's call returned; its read-back hangs
        await asyncio.sleep(3600)
        raise AssertionError("never answers")

    task = asyncio.create_task(execute(runner, op, verifier=verifier))
    await reached(retrying, task)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    stored = await ledger.find("charge", "k")
    assert stored is not None
    assert stored.claim_state is ClaimState.COMPLETED
    assert stored.attempts == 2
    first, second = stored.attempt_records
    assert first.verification_status is ActionStatus.FAILED
    assert first.retry_decision == "retry"
    assert second.execution_status is ActionStatus.UNKNOWN
    assert stored.execution_status is ActionStatus.UNKNOWN
    assert stored.final_status is ActionStatus.UNKNOWN
    assert [o["attempt"] for o in stored.metadata["verification_observations"]] == [1]
    assert stored.metadata["verification_conflict"] is False


class _LoopClock:
    """The system's time through a clock of the test's own: renewals run as a task from the start."""

    def monotonic(self) -> float:
        return asyncio.get_running_loop().time()

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(seconds)


async def test_a_cancellation_arriving_while_the_renewals_end_reaches_the_caller() -> None:
    # The caller is cancelled as the operation returns; the first suspension
    # after it is where the attempt's renewal task is ended. Awaiting that
    # cancelled task swallowed the caller's cancellation: execute returned
    # CONFIRMED and asyncio.timeout never fired.
    ledger = InMemoryLedger()
    runner = ActionRunner(ledger, lease=30.0, clock=_LoopClock())
    calls = 0

    async def op() -> str:
        nonlocal calls
        calls += 1
        task = asyncio.current_task()
        assert task is not None
        task.cancel()
        return "charged"

    task = asyncio.create_task(runner.execute("a", op, request={}, idempotency_key="k"))
    with pytest.raises(asyncio.CancelledError):
        await task
    assert calls == 1
    [receipt] = ledger.snapshot()
    assert receipt.claim_state is ClaimState.COMPLETED
    assert receipt.final_status is ActionStatus.UNKNOWN  # cancelled after it was invoked
    assert not [t for t in asyncio.all_tasks() if "renew" in t.get_name()]


async def test_a_timeout_expiring_as_the_operation_returns_is_raised() -> None:
    runner = ActionRunner(InMemoryLedger(), lease=30.0, clock=_LoopClock())

    async def op() -> str:
        timeout.reschedule(asyncio.get_running_loop().time())  # expires at the next suspension
        return "charged"

    with pytest.raises(TimeoutError):
        async with asyncio.timeout(None) as timeout:
            await runner.execute("a", op, request={}, idempotency_key="k")


class _OutcomeWriteHeld(InMemoryLedger):
    """The first outcome write waits (forever) before, or after, it lands."""

    def __init__(self, *, lands: bool) -> None:
        super().__init__()
        self.lands = lands
        self.writes = 0
        self.waiting = asyncio.Event()

    async def record(self, receipt: Any) -> bool:
        self.writes += 1
        if self.writes > 1:
            return await super().record(receipt)
        done = await super().record(receipt) if self.lands else False
        self.waiting.set()
        await asyncio.sleep(3600)  # the caller is cancelled here
        return done


@pytest.mark.parametrize("lands", [False, True], ids=["write-held-before", "answer-held-after"])
async def test_a_cancellation_during_the_outcome_write_still_records_the_outcome(
    lands: bool,
) -> None:
    # The operation ran and returned: a cancellation while its outcome was
    # being written left the claim PENDING, its CONFIRMED lost, until a
    # lease or an operator settled it UNKNOWN.
    ledger = _OutcomeWriteHeld(lands=lands)
    runner = ActionRunner(ledger, lease=None)
    calls = 0

    async def op() -> str:
        nonlocal calls
        calls += 1
        return "charged"

    task = asyncio.create_task(
        runner.execute("a", op, request={}, idempotency_key="k", provider_reference=REF)
    )
    await reached(ledger.waiting, task)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert calls == 1
    assert ledger.writes == 2  # the outcome written once more, under the same condition
    [receipt] = ledger.snapshot()
    assert receipt.claim_state is ClaimState.COMPLETED
    assert receipt.final_status is ActionStatus.CONFIRMED
    assert receipt.execution_status is ActionStatus.CONFIRMED
    assert receipt.version == 2  # one outcome: the repeat of a write that landed is refused
    replay = await runner.execute("a", op, request={}, idempotency_key="k", provider_reference=REF)
    assert replay.replayed
    assert replay.status is ActionStatus.CONFIRMED
    assert calls == 1


def _cancelled_underneath() -> asyncio.Future[None]:
    # A future someone else cancelled (a closed client's): awaiting it
    # raises CancelledError although the awaiting task was never cancelled.
    future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
    future.cancel()
    return future


async def test_an_operation_raising_cancelled_error_of_its_own_is_an_unknown_outcome() -> None:
    ledger = InMemoryLedger()
    runner = ActionRunner(ledger)
    calls = 0

    async def op() -> None:
        nonlocal calls
        calls += 1
        await _cancelled_underneath()

    result = await runner.execute("a", op, request={}, idempotency_key="k")
    assert result.status is ActionStatus.UNKNOWN
    assert result.receipt.error == "CancelledError"
    assert calls == 1
    confirming = fixed_verifier(VerificationResult.confirmed(verified_provider_reference=REF))
    checked = await runner.execute(
        "a", op, request={}, idempotency_key="k2", provider_reference=REF, verifier=confirming
    )
    assert checked.status is ActionStatus.CONFIRMED  # read-back settles it
    assert calls == 2


async def test_a_verifier_raising_cancelled_error_of_its_own_is_no_answer() -> None:
    clock = ManualClock()
    ledger = InMemoryLedger(clock=clock)
    runner = ActionRunner(ledger, owner="A", lease=30.0)

    async def cancelled_read(receipt: Any) -> VerificationResult:
        await _cancelled_underneath()
        raise AssertionError("unreachable")

    async def lost() -> None:
        raise TimeoutError("response lost")

    result = await runner.execute(
        "a", lost, request={}, idempotency_key="k", provider_reference=REF, verifier=cancelled_read
    )
    assert result.status is ActionStatus.UNKNOWN
    [observation] = result.receipt.observations
    assert observation.error == "verifier raised CancelledError"
    settled = await runner.reconcile(result.receipt.action_id, cancelled_read)
    assert settled.status is ActionStatus.UNKNOWN
    # A sweep over two stale claims settles both, though the verifier's
    # answer for the first was a CancelledError of its own.
    held, running = asyncio.Event(), asyncio.Semaphore(0)

    async def hang() -> None:
        running.release()
        await held.wait()

    dead = ActionRunner(ledger, owner="dead", lease=30.0)
    hung = [
        asyncio.create_task(
            dead.execute("a", hang, request={}, idempotency_key=k, provider_reference=REF)
        )
        for k in ("s1", "s2")
    ]
    for _ in hung:
        await running.acquire()
    clock.advance(60)
    swept = await ActionRunner(ledger, owner="sweeper", lease=30.0).recover_stale(cancelled_read)
    assert [r.status for r in swept] == [ActionStatus.UNKNOWN, ActionStatus.UNKNOWN]
    assert all(r.claim_state is ClaimState.COMPLETED for r in ledger.snapshot())
    for task in hung:
        task.cancel()
    await asyncio.gather(*hung, return_exceptions=True)


async def test_a_caller_cancelled_while_its_verifier_reads_is_cancelled() -> None:
    # Only a CancelledError the caller did not ask for is a verifier's "no
    # answer"; the caller's own goes through, and the attempt is UNKNOWN.
    ledger = InMemoryLedger()
    runner = ActionRunner(ledger)
    reading = asyncio.Event()

    async def slow_read(receipt: Any) -> VerificationResult:
        reading.set()
        await asyncio.sleep(3600)
        raise AssertionError("unreachable")

    async def lost() -> None:
        raise TimeoutError("response lost")

    task = asyncio.create_task(
        runner.execute(
            "a", lost, request={}, idempotency_key="k", provider_reference=REF, verifier=slow_read
        )
    )
    await reached(reading, task)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    [stored] = ledger.snapshot()
    assert stored.claim_state is ClaimState.COMPLETED
    assert stored.final_status is ActionStatus.UNKNOWN
    assert stored.observations == ()  # the read was cut off: no answer recorded
