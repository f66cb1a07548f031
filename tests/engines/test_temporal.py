"""Temporal (the real ``temporalio``): a guarded activity under Temporal's own retries,
through ``temporalio.testing.ActivityEnvironment`` (no server needed), in one process and
across a killed worker."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any, cast

import pytest
from temporalio import activity
from temporalio.exceptions import ApplicationError
from temporalio.testing import ActivityEnvironment

from dataoad import (
    ActionRunner,
    DefinitiveFailure,
    InMemoryLedger,
    InvalidArgumentError,
    NotInStepError,
    RetryPolicy,
    SQLiteLedger,
    SyncActionRunner,
    UnresolvedActionError,
    VerificationResult,
)
from dataoad.integrations.temporal import (
    ANOTHER_RUN_TYPE,
    FAILED_TYPE,
    RUN_METADATA_KEY,
    UNRESOLVED_TYPE,
    activity_key,
    guarded_activity,
    unresolved,
)
from tests.engines.crash_harness import crash_matrix, run_crash
from tests.engines.ledger_view import stored_receipts

WORKER = "tests.engines.temporal_worker"


def environment(attempt: int = 1, **info: Any) -> ActivityEnvironment:
    """An activity environment for attempt ``attempt`` of activity 1 of workflow wf-1."""
    env = ActivityEnvironment()
    fields = {"workflow_id": "wf-1", "activity_id": "1", "attempt": attempt, **info}
    env.info = dataclasses.replace(env.info, **fields)
    return env


async def test_the_key_is_the_same_on_every_attempt_and_differs_per_activity() -> None:
    @activity.defn
    async def key() -> str:
        return activity_key()

    keys = [await environment(attempt).run(key) for attempt in (1, 2, 7)]
    assert keys == ["temporal:default:wf-1:1"] * 3
    others = {
        await environment(activity_id="2").run(key),
        await environment(workflow_id="wf-2").run(key),
        await environment(namespace="prod").run(key),
        await environment(workflow_run_id="another-run").run(key),
    }
    assert others == {
        "temporal:default:wf-1:2",
        "temporal:default:wf-2:1",
        "temporal:prod:wf-1:1",
        "temporal:default:wf-1:1",  # a new run of the same workflow is the same intent
    }


async def test_outside_an_activity_nothing_is_recorded_or_invoked() -> None:
    ledger = InMemoryLedger()
    calls: list[int] = []

    @guarded_activity(ActionRunner(ledger), "charge", request={"order": "o1"})
    async def charge() -> str:
        calls.append(1)
        return "ch"

    with pytest.raises(NotInStepError, match="no Temporal activity is running"):
        await charge()
    with pytest.raises(NotInStepError):
        activity_key()
    assert calls == []
    assert ledger.snapshot() == []


async def test_an_ambiguous_attempt_is_not_retried_and_a_retry_anyway_charges_nothing() -> None:
    ledger = InMemoryLedger()
    charges: list[str] = []

    @guarded_activity(ActionRunner(ledger), "charge", request={"order": "o1"})
    async def charge() -> str:
        charges.append("ch")
        raise ConnectionResetError("reset after the provider committed")

    errors = []
    for attempt in (1, 2, 3):  # Temporal would stop at 1; a heartbeat timeout retries anyway
        with pytest.raises(ApplicationError) as info:
            await environment(attempt).run(charge)
        errors.append(info.value)
    assert charges == ["ch"]
    assert all(e.type == UNRESOLVED_TYPE and e.non_retryable for e in errors)
    (receipt,) = ledger.snapshot()
    assert errors[0].details[0]["action_id"] == receipt.action_id
    assert errors[0].details[0]["status"] == "UNKNOWN"
    # In the workflow, the failure turns back into UnresolvedActionError.
    wrapped = RuntimeError("activity failed")
    wrapped.__cause__ = errors[0]
    error = unresolved(wrapped)
    assert isinstance(error, UnresolvedActionError)
    assert error.action_id == receipt.action_id
    assert unresolved(RuntimeError("something else")) is None


class LaggingPayments:
    """Charges in memory; its read path is behind at the first look only."""

    def __init__(self) -> None:
        self.charges = 0
        self.looks = 0

    def charge(self) -> None:
        self.charges += 1

    def verify(self, receipt: Any) -> VerificationResult:
        self.looks += 1
        if self.looks == 1:
            return VerificationResult.unknown(reason="the read replica is behind")
        return VerificationResult.confirmed(verified_provider_reference="order-o1")


async def test_a_retry_after_an_unknown_settles_it_read_only_with_the_verifier() -> None:
    ledger = InMemoryLedger()
    payments = LaggingPayments()

    @guarded_activity(
        ActionRunner(ledger),
        "charge",
        request={"order": "o1"},
        provider_reference="order-o1",
        verifier=payments.verify,
    )
    async def charge() -> str:
        payments.charge()
        raise TimeoutError("the response was lost")

    with pytest.raises(ApplicationError) as info:
        await environment(1).run(charge)
    assert info.value.type == UNRESOLVED_TYPE
    assert await environment(2).run(charge) is None  # verified, not charged again
    assert payments.charges == 1
    (receipt,) = ledger.snapshot()
    assert receipt.final_status is not None
    assert receipt.final_status.value == "CONFIRMED"


async def test_an_attempt_overlapping_a_timed_out_one_waits_and_replays() -> None:
    ledger = InMemoryLedger()
    started = asyncio.Event()
    gate = asyncio.Event()
    charges: list[int] = []

    @guarded_activity(ActionRunner(ledger), "charge", request={"order": "o1"})
    async def charge() -> str:
        charges.append(1)
        started.set()
        await gate.wait()
        return "ch_1"

    # Running an async activity returns a coroutine (typed as the activity's Awaitable).
    Run = Coroutine[Any, Any, str | None]
    first = asyncio.create_task(cast(Run, environment(1).run(charge)))
    await started.wait()
    # Past its start-to-close timeout, Temporal starts attempt 2 while 1 still runs.
    second = asyncio.create_task(cast(Run, environment(2).run(charge)))
    await asyncio.sleep(0.05)
    assert not second.done()
    gate.set()
    assert await first == "ch_1"
    assert await second is None  # a replay: CONFIRMED, its value not stored
    assert charges == [1]


async def test_failed_and_bad_arguments_are_not_retryable() -> None:
    runner = ActionRunner(InMemoryLedger())

    @guarded_activity(runner, "charge", request={"order": "o1"})
    async def declined() -> str:
        raise DefinitiveFailure("card declined")

    @guarded_activity(runner, "refund", request=lambda amount: {"amount": amount})
    async def refund(amount: object) -> str:
        raise AssertionError("never called")

    with pytest.raises(ApplicationError) as info:
        await environment().run(declined)
    assert info.value.type == FAILED_TYPE
    assert info.value.non_retryable
    assert "card declined" in str(info.value)
    with pytest.raises(ApplicationError) as info:
        await environment(activity_id="2").run(refund, float("inf"))
    assert info.value.type == "InvalidRequestError"
    assert info.value.non_retryable


async def test_a_closed_ledger_is_not_retryable_and_nothing_is_invoked(tmp_path: Path) -> None:
    ledger = SQLiteLedger(tmp_path / "ledger.sqlite3")
    runner = ActionRunner(ledger)
    await ledger.close()
    calls: list[int] = []

    @guarded_activity(runner, "charge", request={"order": "o1"})
    async def charge() -> str:
        calls.append(1)
        return "ch"

    with pytest.raises(ApplicationError) as info:
        await environment().run(charge)
    assert info.value.type == "LedgerClosedError"
    assert info.value.non_retryable
    assert calls == []


async def test_a_local_activity_is_refused_before_anything_is_recorded() -> None:
    # Temporal gives a local activity's retry a new activity id after a long
    # backoff: keyed by it, the retry would charge again.
    ledger = InMemoryLedger()
    charges: list[int] = []

    @guarded_activity(ActionRunner(ledger), "charge", request={"order": "o1"})
    async def charge() -> str:
        charges.append(1)
        return "ch"

    with pytest.raises(ApplicationError) as info:
        await environment(is_local=True).run(charge)
    assert info.value.type == "InvalidArgumentError"
    assert info.value.non_retryable
    assert "local activity has no stable key" in str(info.value)
    assert charges == []
    assert ledger.snapshot() == []

    @guarded_activity(
        ActionRunner(ledger), "charge", request={"order": "o1"}, idempotency_key=lambda: "o1"
    )
    async def keyed() -> str:
        charges.append(1)
        return "ch"

    # With a key of its own, a retry under a new activity id meets its receipt.
    assert await environment(is_local=True).run(keyed) == "ch"
    assert await environment(is_local=True, activity_id="2", attempt=2).run(keyed) is None
    assert charges == [1]


def subscription(ledger: InMemoryLedger, charges: list[int], **options: Any) -> Any:
    @guarded_activity(
        ActionRunner(ledger), "charge", request=lambda month: {"plan": "pro"}, **options
    )
    async def charge(month: int) -> str:
        charges.append(month)
        return f"ch-{month}"

    return charge


async def test_a_receipt_of_another_run_is_refused_not_replayed() -> None:
    # Each continue-as-new (or cron) run restarts activity ids: month 2's
    # activity 1 has month 1's key. Replaying month 1's receipt would skip
    # month 2's charge without a word.
    ledger = InMemoryLedger()
    charges: list[int] = []
    charge = subscription(ledger, charges)
    assert await environment(workflow_run_id="run-1").run(charge, 1) == "ch-1"
    assert await environment(workflow_run_id="run-1", attempt=2).run(charge, 1) is None
    with pytest.raises(ApplicationError) as info:
        await environment(workflow_run_id="run-2").run(charge, 2)
    assert info.value.type == ANOTHER_RUN_TYPE
    assert info.value.non_retryable
    assert "made by another run of this workflow ('run-1')" in str(info.value)
    (receipt,) = ledger.snapshot()
    assert info.value.details[0]["action_id"] == receipt.action_id
    assert receipt.metadata[RUN_METADATA_KEY] == "run-1"
    assert charges == [1]


def found_once_charged(charges: list[int]) -> Callable[[Any], VerificationResult]:
    """A verifier of the provider: a charge once ``charges`` holds one, retry-safe absence before."""

    def verify(receipt: Any) -> VerificationResult:
        ref = receipt.provider_reference
        if charges:
            return VerificationResult.confirmed(verified_provider_reference=ref)
        return VerificationResult.absent(verified_provider_reference=ref, retry_safe=True)

    return verify


class WorkerDied(BaseException):
    """The worker's process ends inside the activity: nothing more of the call runs."""


