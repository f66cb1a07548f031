"""Sync code and threads: where blocking work runs, and what an outcome reports.

Each test names the rule it holds; they run on every backend the rule
concerns (``backend``: memory, SQLite, PostgreSQL).
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest

from dataoad import (
    ActionInProgressError,
    ActionPersistenceError,
    ActionRunner,
    ActionStatus,
    ClaimState,
    InMemoryLedger,
    Ledger,
    RetryPolicy,
    SyncActionRunner,
    VerificationResult,
    run_tool,
)
from dataoad.testing import FaultyLedger, LedgerFault
from suite_support import REF, REQUEST, closing, reconciled_at_once

request_id: contextvars.ContextVar[str] = contextvars.ContextVar("request_id", default="none")


# -- 1. sync operations and verifiers never run on the event loop ---------------


class LoopWitness:
    """Tells whether the event loop ran a task while a sync callable was blocked.

    The callable calls ``blocked_until_the_loop_turns()``; a task on the loop
    waits for that moment and lets it go. Had the callable run on the loop
    (or the loop waited for it), the task could not run and the wait ends
    in False after ``TIMEOUT`` seconds: judged by an event, not by a timed
    gap between loop turns, so a loaded machine cannot fail it.
    """

    TIMEOUT = 10.0

    def __init__(self) -> None:
        self._inside = threading.Event()
        self._turned = threading.Event()
        self.seen: list[bool] = []

    def blocked_until_the_loop_turns(self) -> None:
        """Called inside the sync callable: blocks until a loop task ran (or the timeout)."""
        self._inside.set()
        self.seen.append(self._turned.wait(self.TIMEOUT))

    async def run(self, work: Any) -> Any:
        """Await ``work`` while the witness task waits on the loop."""

        async def witness() -> None:
            # The wait is another thread's; what follows it runs on the loop.
            if await asyncio.to_thread(self._inside.wait, self.TIMEOUT):
                self._turned.set()

        task = asyncio.create_task(witness())
        try:
            return await work
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task


@pytest.mark.asyncio
async def test_a_sync_operation_runs_off_the_loop_with_the_callers_context(
    new_ledger: Callable[[], Ledger],
) -> None:
    ledger = new_ledger()
    seen: list[tuple[str, bool]] = []

    loop = LoopWitness()

    def blocking_charge() -> str:
        loop.blocked_until_the_loop_turns()
        seen.append((request_id.get(), threading.current_thread() is threading.main_thread()))
        return "ch_1"

    request_id.set("req-42")
    try:
        result = await loop.run(
            ActionRunner(ledger).execute(
                "charge", blocking_charge, request=REQUEST, idempotency_key="k"
            )
        )
    finally:
        await closing(ledger)
    assert result.status is ActionStatus.CONFIRMED
    assert result.value == "ch_1"
    # It ran on another thread, with the caller's context variables.
    assert seen == [("req-42", False)]
    # While it blocked, the loop went on running other tasks.
    assert loop.seen == [True], "the event loop did not run while the sync operation blocked"


@pytest.mark.asyncio
async def test_a_sync_verifier_runs_off_the_loop(new_ledger: Callable[[], Ledger]) -> None:
    ledger = new_ledger()

    loop = LoopWitness()

    def slow_verifier(receipt: Any) -> VerificationResult:
        loop.blocked_until_the_loop_turns()
        assert threading.current_thread() is not threading.main_thread()
        return VerificationResult.confirmed(verified_provider_reference=receipt.provider_reference)

    async def timeout() -> None:
        raise TimeoutError("lost response")

    try:
        result = await loop.run(
            ActionRunner(ledger).execute(
                "charge",
                timeout,
                request=REQUEST,
                idempotency_key="k",
                provider_reference=REF,
                verifier=slow_verifier,
            )
        )
    finally:
        await closing(ledger)
    assert result.status is ActionStatus.CONFIRMED
    assert result.receipt.execution_status is ActionStatus.UNKNOWN
    assert loop.seen == [True], "the event loop did not run while the sync verifier blocked"


@pytest.mark.asyncio
async def test_cancelling_execute_while_a_sync_operation_runs_leaves_the_claim_held(
    new_ledger: Callable[[], Ledger],
) -> None:
    """The thread may still charge: the claim stays PENDING (never settled at this fencing
    token while it runs, see tests/attempts/test_cancellation.py) and is never run again."""
    ledger = new_ledger()
    started = threading.Event()
    release = threading.Event()
    calls: list[int] = []

    def stuck_charge() -> str:
        calls.append(1)
        started.set()
        release.wait(10)  # a thread cannot be stopped: it finishes on its own
        return "ch_1"

    runner = ActionRunner(ledger)
    try:
        task = asyncio.create_task(
            runner.execute("charge", stuck_charge, request=REQUEST, idempotency_key="k")
        )
        # started is a threading.Event, set on the operation's thread.
        assert await asyncio.to_thread(started.wait, 10)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        stored = await ledger.find("charge", "k")
        assert stored is not None
        assert stored.claim_state is ClaimState.PENDING
        assert stored.attempts == 1
        assert stored.attempt_records[0].execution_status is None  # started, never finished
        # Calling again meets the claim in progress: never a second charge.
        with pytest.raises(ActionInProgressError):
            await runner.execute("charge", stuck_charge, request=REQUEST, idempotency_key="k")
        assert calls == [1]
    finally:
        release.set()
        await closing(ledger)


# -- 2. SyncActionRunner: many threads at once ------------------------------------------


def test_sync_runner_threads_run_their_blocking_operations_concurrently(
    new_ledger: Callable[[], Ledger],
) -> None:
    threads = 8
    # Every operation waits until all eight are inside at once. If calls were
    # funnelled through one loop (or one worker), the barrier would never
    # fill and every operation would fail after its timeout.
    all_inside = threading.Barrier(threads, timeout=20)
    callers: list[str] = []
    lock = threading.Lock()

    def blocking_charge() -> str:
        with lock:
            callers.append(threading.current_thread().name)
        all_inside.wait()
        time.sleep(0.5)
        return "ok"

    results: dict[int, Any] = {}
    with SyncActionRunner(new_ledger()) as runner:

        def worker(n: int) -> None:
            results[n] = runner.execute(
                "charge", blocking_charge, request={"n": n}, idempotency_key=f"k{n}"
            )

        pool = [
            threading.Thread(target=worker, args=(n,), name=f"caller-{n}") for n in range(threads)
        ]
        started = time.monotonic()
        for t in pool:
            t.start()
        for t in pool:
            t.join(60)
        elapsed = time.monotonic() - started
    assert sorted(results) == list(range(threads))
    assert all(r.status is ActionStatus.CONFIRMED for r in results.values()), [
        (r.status, r.receipt.error) for r in results.values()
    ]
    # Each operation ran on the thread that called execute.
    assert sorted(callers) == sorted(f"caller-{n}" for n in range(threads))
    # Loose bound (one 0.5 s operation each, not 8 x 0.5 s in a row); the
    # barrier above is the real check.
    assert elapsed < 3.5


def test_sync_runner_is_safe_for_duplicates_across_threads(
    new_ledger: Callable[[], Ledger],
) -> None:
    calls: list[int] = []
    lock = threading.Lock()

    def charge() -> str:
        with lock:
            calls.append(1)
        time.sleep(0.2)
        return "ok"

    outcomes: list[Any] = []
    with SyncActionRunner(new_ledger()) as runner:

        def worker() -> None:
            try:
                outcomes.append(
                    runner.execute(
                        "charge",
                        charge,
                        request=REQUEST,
                        idempotency_key="same",
                        wait_in_progress=5,
                    )
                )
            except Exception as exc:  # pragma: no cover - reported by the assertion below
                outcomes.append(exc)

        pool = [threading.Thread(target=worker) for _ in range(6)]
        for t in pool:
            t.start()
        for t in pool:
            t.join(30)
    assert calls == [1]
    assert len(outcomes) == 6
    assert sum(1 for o in outcomes if getattr(o, "replayed", None) is False) == 1
    assert all(o.status is ActionStatus.CONFIRMED for o in outcomes), outcomes


# -- 6. verifier answers are storable ----------------------------------------------


UNSTORABLE_REASONS = {
    "lone surrogate": "gateway said b'\\xff': " + b"\xff\xfe".decode("utf-8", "surrogateescape"),
    "NUL": "upstream\x00error",
    "too long": "x" * 5000,
}


@pytest.mark.parametrize("case", sorted(UNSTORABLE_REASONS))
@pytest.mark.asyncio
async def test_a_verifier_reason_never_makes_an_invoked_outcome_unrecordable(
    new_ledger: Callable[[], Ledger], case: str
) -> None:
    reason = UNSTORABLE_REASONS[case]
    ledger = new_ledger()

    def verifier(receipt: Any) -> VerificationResult:
        return VerificationResult.unknown(reason=reason)

    async def timeout() -> None:
        raise TimeoutError("lost response")

    runner = ActionRunner(ledger)
    try:
        result = await runner.execute(
            "charge",
            timeout,
            request=REQUEST,
            idempotency_key="k",
            provider_reference=REF,
            verifier=verifier,
        )
        assert result.status is ActionStatus.UNKNOWN
        stored = await ledger.get(result.receipt.action_id)
        assert stored is not None
        assert stored.claim_state is ClaimState.COMPLETED
        recorded = stored.metadata["verification"]["reason"]
        recorded.encode("utf-8")  # storable everywhere
        assert "\x00" not in recorded
        assert len(recorded) <= 1000
        # Replays with the same verifier keep working, and keep it settled.
        again = await runner.execute(
            "charge",
            timeout,
            request=REQUEST,
            idempotency_key="k",
            provider_reference=REF,
            verifier=verifier,
        )
        assert again.replayed is True
        assert again.status is ActionStatus.UNKNOWN
    finally:
        await closing(ledger)


@pytest.mark.asyncio
async def test_recover_pending_records_an_unstorable_reason_too(
    new_ledger: Callable[[], Ledger],
) -> None:
    ledger = new_ledger()
    faulty = FaultyLedger(ledger)
    faulty.inject("record", LedgerFault.FAIL_BEFORE_WRITE)

    async def timeout() -> None:
        raise TimeoutError("lost response")

    try:
        with pytest.raises(ActionPersistenceError) as stranded:
            await ActionRunner(faulty).execute(
                "charge", timeout, request=REQUEST, idempotency_key="k", provider_reference=REF
            )
        action_id = stranded.value.action_id
        assert action_id is not None
        reason = UNSTORABLE_REASONS["lone surrogate"]
        recovered = await ActionRunner(ledger).recover_pending(
            action_id, lambda r: VerificationResult.unknown(reason=reason)
        )
        assert recovered.status is ActionStatus.UNKNOWN
        assert recovered.receipt.claim_state is ClaimState.COMPLETED
    finally:
        await closing(ledger)


# -- 7. operation_invoked covers every attempt of the call ----------------------------


async def retry_whose_start_fails(
    ledger: Ledger, *, ran: int, max_attempts: int
) -> tuple[ActionPersistenceError, list[int]]:
    """Retryable rejections; the start of attempt ``ran + 1`` fails to be written.

    Returns the error execute raised and one entry per invocation.
    """
    from dataoad import DefinitiveFailure

    faulty = FaultyLedger(ledger)
    calls: list[int] = []

    async def rejected() -> None:
        calls.append(1)
        if len(calls) == ran:  # arm it now: the next start_attempt fails
            faulty.inject("start_attempt", LedgerFault.FAIL_BEFORE_WRITE)
        raise DefinitiveFailure("busy", retryable=True)

    policy = RetryPolicy(max_attempts=max_attempts, retry_on_failed=True)
    with pytest.raises(ActionPersistenceError) as raised:
        await ActionRunner(faulty, policy=policy).execute(
            "charge", rejected, request=REQUEST, idempotency_key="k"
        )
    return raised.value, calls


@pytest.mark.asyncio
async def test_a_retry_that_cannot_start_reports_that_the_first_attempt_ran(
    new_ledger: Callable[[], Ledger],
) -> None:
    ledger = new_ledger()
    try:
        error, calls = await retry_whose_start_fails(ledger, ran=1, max_attempts=3)
    finally:
        await closing(ledger)
    assert calls == [1]
    assert error.operation_invoked is True
    assert error.observed_status is ActionStatus.FAILED
    assert "not invoked" not in str(error).split(";")[-1]
    assert "earlier attempt(s) of this call WERE invoked" in str(error)


@pytest.mark.asyncio
async def test_a_retry_that_cannot_start_after_an_ambiguous_attempt_reports_unknown() -> None:
    faulty = FaultyLedger(InMemoryLedger())
    import warnings

    async def times_out() -> str:
        faulty.inject("start_attempt", LedgerFault.FAIL_BEFORE_WRITE)
        raise TimeoutError("lost")

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        policy = RetryPolicy(max_attempts=2, retry_on_unknown=True)
        with pytest.raises(ActionPersistenceError) as raised:
            await ActionRunner(faulty, policy=policy).execute(
                "charge", times_out, request=REQUEST, idempotency_key="k"
            )
    assert raised.value.operation_invoked is True
    assert raised.value.observed_status is ActionStatus.UNKNOWN


# -- 8. the tool outcome reads the receipt an error carries ---------------------------


@pytest.mark.asyncio
async def test_a_replay_whose_check_cannot_be_recorded_tells_the_model_unknown(
    new_ledger: Callable[[], Ledger],
) -> None:
    ledger = new_ledger()
    faulty = FaultyLedger(ledger)
    charges: list[int] = []

    async def charge() -> None:
        charges.append(1)
        raise TimeoutError("the charge went through, the answer was lost")

    runner = ActionRunner(faulty)
    try:
        first = await run_tool(
            runner, "charge", charge, request=REQUEST, idempotency_key="k", provider_reference=REF
        )
        assert first.status == "UNKNOWN"
        # The model calls again; the replay's read-only check cannot be
        # recorded (the write fails, and so does the read-back).
        faulty.inject("record", LedgerFault.FAIL_BEFORE_WRITE)
        faulty.inject("get", LedgerFault.FAIL_BEFORE_WRITE)
        again = await run_tool(
            runner,
            "charge",
            charge,
            request=REQUEST,
            idempotency_key="k",
            provider_reference=REF,
            verifier=lambda r: VerificationResult.unknown(reason="read path down"),
        )
    finally:
        await closing(ledger)
    assert charges == [1]
    assert again.status == "UNKNOWN", again.message
    assert again.action_id == first.action_id
    assert "Do NOT call this tool again" in again.message
    assert "Nothing was changed" not in again.message
    assert "NOT ATTEMPTED" not in again.message


# -- 9. observations stay bounded under repeated replays ------------------------------


@pytest.mark.asyncio
async def test_repeated_replays_with_a_verifier_keep_the_receipt_bounded(
    new_ledger: Callable[[], Ledger],
) -> None:
    from dataoad._evidence import MAX_KEPT_OBSERVATIONS

    assert MAX_KEPT_OBSERVATIONS == 16  # the README's bound
    ledger = new_ledger()

    async def timeout() -> None:
        raise TimeoutError("lost")

    runner = ActionRunner(ledger)
    replays = 3 * MAX_KEPT_OBSERVATIONS
    try:
        first = await runner.execute(
            "charge", timeout, request=REQUEST, idempotency_key="k", provider_reference=REF
        )
        # Two reconcilers read at once and contradict each other (a fenced
        # absence, a confirmation): the receipt becomes UNKNOWN and must keep
        # both, however many observations come after.
        absent = VerificationResult.absent(verified_provider_reference=REF, retry_safe=True)
        confirmed = VerificationResult.confirmed(
            verified_provider_reference=REF, provider_request_id="a"
        )
        await reconciled_at_once(runner, first.receipt.action_id, absent, confirmed)

        def still_down(receipt: Any) -> VerificationResult:
            return VerificationResult.unknown(reason="still down")

        for _ in range(replays):
            result = await runner.execute(
                "charge",
                timeout,
                request=REQUEST,
                idempotency_key="k",
                provider_reference=REF,
                verifier=still_down,
            )
        stored = await ledger.get(first.receipt.action_id)
    finally:
        await closing(ledger)
    assert stored is not None
    assert result.status is ActionStatus.UNKNOWN
    kept = stored.metadata["verification_observations"]
    assert len(kept) <= MAX_KEPT_OBSERVATIONS
    assert stored.metadata["verification_observation_count"] == replays + 2
    assert [o["number"] for o in kept] == sorted(o["number"] for o in kept)
    # The two decisive, contradicting observations were never dropped.
    assert {o["status"] for o in kept} >= {"FAILED", "CONFIRMED"}
    assert stored.metadata["verification_conflict"] is True
    assert stored.metadata["provider_request_ids"] == ("a",)
    assert kept[-1] == stored.metadata["verification"]
    assert kept[-1]["number"] == replays + 2


@pytest.mark.parametrize(
    ("field", "value"),
    [("provider_request_id", "ch_\x00"), ("details", {"gateway": "\udcff"})],
)
@pytest.mark.asyncio
async def test_a_result_smuggling_an_unstorable_field_counts_as_unknown(
    new_ledger: Callable[[], Ledger], field: str, value: object
) -> None:
    # Built around the constructor's checks (a frozen dataclass can be forced):
    # the runner must still never try to store it.
    forced = VerificationResult.confirmed(verified_provider_reference=REF)
    object.__setattr__(forced, field, value)
    ledger = new_ledger()

    async def timeout() -> None:
        raise TimeoutError("lost")

    try:
        result = await ActionRunner(ledger).execute(
            "charge",
            timeout,
            request=REQUEST,
            idempotency_key="k",
            provider_reference=REF,
            verifier=lambda r: forced,
        )
        stored = await ledger.get(result.receipt.action_id)
    finally:
        await closing(ledger)
    assert result.status is ActionStatus.UNKNOWN
    assert stored is not None
    assert stored.claim_state is ClaimState.COMPLETED
    assert stored.provider_request_id is None
    observation = stored.metadata["verification"]
    assert observation["status"] == "UNKNOWN"
    assert observation["error"] == "verifier returned a VerificationResult that no ledger can store"
    assert observation["source"] == "execute"
    assert "claimed" not in observation  # nothing of the unstorable answer was kept


# -- the worker pool for blocking calls -------------------------------------------


@pytest.mark.asyncio
async def test_concurrent_sync_operations_each_get_a_daemon_worker_and_workers_are_reused() -> None:
    runner = ActionRunner(InMemoryLedger())
    together = threading.Barrier(8, timeout=10)  # all eight must be running at once
    threads: list[threading.Thread] = []

    def blocking() -> str:
        threads.append(threading.current_thread())
        together.wait()
        return "ok"

    results = await asyncio.gather(
        *(
            runner.execute("op", blocking, request={"n": n}, idempotency_key=f"k{n}")
            for n in range(8)
        )
    )
    assert all(r.status is ActionStatus.CONFIRMED for r in results), [
        r.receipt.error for r in results
    ]
    assert len({t.ident for t in threads}) == 8
    assert all(t.daemon and t.name == "dataoad-blocking" for t in threads)
    # Idle workers are reused, not replaced by new threads. (The pool is the
    # process's: workers idle from earlier tests may serve these calls too.)
    idle = {t.ident for t in threading.enumerate() if t.name == "dataoad-blocking"}
    assert {t.ident for t in threads} <= idle
    after: list[threading.Thread] = []
    for n in range(3):
        await runner.execute(
            "op",
            lambda: after.append(threading.current_thread()),
            request={"m": n},
            idempotency_key=f"m{n}",
        )
    assert {t.ident for t in after} <= idle


def test_idle_workers_exit_and_the_pool_still_serves_afterwards(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from dataoad import _blocking

    monkeypatch.setattr(_blocking, "IDLE_SECONDS", 0.05)
    pool = _blocking._WorkerPool()
    ran: list[threading.Thread] = []
    done = threading.Event()

    def job() -> None:
        ran.append(threading.current_thread())
        done.set()

    pool.submit(job)
    assert done.wait(5)
    ran[0].join(5)  # idle for longer than IDLE_SECONDS: it exits
    assert not ran[0].is_alive()
    again = threading.Event()
    pool.submit(again.set)  # a new worker is started for it
    assert again.wait(5)


class ChangedUnderIt(InMemoryLedger):
    """Refuses attempt 2's start: someone else changed the claim first."""

    async def start_attempt(self, receipt: Any, **lease: Any) -> bool:
        # Attempt 1 is counted by the claim itself now, so attempt 2's start is
        # the first start_attempt call: aim at the attempt, not the call count.
        if receipt.attempts == 2:
            return False
        return await super().start_attempt(receipt, **lease)


@pytest.mark.asyncio
async def test_a_retry_that_loses_its_claim_reports_the_earlier_attempt_in_full() -> None:
    from dataoad import DefinitiveFailure, OutcomeNotRecordedError

    ledger = ChangedUnderIt()
    policy = RetryPolicy(max_attempts=2, retry_on_failed=True)

    async def rejected() -> None:
        raise DefinitiveFailure("busy", retryable=True)

    with pytest.raises(OutcomeNotRecordedError) as raised:
        await ActionRunner(ledger, policy=policy).execute(
            "charge", rejected, request=REQUEST, idempotency_key="k", metadata={"note": "x"}
        )
    error = raised.value
    [stored] = ledger.snapshot()
    assert str(error) == (
        f"attempt 2 of action {stored.action_id} could not be started (the claim changed "
        "concurrently), so it was not invoked; but 1 earlier attempt(s) of this call WERE "
        "invoked (FAILED): do not repeat the operation. Re-read the ledger; a PENDING claim "
        "needs read-only recover_pending"
    )
    assert error.receipt is not None
    assert error.receipt.action_id == stored.action_id
    assert error.observed_status is ActionStatus.FAILED
    assert error.observed_metadata == {"note": "x"}


@pytest.mark.asyncio
async def test_a_retry_whose_start_write_fails_names_the_cause() -> None:
    from dataoad import OutcomeNotRecordedError

    error, _ = await retry_whose_start_fails(InMemoryLedger(), ran=1, max_attempts=2)
    assert isinstance(error, OutcomeNotRecordedError)
    assert (
        "could not be started (LedgerFaultError: injected: start_attempt failed before write)"
        in str(error)
    )