@pytest.mark.parametrize("charged", [True, False], ids=["after the charge", "before it"])
async def test_a_claim_another_run_left_pending_is_refused_not_taken_over(charged: bool) -> None:
    # Run 1's worker dies inside activity 1 and the workflow continues as new:
    # run 2's activity 1 has the same key. Taking the claim over would settle
    # run 1's charge as run 2's (month 2 skipped, reported CONFIRMED), or run
    # month 2 under run 1's receipt, which run 2's own retry then refused.
    ledger = InMemoryLedger()
    charges: list[int] = []

    verify = found_once_charged(charges)

    died: list[int] = []

    @guarded_activity(
        ActionRunner(ledger, lease=0.05),
        "charge",
        request=lambda month: {"plan": "pro"},
        provider_reference=lambda month: "sub-7",
        verifier=verify,
        policy=RetryPolicy(max_attempts=2, retry_on_failed=True),  # absence read back
    )
    async def charge(month: int) -> str:
        if not died and not charged:
            died.append(month)
            raise WorkerDied
        charges.append(month)
        if not died:
            died.append(month)
            raise WorkerDied
        return f"ch-{month}"

    with pytest.raises(WorkerDied):
        await environment(workflow_run_id="run-1").run(charge, 1)
    (left,) = ledger.snapshot()
    assert left.is_pending
    await asyncio.sleep(0.1)  # run 1's lease has run out
    for attempt in (1, 2):  # and again on Temporal's retry
        with pytest.raises(ApplicationError) as info:
            await environment(workflow_run_id="run-2", attempt=attempt).run(charge, 2)
        assert info.value.type == ANOTHER_RUN_TYPE
        assert info.value.non_retryable
        assert "made by another run of this workflow ('run-1')" in str(info.value)
        assert "still PENDING" in str(info.value)
        assert "Nothing was invoked" in str(info.value)
    assert charges == ([1] if charged else [])
    assert ledger.snapshot() == [left]  # not taken over, nothing settled
    # Run 1's own retry of its activity is its own: it takes the claim over.
    again = await environment(workflow_run_id="run-1", attempt=2).run(charge, 1)
    assert again == (None if charged else "ch-1")
    assert charges == [1]
    (settled,) = ledger.snapshot()
    assert settled.final_status is not None
    assert settled.final_status.value == "CONFIRMED"


async def test_another_runs_claim_made_after_the_read_is_still_not_this_runs() -> None:
    # Run 1's activity outlived the continue-as-new: it claims the key just
    # after run 2's activity read it free, and its worker dies after the
    # charge. Run 2 takes the claim over and the verifier finds a charge:
    # run 1's, never run 2's month.
    ledger = InMemoryLedger()
    charges: list[int] = []

    verify = found_once_charged(charges)

    @guarded_activity(
        ActionRunner(ledger, lease=0.05),
        "charge",
        request=lambda month: {"plan": "pro"},
        provider_reference=lambda month: "sub-7",
        verifier=verify,
        policy=RetryPolicy(max_attempts=2, retry_on_failed=True),
    )
    async def charge(month: int) -> str:
        charges.append(month)
        if month == 1:
            raise WorkerDied
        return f"ch-{month}"

    read = ledger.find
    raced: list[bool] = []

    async def find(*args: Any, **kwargs: Any) -> Any:
        held = await read(*args, **kwargs)
        if held is None and not raced:  # run 2 read the key free; run 1 claims it now
            raced.append(True)
            with pytest.raises(WorkerDied):
                await environment(workflow_run_id="run-1").run(charge, 1)
            await asyncio.sleep(0.1)  # and its lease runs out
        return held

    ledger.find = find  # type: ignore[method-assign]
    with pytest.raises(ApplicationError) as info:
        await environment(workflow_run_id="run-2").run(charge, 2)
    assert info.value.type == ANOTHER_RUN_TYPE
    assert info.value.non_retryable
    assert "do not repeat the operation" in str(info.value)
    assert charges == [1]
    (receipt,) = ledger.snapshot()
    assert receipt.metadata[RUN_METADATA_KEY] == "run-1"