@pytest.mark.asyncio
async def test_a_third_attempt_that_cannot_start_counts_both_earlier_ones() -> None:
    from dataoad import OutcomeNotRecordedError
    from dataoad.testing import LedgerFaultError

    error, calls = await retry_whose_start_fails(InMemoryLedger(), ran=2, max_attempts=3)
    assert isinstance(error, OutcomeNotRecordedError)
    assert calls == [1, 1]
    assert "attempt 3 of action" in str(error)
    assert "but 2 earlier attempt(s) of this call WERE invoked (FAILED)" in str(error)
    assert isinstance(error.__cause__, LedgerFaultError)  # the write's own error


@pytest.mark.asyncio
async def test_observations_within_one_execute_are_bounded_too(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from dataoad import _evidence

    monkeypatch.setattr(_evidence, "MAX_KEPT_OBSERVATIONS", 2)
    ledger = InMemoryLedger()
    fenced = VerificationResult.absent(verified_provider_reference=REF, retry_safe=True)

    async def answered_but_not_proven() -> str:
        return "ok"  # with a verifier, a return proves nothing; the read-back decides

    result = await ActionRunner(
        ledger, policy=RetryPolicy(max_attempts=3, retry_on_failed=True)
    ).execute(
        "charge",
        answered_but_not_proven,
        request=REQUEST,
        idempotency_key="k",
        provider_reference=REF,
        verifier=lambda r: fenced,
    )
    assert result.status is ActionStatus.FAILED
    assert result.receipt.attempts == 3
    kept = result.receipt.metadata["verification_observations"]
    assert result.receipt.metadata["verification_observation_count"] == 3
    assert [o["number"] for o in kept] == [2, 3]


@pytest.mark.asyncio
async def test_observations_written_before_they_were_numbered_count_on() -> None:
    ledger = InMemoryLedger()

    async def timeout() -> None:
        raise TimeoutError("lost")

    def down(receipt: Any) -> VerificationResult:
        return VerificationResult.unknown(reason="down")

    runner = ActionRunner(ledger)
    first = await runner.execute(
        "charge",
        timeout,
        request=REQUEST,
        idempotency_key="k",
        provider_reference=REF,
        verifier=down,
    )
    # Rewrite it as an older Dataoad stored it: two observations, no numbers, no count.
    old = [{k: v for k, v in first.receipt.metadata["verification"].items() if k != "number"}] * 2
    metadata = {"verification_observations": old, "verification": old[-1]}
    assert await ledger.record(
        first.receipt.evolve(metadata=metadata, version=first.receipt.version + 1)
    )
    again = await runner.execute(
        "charge",
        timeout,
        request=REQUEST,
        idempotency_key="k",
        provider_reference=REF,
        verifier=down,
    )
    assert again.receipt.metadata["verification_observation_count"] == 3
    assert again.receipt.metadata["verification"]["number"] == 3


@pytest.mark.asyncio
async def test_a_retry_that_cannot_start_carries_the_earlier_attempts_observations() -> None:
    """What the verifier said about the attempt that ran goes with the error, settled."""
    from dataoad import OutcomeNotRecordedError
    from suite_support import REF, fixed_verifier

    absent = VerificationResult.absent(verified_provider_reference=REF, retry_safe=True)

    async def lost() -> None:
        raise TimeoutError("no answer")

    policy = RetryPolicy(max_attempts=2, retry_on_failed=True)
    with pytest.raises(OutcomeNotRecordedError) as raised:
        await ActionRunner(ChangedUnderIt(), policy=policy).execute(
            "charge",
            lost,
            request=REQUEST,
            idempotency_key="k",
            provider_reference=REF,
            verifier=fixed_verifier(absent),
            metadata={"note": "x"},
        )
    error = raised.value
    assert error.observed_status is ActionStatus.FAILED
    assert error.observed_metadata is not None
    metadata = dict(error.observed_metadata)
    assert metadata["note"] == "x"
    [observation] = metadata["verification_observations"]
    assert observation["status"] == "FAILED"
    assert observation["verified_provider_reference"] == REF
    assert metadata["verification"] == observation
    assert metadata["verification_conflict"] is False
    assert metadata["provider_request_id_conflict"] is False
    assert "provider_request_ids" in metadata


def test_a_job_that_arrives_as_a_workers_wait_runs_out_is_still_run() -> None:
    """A worker whose idle wait ends just as a job is queued for it serves the job."""
    import queue

    from dataoad import _blocking

    class TimesOutOnce:
        def __init__(self) -> None:
            self.jobs: queue.SimpleQueue[Any] = queue.SimpleQueue()
            self.timed_out = False

        def put(self, job: Any) -> None:
            self.jobs.put(job)

        def empty(self) -> bool:
            return self.jobs.empty()

        def get(self, timeout: float) -> Any:
            if not self.timed_out:
                self.timed_out = True
                raise queue.Empty  # the wait ran out as the job was being queued
            return self.jobs.get(timeout=timeout)

    pool = _blocking._WorkerPool()
    pool._jobs = TimesOutOnce()  # type: ignore[assignment]
    done = threading.Event()
    pool.submit(done.set)
    assert done.wait(5), "the job was stranded: its worker exited instead of serving it"


def test_every_idle_worker_is_counted_so_a_burst_reuses_them_all(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from dataoad import _blocking

    started: list[threading.Thread] = []
    real = threading.Thread

    def counting(*args: Any, **kwargs: Any) -> threading.Thread:
        thread = real(*args, **kwargs)
        started.append(thread)
        return thread

    monkeypatch.setattr("dataoad._blocking.threading.Thread", counting)
    pool = _blocking._WorkerPool()
    # Three bursts: a miscount that leaves too few idle workers counted shows
    # only when the burst after it starts threads again.
    for _ in range(3):
        together = threading.Barrier(3, timeout=5)
        finished = threading.Barrier(4, timeout=5)

        def job(
            together: threading.Barrier = together, finished: threading.Barrier = finished
        ) -> None:
            together.wait()
            finished.wait()

        for _ in range(3):
            pool.submit(job)
        finished.wait()
        deadline = time.monotonic() + 2
        while pool._idle < 3 and time.monotonic() < deadline:
            time.sleep(0.005)  # the three workers are going back to waiting
    assert len(started) == 3, "a burst started new threads although three workers were idle"


@pytest.mark.asyncio
async def test_where_each_kind_of_operation_runs(monkeypatch: pytest.MonkeyPatch) -> None:
    """README: async def and its partials on the loop; a lambda on a thread, its coroutine on the loop."""
    import functools

    loop_thread = threading.current_thread()
    seen: dict[str, threading.Thread] = {}

    async def native(label: str) -> str:
        seen[label] = threading.current_thread()
        return label

    def called_by(label: str) -> Any:
        seen[f"{label} (call)"] = threading.current_thread()
        return native(label)

    from dataoad import _blocking, _invoking

    hops: list[object] = []
    real_call_blocking = _blocking.call_blocking

    async def counting(fn: Any, **options: Any) -> Any:
        hops.append(fn)
        return await real_call_blocking(fn, **options)

    class AsyncCallable:
        async def __call__(self) -> str:
            return await native("async __call__")

    monkeypatch.setattr(_blocking, "call_blocking", counting)
    monkeypatch.setattr(_invoking, "call_blocking", counting)
    runner = ActionRunner(InMemoryLedger())
    for label, operation in (
        ("async def", functools.partial(native, "async def")),
        ("async __call__", AsyncCallable()),
        ("lambda", lambda: called_by("lambda")),
    ):
        result = await runner.execute("op", operation, request={"l": label}, idempotency_key=label)
        assert result.status is ActionStatus.CONFIRMED
        assert result.value == label
    assert len(hops) == 1, "only the plain callable may take a thread hop"
    assert seen["async def"] is loop_thread
    assert seen["async __call__"] is loop_thread
    assert seen["lambda (call)"] is not loop_thread  # the plain callable ran on a worker
    assert seen["lambda"] is loop_thread  # and its coroutine was awaited on the loop


@pytest.mark.asyncio
async def test_a_plain_callable_that_needs_the_loop_is_recorded_unknown() -> None:
    """README: such a callable (there, `asyncio.gather`) fails on its thread: UNKNOWN."""
    result = await ActionRunner(InMemoryLedger()).execute(
        "op", lambda: asyncio.get_running_loop().create_future(), request={}, idempotency_key="k"
    )
    assert result.status is ActionStatus.UNKNOWN
    assert result.receipt.attempts == 1
    assert result.receipt.error is not None
    assert "RuntimeError" in result.receipt.error


def test_the_sync_runner_offers_every_operator_verb_and_close_closes_the_ledger(
    tmp_path: Any,
) -> None:
    """README: SyncActionRunner offers every runner verb as a blocking call."""
    from dataoad import ClaimState, SQLiteLedger, SyncActionRunner, VerificationResult
    from dataoad.testing import FaultyLedger, LedgerFault
    from suite_support import REF, CountingOperation, unstarted

    path = tmp_path / "ledger.sqlite3"

    async def leave_behind() -> dict[str, str]:
        ledger = SQLiteLedger(path)
        # The runner no longer leaves unstarted claims (attempt 1 is counted
        # with the claim): write the legacy v0.1 shape that release_unstarted is for.
        ids = {"unstarted": (await unstarted(ledger, key="unstarted")).action_id}
        for key, fault_on in (
            ("unknown", None),
            ("stranded", "record"),
        ):
            faulty = FaultyLedger(ledger)
            if fault_on:
                faulty.inject(fault_on, LedgerFault.FAIL_BEFORE_WRITE)
            op = (
                CountingOperation(TimeoutError("lost"))
                if key == "unknown"
                else CountingOperation("ok")
            )
            try:
                result = await ActionRunner(faulty).execute(
                    "charge", op, request=REQUEST, idempotency_key=key, provider_reference=REF
                )
                ids[key] = result.receipt.action_id
            except ActionPersistenceError as exc:
                ids[key] = exc.receipt.action_id if exc.receipt else ""
        await ledger.close()
        return ids

    ids = asyncio.run(leave_behind())
    confirmed = VerificationResult.confirmed(verified_provider_reference=REF)
    ledger = SQLiteLedger(path)
    with SyncActionRunner(ledger) as runner:
        assert (
            runner.reconcile(ids["unknown"], lambda r: confirmed).status is ActionStatus.CONFIRMED
        )
        # The outcome write failed: the claim is still PENDING, so recovery has work to do.
        assert runner.receipt(ids["stranded"]).claim_state is ClaimState.PENDING
        recovered = runner.recover_pending(ids["stranded"], lambda r: confirmed)
        assert recovered.status is ActionStatus.CONFIRMED
        assert recovered.receipt.claim_state is ClaimState.COMPLETED
        runner.release_unstarted(ids["unstarted"])
        assert runner.receipt(ids["unknown"]).final_status is ActionStatus.CONFIRMED
    # Leaving the block closed the ledger: it refuses to be used again.
    with pytest.raises(Exception, match="closed"):
        asyncio.run(ledger.get(ids["unknown"]))
    with SyncActionRunner(SQLiteLedger(path)) as again, pytest.raises(Exception, match="no action"):
        again.receipt(ids["unstarted"])


def test_a_blocking_call_that_outlives_its_loop_ends_quietly() -> None:
    """Its caller is gone with the loop: the worker drops the result, raises nothing,
    and goes back to serving calls."""
    from dataoad import _blocking

    release = threading.Event()
    finished = threading.Event()
    thread_errors: list[BaseException | None] = []
    previous_hook = threading.excepthook
    threading.excepthook = lambda args: thread_errors.append(args.exc_value)
    try:

        def slow() -> str:
            release.wait(5)
            finished.set()
            return "late"

        async def start_and_leave() -> None:
            task = asyncio.ensure_future(_blocking.call_blocking(slow))
            await asyncio.sleep(0.05)
            task.cancel()

        asyncio.run(start_and_leave())  # the loop is closed when this returns
        release.set()
        assert finished.wait(5)
        time.sleep(0.1)  # let the worker try to hand its result to the closed loop
        assert asyncio.run(_blocking.call_blocking(lambda: "served")) == "served"
    finally:
        threading.excepthook = previous_hook
    assert thread_errors == [], f"a worker raised after its loop closed: {thread_errors}"


@pytest.mark.asyncio
async def test_an_async_verifier_runs_on_the_loop_and_a_sync_one_on_a_worker(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from dataoad import _observing
    from dataoad._blocking import call_blocking as real_call_blocking

    hops: list[object] = []

    async def counting(fn: Any, **options: Any) -> Any:
        hops.append(fn)
        return await real_call_blocking(fn, **options)

    monkeypatch.setattr(_observing, "call_blocking", counting)
    loop_thread = threading.current_thread()
    seen: dict[str, threading.Thread] = {}

    def answer(label: str) -> VerificationResult:
        seen[label] = threading.current_thread()
        return VerificationResult.confirmed(verified_provider_reference="ref")

    async def async_verifier(receipt: Any) -> VerificationResult:
        return answer("async")

    class SyncVerifier:
        def verify(self, receipt: Any) -> VerificationResult:
            return answer("sync")

    runner = ActionRunner(InMemoryLedger())
    for label, verifier in (("async", async_verifier), ("sync", SyncVerifier())):

        async def lost() -> None:
            raise TimeoutError("lost")

        result = await runner.execute(
            "op",
            lost,
            request={"l": label},
            idempotency_key=label,
            provider_reference="ref",
            verifier=verifier,
        )
        assert result.status is ActionStatus.CONFIRMED
    assert seen["async"] is loop_thread
    assert seen["sync"] is not loop_thread
    assert len(hops) == 1, "only the sync verifier may take a thread hop"