async def test_across_runs_takes_over_a_claim_another_run_left_pending() -> None:
    ledger = InMemoryLedger()
    charges: list[int] = []

    @guarded_activity(
        ActionRunner(ledger, lease=0.05),
        "charge",
        request={"order": "o1"},
        provider_reference="order-o1",
        verifier=lambda receipt: (
            VerificationResult.confirmed(verified_provider_reference="order-o1")
            if 1 in charges
            else VerificationResult.absent(verified_provider_reference="order-o1", retry_safe=True)
        ),
        policy=RetryPolicy(max_attempts=2, retry_on_failed=True),
        across_runs=True,  # a reset: run 2 is the same intent
    )
    async def charge() -> str:
        if not charges:
            charges.append(0)
            raise WorkerDied  # before the provider is called
        charges.append(1)
        return "ch"

    with pytest.raises(WorkerDied):
        await environment(workflow_run_id="run-1").run(charge)
    await asyncio.sleep(0.1)
    assert await environment(workflow_run_id="run-2").run(charge) == "ch"
    assert charges == [0, 1]


async def test_across_runs_replays_and_a_key_of_its_own_tells_runs_apart() -> None:
    ledger = InMemoryLedger()
    charges: list[int] = []
    reset = subscription(ledger, charges, across_runs=True)  # a reset: the same intent
    assert await environment(workflow_run_id="run-1").run(reset, 1) == "ch-1"
    assert await environment(workflow_run_id="run-2").run(reset, 1) is None
    assert charges == [1]
    monthly = subscription(
        InMemoryLedger(), charges, idempotency_key=lambda month: f"sub-7:{month}"
    )
    assert await environment(workflow_run_id="run-1").run(monthly, 1) == "ch-1"
    assert await environment(workflow_run_id="run-2").run(monthly, 2) == "ch-2"
    assert await environment(workflow_run_id="run-2", attempt=2).run(monthly, 2) is None
    assert charges == [1, 1, 2]


async def test_a_receipt_noted_before_runs_were_noted_still_replays() -> None:
    ledger = InMemoryLedger()
    await ActionRunner(ledger).execute(
        "charge",
        lambda: "ch",
        request={"plan": "pro"},
        idempotency_key="temporal:default:wf-1:1",
    )
    charges: list[int] = []
    assert await environment(workflow_run_id="run-9").run(subscription(ledger, charges), 1) is None
    assert charges == []


async def test_a_key_claimed_for_another_request_is_not_retryable() -> None:
    ledger = InMemoryLedger()
    charges: list[int] = []

    @guarded_activity(ActionRunner(ledger), "charge", request=lambda n: {"n": n})
    async def charge(n: int) -> str:
        charges.append(n)
        return "ch"

    await environment().run(charge, 1)
    with pytest.raises(ApplicationError) as info:
        await environment(attempt=2).run(charge, 2)  # the same activity, another request
    assert info.value.type == "IdempotencyConflictError"
    assert info.value.non_retryable  # Temporal would retry it without end otherwise
    with pytest.raises(ApplicationError) as info:
        await environment(workflow_run_id="another").run(charge, 2)
    assert info.value.type == ANOTHER_RUN_TYPE
    assert charges == [1]


def test_bad_options_are_refused_when_decorating() -> None:
    sync_runner = SyncActionRunner(InMemoryLedger())
    try:
        with pytest.raises(InvalidArgumentError, match="must be an ActionRunner"):
            guarded_activity(sync_runner, "charge", request={})
    finally:
        sync_runner.close()
    decorate = guarded_activity(ActionRunner(InMemoryLedger()), "charge", request={})
    with pytest.raises(InvalidArgumentError, match="is not async"):
        decorate(lambda: "ch")  # type: ignore[arg-type,return-value]
    runner = ActionRunner(InMemoryLedger())
    with pytest.raises(InvalidArgumentError, match="idempotency_key must be a callable"):
        guarded_activity(runner, "charge", request={}, idempotency_key="k")  # type: ignore[arg-type]
    with pytest.raises(InvalidArgumentError, match="across_runs must be True or False"):
        guarded_activity(runner, "charge", request={}, across_runs=1)  # type: ignore[arg-type]
    # Found when decorating, not as a TypeError Temporal would retry without end.
    with pytest.raises(InvalidArgumentError, match="metadata must be a dict"):
        guarded_activity(runner, "charge", request={}, metadata=[1])  # type: ignore[arg-type]
    with pytest.raises(InvalidArgumentError, match="non-finite"):
        guarded_activity(runner, "charge", request={}, metadata={"a": float("nan")})
    with pytest.raises(InvalidArgumentError, match="guarded_activity's own"):
        guarded_activity(runner, "charge", request={}, metadata={RUN_METADATA_KEY: "run-0"})
    with pytest.raises(InvalidArgumentError, match="risk"):
        guarded_activity(runner, "charge", request={}, risk=5)  # type: ignore[arg-type]
    guarded_activity(runner, "charge", request={}, metadata={"team": "billing"}, risk="high")


@pytest.mark.parametrize(("point", "verifier"), crash_matrix())
def test_worker_killed_then_temporal_retries_the_activity(
    tmp_path: Path, point: str, verifier: bool
) -> None:
    run = run_crash(WORKER, tmp_path, point, mode="guarded", verifier=verifier)
    assert run.killed, f"the worker never reached {point}"
    assert len(run.charges) <= 1, run.charges
    (receipt,) = stored_receipts(tmp_path / "ledger.sqlite3")
    assert receipt.idempotency_key == "temporal:default:checkout-1:1"
    assert not receipt.is_pending
    assert receipt.final_status is not None
    status = receipt.final_status.value
    if verifier or point in ("before_claim", "after_outcome"):
        assert run.outcome["outcome"] == "returned"
        assert status == "CONFIRMED"
        assert len(run.charges) == 1
    else:
        assert run.outcome["type"] == UNRESOLVED_TYPE
        assert run.outcome["non_retryable"]
        assert run.outcome["details"]["status"] == status == "UNKNOWN"


def test_without_dataoad_temporal_s_retry_charges_twice(
    tmp_path: Path, record_property: Callable[[str, object], None]
) -> None:
    run = run_crash(WORKER, tmp_path, "after_commit", mode="plain", verifier=False)
    assert run.killed
    assert len(run.charges) == 2, run.charges
    record_property(
        "without_dataoad",
        f"Temporal, plain activity, worker killed after the provider committed, attempt 2: "
        f"{len(run.charges)} charges for one order",
    )
