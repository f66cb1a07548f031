"""What each runner path leaves behind: errors, stored records and log records.

Mutation testing of the runner (see stateful_tests/README.md) showed these
details unchecked. Each is part of the contract an operator or caller relies
on: which receipt an error carries and whether it says the operation ran, the
fields of a stored attempt or observation, what a cancelled attempt records,
which log record each transition leaves and at what level.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Coroutine
from typing import Any, TypeVar

import pytest

from dataoad import (
    ActionNotFoundError,
    ActionPersistenceError,
    ActionReceipt,
    ActionRunner,
    ActionStatus,
    ClaimState,
    DefinitiveFailure,
    InMemoryLedger,
    InvalidArgumentError,
    RecoveryRefusedError,
    VerificationHealth,
    VerificationResult,
)
from dataoad.testing import FaultyLedger, LedgerFault
from tests.support import REF, REQUEST, CountingOperation, confirmed, fixed_verifier

T = TypeVar("T")
FAIL = LedgerFault.FAIL_BEFORE_WRITE
LOSE = LedgerFault.LOSE_ACKNOWLEDGEMENT


def run(coro: Coroutine[Any, Any, T]) -> T:
    return asyncio.run(coro)


@pytest.fixture
def caplog(caplog: pytest.LogCaptureFixture) -> pytest.LogCaptureFixture:
    """Every test here reads the dataoad logger's records at INFO and above."""
    caplog.set_level(logging.INFO, logger="dataoad")
    return caplog


def events(caplog: pytest.LogCaptureFixture) -> list[tuple[str, int, dict[str, Any]]]:
    """(event, level, fields) of every dataoad log record, in order."""
    return [
        (r.dataoad["event"], r.levelno, r.dataoad)  # type: ignore[attr-defined]
        for r in caplog.records
        if hasattr(r, "dataoad")
    ]


async def execute(runner: ActionRunner, op: Any = None, **kwargs: Any) -> Any:
    return await runner.execute(
        "charge",
        op or CountingOperation("ok"),
        request=REQUEST,
        idempotency_key=kwargs.pop("key", "k"),
        provider_reference=REF,
        **kwargs,
    )


async def stranded(ledger: Any) -> ActionReceipt:
    """A PENDING claim with one started attempt, as a crashed worker leaves it."""
    faulty = FaultyLedger(ledger)
    faulty.inject("record", FAIL)
    with pytest.raises(ActionPersistenceError) as info:
        await execute(ActionRunner(faulty))
    assert info.value.receipt is not None
    return info.value.receipt


async def unstarted(ledger: Any, key: str = "k") -> ActionReceipt:
    """A PENDING claim whose attempt start failed: it never invoked anything."""
    faulty = FaultyLedger(ledger)
    faulty.inject("start_attempt", FAIL)
    with pytest.raises(ActionPersistenceError) as info:
        await execute(ActionRunner(faulty), key=key)
    assert info.value.receipt is not None
    return info.value.receipt


async def unknown(ledger: Any) -> Any:
    """A completed UNKNOWN action: the call timed out and nothing verified it."""
    return await execute(ActionRunner(ledger), CountingOperation(TimeoutError("lost")))


async def refuse(*args: Any) -> bool:
    """A conditional write whose condition no longer holds."""
    return False


# -- claim -----------------------------------------------------------------------


def test_an_unproven_claim_carries_the_proposed_claim_and_says_nothing_ran() -> None:
    async def scenario() -> None:
        inner = InMemoryLedger()
        ledger = FaultyLedger(inner)
        ledger.inject("claim", FAIL)
        original_find = ledger.find
        looks = 0

        async def find(action_name: str, key: str) -> ActionReceipt | None:
            nonlocal looks
            looks += 1
            if looks == 2:  # the read-back after the failed claim write
                raise ConnectionError("read-back failed too")
            return await original_find(action_name, key)

        ledger.find = find  # type: ignore[method-assign]
        op = CountingOperation("ok")
        with pytest.raises(ActionPersistenceError) as info:
            await execute(ActionRunner(ledger), op)
        assert op.calls == 0
        assert info.value.operation_invoked is False
        assert info.value.receipt is not None
        assert info.value.receipt.idempotency_key == "k"
        assert str(info.value).endswith("a stored PENDING claim with zero attempts can be released")
        assert await inner.find("charge", "k") is None

    run(scenario())


# -- attempt start ---------------------------------------------------------------


@pytest.mark.parametrize("read_back_fails", [False, True])
def test_an_unproven_attempt_start_carries_the_durable_claim(
    read_back_fails: bool, caplog: pytest.LogCaptureFixture
) -> None:
    async def scenario() -> None:
        ledger = FaultyLedger(InMemoryLedger())
        ledger.inject("start_attempt", FAIL)
        if read_back_fails:
            ledger.on_call = None
            original_get = ledger.get

            async def get(action_id: str) -> ActionReceipt | None:
                raise ConnectionError("read-back failed")

            ledger.get = get  # type: ignore[method-assign]
            del original_get
        op = CountingOperation("ok")
        with pytest.raises(ActionPersistenceError) as info:
            await execute(ActionRunner(ledger), op)
        error = info.value
        assert op.calls == 0
        assert error.operation_invoked is False
        # Either way the error carries the claim as durably stored: PENDING, no attempt.
        assert isinstance(error.receipt, ActionReceipt)
        assert error.receipt.claim_state is ClaimState.PENDING
        assert error.receipt.attempts == 0
        assert str(error).startswith(f"attempt 1 of action {error.receipt.action_id} could not")
        assert "injected: start_attempt failed before write" in str(error)

    run(scenario())
    (event, level, fields) = events(caplog)[-1]
    assert (event, level) == ("attempt_not_started", logging.WARNING)
    assert fields["attempt"] == 0


def test_a_recovered_attempt_start_acknowledgement_is_logged(
    caplog: pytest.LogCaptureFixture,
) -> None:
    async def scenario() -> None:
        ledger = FaultyLedger(InMemoryLedger())
        ledger.inject("start_attempt", LOSE)
        result = await execute(ActionRunner(ledger))
        assert result.status is ActionStatus.CONFIRMED

    run(scenario())
    names = [(e, lvl) for e, lvl, _ in events(caplog)]
    assert names == [
        ("claimed", logging.INFO),
        ("attempt_start_acknowledgement_recovered", logging.INFO),
        ("attempt_started", logging.INFO),
        ("completed", logging.INFO),
    ]
    recovered = events(caplog)[1][2]
    assert recovered["attempt"] == 1


def test_an_attempt_start_refused_by_the_ledger_carries_what_is_stored() -> None:
    async def scenario() -> None:
        inner = InMemoryLedger()
        ledger = FaultyLedger(inner)
        runner = ActionRunner(ledger)
        held: dict[str, ActionReceipt] = {}

        async def release_first(receipt: ActionReceipt) -> bool:
            # Someone releases the claim between its creation and the attempt start.
            stored = await inner.find("charge", "k")
            assert stored is not None
            assert await inner.release(stored.action_id, stored.version)
            held["stored"] = stored
            return await inner.start_attempt(receipt)

        ledger.start_attempt = release_first  # type: ignore[method-assign]
        op = CountingOperation("ok")
        with pytest.raises(ActionPersistenceError) as info:
            await execute(runner, op)
        error = info.value
        assert op.calls == 0
        assert error.operation_invoked is False
        # Nothing is stored any more, so the error carries the claim it last knew.
        assert error.receipt == held["stored"]
        assert str(error).startswith(f"action {held['stored'].action_id} changed before attempt 1")

    run(scenario())


def test_an_attempt_start_refused_carries_the_newer_stored_receipt() -> None:
    async def scenario() -> None:
        inner = InMemoryLedger()
        ledger = FaultyLedger(inner)

        ledger.start_attempt = refuse  # type: ignore[method-assign]
        with pytest.raises(ActionPersistenceError) as info:
            await execute(ActionRunner(ledger))
        stored = await inner.find("charge", "k")
        assert info.value.receipt == stored
        assert info.value.operation_invoked is False

    run(scenario())


# -- attempts and observations as stored ----------------------------------------------


def test_a_finished_attempt_record_keeps_its_number_error_and_confirmed_request_id() -> None:
    async def scenario() -> None:
        ledger = InMemoryLedger()
        verifier = fixed_verifier(confirmed(rid="pr_9"))
        result = await execute(
            ActionRunner(ledger), CountingOperation(TimeoutError("lost")), verifier=verifier
        )
        (attempt,) = result.receipt.attempt_records
        assert attempt.number == 1
        assert attempt.error is not None
        assert "TimeoutError" in attempt.error
        assert attempt.provider_request_id == "pr_9"
        assert attempt.finished_at is not None
        assert attempt.execution_status is ActionStatus.UNKNOWN
        assert attempt.verification_status is ActionStatus.CONFIRMED
        assert result.receipt.provider_request_id == "pr_9"

    run(scenario())


def test_an_attempt_confirmed_by_nothing_records_no_request_id() -> None:
    async def scenario() -> None:
        absent = VerificationResult.absent(verified_provider_reference=REF, retry_safe=True)
        result = await execute(
            ActionRunner(InMemoryLedger()),
            CountingOperation(TimeoutError("lost")),
            verifier=fixed_verifier(absent),
        )
        (attempt,) = result.receipt.attempt_records
        assert attempt.verification_status is ActionStatus.FAILED
        assert attempt.provider_request_id is None

    run(scenario())


def test_a_stored_observation_keeps_every_field_of_the_verifier_answer() -> None:
    async def scenario() -> None:
        answer = VerificationResult.absent(
            verified_provider_reference=REF,
            retry_safe=False,
            health=VerificationHealth.DEGRADED,
            conclusive_absence=False,
            details={"region": "eu"},
        )
        result = await execute(
            ActionRunner(InMemoryLedger()),
            CountingOperation(TimeoutError("lost")),
            verifier=fixed_verifier(answer),
        )
        observation = result.receipt.metadata["verification"]
        assert observation["source"] == "execute"
        assert observation["attempt"] == 1
        assert observation["claimed"] == "FAILED"
        assert observation["health"] == "DEGRADED"
        assert observation["conclusive_absence"] is False
        assert observation["retry_safe"] is False
        assert observation["verified_provider_reference"] == REF
        assert observation["provider_request_id"] is None
        assert observation["details"] == {"region": "eu"}
        assert result.receipt.metadata["verification_observations"] == (observation,)

    run(scenario())


@pytest.mark.parametrize(("size", "kept"), [(3990, True), (4100, False)])
def test_observation_details_are_kept_only_while_small(size: int, kept: bool) -> None:
    # The bound is measured on compact JSON: "{"d":"xxx"}" is the text plus 8.
    details = {"d": "é" * (size - 8)}

    async def scenario() -> None:
        result = await execute(
            ActionRunner(InMemoryLedger()),
            CountingOperation(TimeoutError("lost")),
            verifier=fixed_verifier(
                VerificationResult.confirmed(verified_provider_reference=REF, details=details)
            ),
        )
        stored = result.receipt.metadata["verification"]["details"]
        assert stored == (details if kept else {"truncated": True})

    run(scenario())


def test_details_exactly_at_the_bound_are_kept() -> None:
    details = {"d": "x" * (4000 - 8)}

    async def scenario() -> None:
        result = await execute(
            ActionRunner(InMemoryLedger()),
            CountingOperation(TimeoutError("lost")),
            verifier=fixed_verifier(
                VerificationResult.confirmed(verified_provider_reference=REF, details=details)
            ),
        )
        assert result.receipt.metadata["verification"]["details"] == details

    run(scenario())


def test_a_raising_or_malformed_verifier_is_recorded_as_an_unknown_observation() -> None:
    async def scenario() -> None:
        for answer, problem in [
            (RuntimeError("read path down"), "verifier raised RuntimeError: read path down"),
            ("not a result", "verifier returned str, not a VerificationResult"),
        ]:
            result = await execute(
                ActionRunner(InMemoryLedger()),
                CountingOperation(TimeoutError("lost")),
                verifier=fixed_verifier(answer),
            )
            observation = result.receipt.metadata["verification"]
            assert observation["source"] == "execute"
            assert observation["attempt"] == 1
            assert observation["status"] == "UNKNOWN"
            assert observation["provider_request_id"] is None
            assert observation["error"] == problem
            assert result.receipt.verification_status is ActionStatus.UNKNOWN

    run(scenario())


def test_an_unbound_confirmation_is_recorded_with_the_reason() -> None:
    async def scenario() -> None:
        result = await execute(
            ActionRunner(InMemoryLedger()),
            CountingOperation(TimeoutError("lost")),
            verifier=fixed_verifier(confirmed(ref="another-order")),
        )
        observation = result.receipt.metadata["verification"]
        assert observation["status"] == "UNKNOWN"
        assert "another-order" in observation["error"]
        assert result.status is ActionStatus.UNKNOWN

    run(scenario())


def test_an_unknown_answer_for_another_reference_is_not_a_binding_problem() -> None:
    async def scenario() -> None:
        answer = VerificationResult.unknown(reason="queue lag", verified_provider_reference="x")
        result = await execute(
            ActionRunner(InMemoryLedger()),
            CountingOperation(TimeoutError("lost")),
            verifier=fixed_verifier(answer),
        )
        observation = result.receipt.metadata["verification"]
        assert observation["status"] == "UNKNOWN"
        assert observation["reason"] == "queue lag"
        assert observation["verified_provider_reference"] == "x"
        assert "error" not in observation

    run(scenario())


# -- cancellation --------------------------------------------------------------------


def test_a_cancelled_attempt_is_recorded_completed_unknown_with_its_evidence() -> None:
    async def scenario() -> None:
        ledger = InMemoryLedger()
        runner = ActionRunner(ledger)
        started = asyncio.Event()

        async def slow() -> None:
            started.set()
            await asyncio.sleep(3600)

        task = asyncio.create_task(
            runner.execute(
                "charge",
                slow,
                request=REQUEST,
                idempotency_key="k",
                provider_reference=REF,
                metadata={"ticket": "T-1"},
            )
        )
        await started.wait()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        stored = await ledger.find("charge", "k")
        assert stored is not None
        assert stored.claim_state is ClaimState.COMPLETED
        assert stored.version == 3
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

    run(scenario())


def test_a_failed_read_of_a_receipt_says_nothing_was_invoked() -> None:
    async def scenario() -> None:
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

    run(scenario())


def test_recover_pending_settles_a_completed_unknown_and_leaves_a_settled_one() -> None:
    async def scenario() -> None:
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

    run(scenario())


def test_recovering_a_stranded_claim_records_how_and_keeps_caller_metadata() -> None:
    async def scenario() -> None:
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
        recovered = await ActionRunner(inner).recover_pending(
            action_id, fixed_verifier(confirmed())
        )
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
        assert later.replayed is False

    run(scenario())


def test_refusals_carry_the_receipt_they_refused() -> None:
    async def scenario() -> None:
        ledger = InMemoryLedger()
        runner = ActionRunner(ledger)
        done = await execute(runner, key="done")
        claim = await unstarted(ledger, key="unstarted")
        unstarted_id = claim.action_id
        stuck = await stranded(ledger)
        for call, action_id in [
            (runner.release_unstarted, done.receipt.action_id),
            (runner.release_unstarted, stuck.action_id),
            (lambda a: runner.recover_pending(a, fixed_verifier(confirmed())), unstarted_id),
            (lambda a: runner.reconcile(a, fixed_verifier(confirmed())), stuck.action_id),
        ]:
            with pytest.raises(RecoveryRefusedError) as info:
                await call(action_id)
            assert info.value.receipt == await ledger.get(action_id)

    run(scenario())


def test_a_completed_claim_with_no_attempt_cannot_be_released() -> None:
    # Not produced by the runner, but a ledger may hold one (an import, a repair):
    # "completed" alone must refuse the release.
    async def scenario() -> None:
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

    run(scenario())


@pytest.mark.parametrize("committed", [False, True])
def test_an_unacknowledged_release_is_settled_by_reading_back(
    committed: bool, caplog: pytest.LogCaptureFixture
) -> None:
    async def scenario() -> None:
        ledger = InMemoryLedger()
        claim = await unstarted(ledger)
        faulty = FaultyLedger(ledger)
        faulty.inject("release", LOSE if committed else FAIL)
        runner = ActionRunner(faulty)
        if committed:
            await runner.release_unstarted(claim.action_id)
            assert await ledger.get(claim.action_id) is None
        else:
            with pytest.raises(ActionPersistenceError) as failed:
                await runner.release_unstarted(claim.action_id)
            assert failed.value.receipt == claim
            assert failed.value.operation_invoked is False
            assert str(failed.value).startswith(f"the release of action {claim.action_id} failed")
            assert await ledger.get(claim.action_id) == claim

    run(scenario())
    if committed:
        assert events(caplog)[-1][:2] == ("released", logging.INFO)


def test_a_release_whose_read_back_fails_carries_the_claim_it_meant_to_release() -> None:
    async def scenario() -> None:
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

    run(scenario())


def test_a_release_that_loses_a_race_carries_the_newer_receipt() -> None:
    async def scenario() -> None:
        ledger = InMemoryLedger()
        claim = await unstarted(ledger)
        faulty = FaultyLedger(ledger)

        faulty.release = refuse  # type: ignore[method-assign]
        with pytest.raises(RecoveryRefusedError) as refused:
            await ActionRunner(faulty).release_unstarted(claim.action_id)
        assert refused.value.receipt == claim

    run(scenario())


def test_a_failed_reconciliation_write_carries_what_is_stored_and_what_was_seen() -> None:
    async def scenario() -> None:
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

    run(scenario())


def test_a_lost_reconciliation_acknowledgement_is_a_success() -> None:
    async def scenario() -> None:
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

    run(scenario())


def test_a_claim_that_disappears_during_reconciliation_is_reported_by_id() -> None:
    async def scenario() -> None:
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

    run(scenario())


def test_a_reconciliation_that_keeps_losing_races_gives_up_with_the_latest_receipt() -> None:
    async def scenario() -> None:
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

    run(scenario())


# -- the outcome write ----------------------------------------------------------------


@pytest.mark.parametrize(
    ("answer", "status", "value"),
    [
        ("charged", ActionStatus.CONFIRMED, "charged"),
        (TimeoutError("lost"), ActionStatus.UNKNOWN, None),
    ],
)
def test_an_unrecorded_outcome_says_the_operation_ran_and_what_was_seen(
    answer: Any, status: ActionStatus, value: Any, caplog: pytest.LogCaptureFixture
) -> None:
    async def scenario() -> None:
        ledger = FaultyLedger(InMemoryLedger())
        ledger.inject("record", FAIL)
        with pytest.raises(ActionPersistenceError) as info:
            await execute(ActionRunner(ledger), CountingOperation(answer))
        error = info.value
        assert error.operation_invoked is True
        assert error.observed_status is status
        # A failed call has no value to expose, and none is made up.
        assert error.value_available is (value is not None)
        assert error.observed_value == value
        assert "injected: record failed before write" in str(error)

    run(scenario())
    event, level, fields = events(caplog)[-1]
    assert (event, level) == ("outcome_not_recorded", logging.ERROR)
    assert fields["observed_status"] == status.value
    assert fields["action_id"]
    assert fields["attempt"] == 1


def test_an_outcome_refused_by_the_ledger_names_the_concurrent_change() -> None:
    async def scenario() -> None:
        ledger = FaultyLedger(InMemoryLedger())

        ledger.record = refuse  # type: ignore[method-assign]
        with pytest.raises(ActionPersistenceError) as info:
            await execute(ActionRunner(ledger), CountingOperation(None))
        assert "(the claim changed concurrently)" in str(info.value)
        assert info.value.value_available is True
        assert info.value.observed_value is None

    run(scenario())


def test_a_lost_outcome_acknowledgement_is_logged_as_recovered(
    caplog: pytest.LogCaptureFixture,
) -> None:
    async def scenario() -> None:
        ledger = FaultyLedger(InMemoryLedger())
        ledger.inject("record", LOSE)
        result = await execute(ActionRunner(ledger))
        assert result.status is ActionStatus.CONFIRMED

    run(scenario())
    assert [e for e, _, _ in events(caplog)][-2:] == [
        "outcome_acknowledgement_recovered",
        "completed",
    ]


# -- retries and waiting ----------------------------------------------------------------


def test_a_retry_is_logged_with_the_status_that_caused_it(
    caplog: pytest.LogCaptureFixture,
) -> None:
    from dataoad import RetryPolicy

    async def scenario() -> None:
        runner = ActionRunner(
            InMemoryLedger(), policy=RetryPolicy(max_attempts=2, retry_on_failed=True)
        )
        op = CountingOperation(DefinitiveFailure("busy", retryable=True), "ok")
        result = await execute(runner, op)
        assert result.status is ActionStatus.CONFIRMED

    run(scenario())
    retrying = [(lvl, f) for e, lvl, f in events(caplog) if e == "retrying"]
    assert len(retrying) == 1
    level, fields = retrying[0]
    assert level == logging.INFO
    assert fields["attempt_status"] == "FAILED"
    assert fields["attempt"] == 1


def test_an_unknown_retried_through_the_escape_hatch_is_a_warning(
    caplog: pytest.LogCaptureFixture,
) -> None:
    import warnings

    from dataoad import RetryPolicy

    caplog.set_level(logging.INFO, logger="dataoad")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        policy = RetryPolicy(max_attempts=2, retry_on_unknown=True)

    async def scenario() -> None:
        runner = ActionRunner(InMemoryLedger(), policy=policy)
        with pytest.warns(RuntimeWarning) as caught:
            await execute(runner, CountingOperation(TimeoutError("lost"), "ok"))
        # mutmut's trampolines add stack frames, so only an unmutated run can
        # check where the warning points.
        if "MUTANT_UNDER_TEST" not in os.environ:
            assert caught[0].filename == __file__

    run(scenario())
    retrying = [(lvl, f) for e, lvl, f in events(caplog) if e == "retrying"]
    assert retrying[0][0] == logging.WARNING
    assert retrying[0][1]["attempt_status"] == "UNKNOWN"


def test_conflicts_are_warnings_whichever_field_differs(caplog: pytest.LogCaptureFixture) -> None:
    from dataoad import IdempotencyConflictError

    async def scenario() -> None:
        runner = ActionRunner(InMemoryLedger())
        await execute(runner)
        with pytest.raises(IdempotencyConflictError):
            await runner.execute(
                "charge", CountingOperation(), request=REQUEST, idempotency_key="k"
            )

    run(scenario())
    assert events(caplog)[-1][:2] == ("conflict", logging.WARNING)


def test_wait_in_progress_accepts_its_documented_maximum() -> None:
    from dataoad._arguments import MAX_WAIT_IN_PROGRESS

    async def scenario() -> None:
        result = await execute(
            ActionRunner(InMemoryLedger()), wait_in_progress=MAX_WAIT_IN_PROGRESS
        )
        assert result.status is ActionStatus.CONFIRMED
        with pytest.raises(InvalidArgumentError):
            await execute(ActionRunner(InMemoryLedger()), wait_in_progress=MAX_WAIT_IN_PROGRESS + 1)

    run(scenario())


def test_waiting_backs_off_by_doubling_and_stops_at_the_deadline() -> None:
    from dataoad import ActionInProgressError
    from dataoad._runner import WAIT_FIRST_DELAY, WAIT_MAX_DELAY

    async def scenario() -> None:
        ledger = InMemoryLedger()
        holder = FaultyLedger(ledger)
        holder.inject("record", FAIL)
        await stranded(ledger)  # the claim of "k" stays PENDING
        del holder
        now = [0.0]
        sleeps: list[float] = []

        class Virtual:
            def monotonic(self) -> float:
                return now[0]

            async def sleep(self, seconds: float) -> None:
                sleeps.append(seconds)
                now[0] += seconds

        runner = ActionRunner(ledger, clock=Virtual())
        total = WAIT_FIRST_DELAY * 7  # 1 + 2 + 4 delays
        with pytest.raises(ActionInProgressError):
            await execute(runner, wait_in_progress=total)
        assert sleeps == pytest.approx(
            [WAIT_FIRST_DELAY, 2 * WAIT_FIRST_DELAY, 4 * WAIT_FIRST_DELAY]
        )
        assert now[0] == pytest.approx(total)
        # The delay never grows past the cap.
        sleeps.clear()
        now[0] = 0.0
        with pytest.raises(ActionInProgressError):
            await execute(runner, wait_in_progress=3.0)
        assert max(sleeps) == WAIT_MAX_DELAY

    run(scenario())


# -- verifier answers ------------------------------------------------------------------


def test_confirmed_and_absent_answers_must_name_the_reference() -> None:
    for build in (VerificationResult.confirmed, VerificationResult.absent):
        with pytest.raises(
            InvalidArgumentError, match=r"^verified_provider_reference must be a str"
        ):
            build(verified_provider_reference=None)  # type: ignore[arg-type]


def test_each_field_of_a_verifier_answer_is_kept() -> None:
    answer = VerificationResult.absent(
        verified_provider_reference=REF,
        health=VerificationHealth.DEGRADED,
        details={"a": 1},
    )
    assert answer.health is VerificationHealth.DEGRADED
    assert answer.details == {"a": 1}
    answer = VerificationResult.confirmed(verified_provider_reference=REF, details={"b": 2})
    assert answer.details == {"b": 2}
    answer = VerificationResult.unknown(
        reason="lag", health=VerificationHealth.DEGRADED, verified_provider_reference=REF
    )
    assert answer.health is VerificationHealth.DEGRADED
    assert answer.verified_provider_reference == REF


# -- what every refusal says -------------------------------------------------------------


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"outcome": "CONFIRMED"}, "outcome must be an ActionStatus"),
        ({"health": "HEALTHY"}, "health must be a VerificationHealth"),
        ({"retry_safe": 1}, "retry_safe must be a bool"),
        ({"conclusive_absence": None}, "conclusive_absence must be a bool"),
        ({"verified_provider_reference": 7}, "verified_provider_reference must be a str, not int"),
        ({"provider_request_id": ""}, "provider_request_id must not be empty"),
        ({"reason": b"x"}, "reason must be a str"),
        (
            {"details": {"x": object()}},
            'verification details are not JSON-compatible: details["x"] has unsupported type',
        ),
    ],
)
def test_a_malformed_verifier_answer_names_the_field(fields: dict[str, Any], message: str) -> None:
    base: dict[str, Any] = {"outcome": ActionStatus.UNKNOWN}
    with pytest.raises(InvalidArgumentError) as info:
        VerificationResult(**{**base, **fields})
    assert str(info.value).startswith(message)


def test_an_unknown_answer_needs_a_textual_reason() -> None:
    with pytest.raises(InvalidArgumentError) as info:
        VerificationResult.unknown(reason=3)  # type: ignore[arg-type]
    assert str(info.value) == "reason must be a str"


def test_a_stored_text_must_be_encodable() -> None:
    from dataoad._verification import check_stored_text

    with pytest.raises(InvalidArgumentError) as info:
        check_stored_text("name", "a\ud800", limit=10)
    assert str(info.value) == "name is not valid Unicode (lone surrogate)"
    with pytest.raises(InvalidArgumentError) as info:
        check_stored_text("name", None, limit=10)
    assert str(info.value) == "name must be a str, not NoneType"


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda: ActionRunner(object()), "ledger object does not implement the Ledger protocol"),
        (lambda: ActionRunner(InMemoryLedger(), policy=3), "policy must be a RetryPolicy, not int"),
    ],
)
def test_a_bad_runner_argument_is_named(call: Any, message: str) -> None:
    with pytest.raises(InvalidArgumentError) as info:
        call()
    assert str(info.value).startswith(message)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"operation": 3}, "operation must be callable, not int"),
        ({"policy": "x"}, "policy must be a RetryPolicy, not str"),
        (
            {"verifier": fixed_verifier(confirmed()), "provider_reference": None},
            "a verifier needs provider_reference: verification must be bound to the "
            "provider's own reference for this mutation",
        ),
        (
            {"verifier": 3},
            "verifier must have a callable verify(receipt) method or be a callable, not int",
        ),
    ],
)
def test_a_bad_execute_argument_is_named_before_anything_is_stored(
    kwargs: dict[str, Any], message: str
) -> None:
    async def scenario() -> None:
        ledger = InMemoryLedger()
        call: dict[str, Any] = {
            "operation": CountingOperation(),
            "request": REQUEST,
            "idempotency_key": "k",
            "provider_reference": REF,
            **kwargs,
        }
        operation = call.pop("operation")
        with pytest.raises(InvalidArgumentError) as info:
            await ActionRunner(ledger).execute("charge", operation, **call)
        assert str(info.value) == message
        assert await ledger.find("charge", "k") is None

    run(scenario())


def test_operator_refusals_say_what_to_do_instead() -> None:
    async def scenario() -> None:
        ledger = InMemoryLedger()
        stuck = await stranded(ledger)
        claim = await unstarted(ledger, key="unstarted")
        runner = ActionRunner(ledger)
        verifier = fixed_verifier(confirmed())
        with pytest.raises(RecoveryRefusedError) as info:
            await runner.reconcile(stuck.action_id, verifier)
        assert str(info.value).endswith(
            "make sure its worker has stopped, then use recover_pending"
        )
        with pytest.raises(RecoveryRefusedError) as info:
            await runner.recover_pending(claim.action_id, verifier)
        assert str(info.value).endswith("so use release_unstarted instead")
        with pytest.raises(RecoveryRefusedError) as info:
            await runner.release_unstarted(stuck.action_id)
        assert str(info.value).endswith(
            "only a claim that never invoked its operation can be released"
        )

    run(scenario())


def test_an_unrecorded_outcome_tells_the_operator_not_to_repeat_it() -> None:
    async def scenario() -> None:
        ledger = FaultyLedger(InMemoryLedger())
        ledger.inject("record", FAIL)
        with pytest.raises(ActionPersistenceError) as info:
            await execute(ActionRunner(ledger))
        assert str(info.value).endswith(
            "The operation WAS invoked: do not repeat it. Re-read the ledger; a PENDING claim "
            "needs read-only recover_pending"
        )

    run(scenario())


def test_observations_and_recoveries_are_timestamped() -> None:
    from datetime import datetime

    async def scenario() -> None:
        ledger = InMemoryLedger()
        stuck = await stranded(ledger)
        recovered = await ActionRunner(ledger).recover_pending(
            stuck.action_id, fixed_verifier(confirmed())
        )
        metadata = recovered.receipt.metadata
        assert datetime.fromisoformat(metadata["verification"]["observed_at"])
        assert datetime.fromisoformat(metadata["recovery"]["recovered_at"])

    run(scenario())


# -- more of what reconciliation and recovery keep --------------------------------------


def test_reconciling_an_inconclusive_recovery_keeps_its_recovery_note(
    caplog: pytest.LogCaptureFixture,
) -> None:
    async def scenario() -> None:
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

    run(scenario())
    settled = [
        (e, f["action_id"]) for e, _, f in events(caplog) if e in ("recovered", "reconciled")
    ]
    assert [e for e, _ in settled] == ["recovered", "reconciled"]


def test_a_recovery_refuses_when_the_worker_starts_another_attempt_meanwhile() -> None:
    from dataoad.testing._ledger_contract import started

    async def scenario() -> None:
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

    run(scenario())


def test_a_failed_reconciliation_write_carries_the_newer_stored_receipt() -> None:
    async def scenario() -> None:
        ledger = InMemoryLedger()
        unknown_result = await unknown(ledger)
        other = await ActionRunner(ledger).reconcile(
            unknown_result.receipt.action_id,
            fixed_verifier(VerificationResult.unknown(reason="lag")),
        )
        faulty = FaultyLedger(ledger)

        async def fails(receipt: ActionReceipt) -> bool:
            raise ConnectionError("write failed")

        faulty.record = fails  # type: ignore[method-assign]
        runner = ActionRunner(faulty)
        # The runner read the claim before the other reconciliation landed.
        runner_receipt = runner.receipt

        async def stale(action_id: str) -> ActionReceipt:
            return unknown_result.receipt

        runner.receipt = stale  # type: ignore[method-assign]
        with pytest.raises(ActionPersistenceError) as info:
            await runner.reconcile(unknown_result.receipt.action_id, fixed_verifier(confirmed()))
        assert info.value.receipt == other.receipt
        del runner_receipt

    run(scenario())


def test_a_failed_reconciliation_write_and_read_back_carries_the_receipt_it_read() -> None:
    async def scenario() -> None:
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

    run(scenario())


# -- what a duplicate gets ------------------------------------------------------------


class StaleFindLedger(FaultyLedger):
    """Its first look never sees an existing claim (a replica that lags)."""

    async def find(self, action_name: str, idempotency_key: str) -> ActionReceipt | None:
        self.calls.append("find")
        return None


def test_a_duplicate_that_loses_the_claim_race_gets_the_stored_claim_answered() -> None:
    async def scenario() -> None:
        ledger = InMemoryLedger()
        first = await execute(
            ActionRunner(ledger),
            CountingOperation(TimeoutError("lost")),
            verifier=fixed_verifier(VerificationResult.unknown(reason="lag")),
        )
        assert first.status is ActionStatus.UNKNOWN
        op = CountingOperation("ok")
        second = await execute(
            ActionRunner(StaleFindLedger(ledger)), op, verifier=fixed_verifier(confirmed())
        )
        assert op.calls == 0
        assert second.replayed is True
        # The duplicate's verifier settled the stored UNKNOWN claim.
        assert second.status is ActionStatus.CONFIRMED
        assert second.receipt.action_id == first.receipt.action_id

    run(scenario())


def test_a_failed_first_look_says_nothing_was_invoked() -> None:
    async def scenario() -> None:
        ledger = FaultyLedger(InMemoryLedger())
        ledger.inject("find", FAIL)
        op = CountingOperation()
        with pytest.raises(ActionPersistenceError) as info:
            await execute(ActionRunner(ledger), op)
        assert op.calls == 0
        assert info.value.operation_invoked is False
        assert info.value.receipt is None
        assert str(info.value).endswith("; nothing was invoked")

    run(scenario())


def test_duplicates_are_told_what_they_met(caplog: pytest.LogCaptureFixture) -> None:
    from dataoad import ActionInProgressError, IdempotencyConflictError

    async def scenario() -> None:
        ledger = InMemoryLedger()
        stuck = await stranded(ledger)
        runner = ActionRunner(ledger)
        with pytest.raises(ActionInProgressError) as busy:
            await execute(runner)
        assert str(busy.value) == (
            f"action {stuck.action_id} ('charge', key 'k') is still in progress; "
            "it was not invoked again"
        )
        with pytest.raises(IdempotencyConflictError) as conflict:
            await runner.execute("charge", CountingOperation(), request={}, idempotency_key="k")
        assert str(conflict.value) == (
            f"idempotency key 'k' of 'charge' is already claimed by action {stuck.action_id} "
            "for a different request"
        )

    run(scenario())
    tail = events(caplog)[-2:]
    assert [(e, lvl) for e, lvl, _ in tail] == [
        ("in_progress", logging.INFO),
        ("conflict", logging.WARNING),
    ]


def test_every_transition_record_names_its_action(caplog: pytest.LogCaptureFixture) -> None:
    async def scenario() -> None:
        ledger = InMemoryLedger()
        runner = ActionRunner(ledger)
        await execute(runner, key="plain")
        await execute(runner, key="plain")  # replayed
        faulty = FaultyLedger(ledger)
        faulty.inject("record", LOSE)
        await execute(ActionRunner(faulty), key="lost-ack")
        claim = await unstarted(ledger, key="to-release")
        await runner.release_unstarted(claim.action_id)
        claim = await unstarted(ledger, key="to-release-unacknowledged")
        faulty.inject("release", LOSE)
        await ActionRunner(faulty).release_unstarted(claim.action_id)

    run(scenario())
    seen = {e for e, _, _ in events(caplog)}
    assert {
        "claimed",
        "attempt_started",
        "completed",
        "replayed",
        "outcome_acknowledgement_recovered",
        "released",
    } <= seen
    for event, _, fields in events(caplog):
        assert fields.get("action_id"), f"{event} record without an action id"
        assert fields.get("action_name") == "charge", event


# -- what a started attempt stores -----------------------------------------------------


def test_a_started_attempt_is_stored_numbered_with_the_callers_metadata() -> None:
    async def scenario() -> None:
        ledger = InMemoryLedger()
        faulty = FaultyLedger(ledger)
        faulty.inject("record", FAIL)
        with pytest.raises(ActionPersistenceError):
            await ActionRunner(faulty).execute(
                "charge",
                CountingOperation(),
                request=REQUEST,
                idempotency_key="k",
                provider_reference=REF,
                risk="financial",
                metadata={"ticket": "T-1"},
            )
        stored = await ledger.find("charge", "k")
        assert stored is not None
        assert stored.risk == "financial"
        assert stored.metadata == {"ticket": "T-1"}
        (attempt,) = stored.attempt_records
        assert attempt.number == 1
        assert stored.updated_at == attempt.started_at

    run(scenario())


def test_a_retry_starts_with_the_earlier_observations_stored() -> None:
    from dataoad import RetryPolicy

    async def scenario() -> None:
        ledger = InMemoryLedger()
        faulty = FaultyLedger(ledger)
        faulty.inject("record", FAIL)
        runner = ActionRunner(faulty, policy=RetryPolicy(max_attempts=2, retry_on_failed=True))
        absent = VerificationResult.absent(verified_provider_reference=REF, retry_safe=True)
        with pytest.raises(ActionPersistenceError):
            await execute(
                runner,
                CountingOperation(TimeoutError("lost"), TimeoutError("lost")),
                verifier=fixed_verifier(absent, VerificationResult.unknown(reason="lag")),
            )
        stored = await ledger.find("charge", "k")
        assert stored is not None
        assert stored.attempts == 2
        observations = stored.metadata["verification_observations"]
        assert [o["attempt"] for o in observations] == [1]
        assert observations[0]["status"] == "FAILED"

    run(scenario())


# -- values a result may expose ----------------------------------------------------------


def test_a_value_recovered_by_the_verifier_is_exposed_when_its_request_id_matches() -> None:
    async def scenario() -> None:
        result = await execute(
            ActionRunner(InMemoryLedger()),
            CountingOperation(TimeoutError("lost")),
            verifier=fixed_verifier(confirmed(rid="pr_7", value="receipt-7")),
        )
        assert result.status is ActionStatus.CONFIRMED
        assert result.value == "receipt-7"
        unbound = await execute(
            ActionRunner(InMemoryLedger()),
            CountingOperation(TimeoutError("lost")),
            verifier=fixed_verifier(confirmed(rid=None, value="receipt-?")),
        )
        assert unbound.status is ActionStatus.CONFIRMED
        assert not unbound.value_available

    run(scenario())


def test_the_operations_own_value_wins_over_the_verifiers() -> None:
    async def scenario() -> None:
        result = await execute(
            ActionRunner(InMemoryLedger()),
            CountingOperation("from-the-call"),
            verifier=fixed_verifier(confirmed(rid="pr_7", value="from-the-read")),
        )
        assert result.value == "from-the-call"

    run(scenario())


def test_a_cancelled_attempt_keeps_the_observations_of_earlier_attempts() -> None:
    from dataoad import RetryPolicy

    async def scenario() -> None:
        ledger = InMemoryLedger()
        runner = ActionRunner(ledger, policy=RetryPolicy(max_attempts=2, retry_on_failed=True))
        retrying = asyncio.Event()
        calls = 0

        async def op() -> None:
            nonlocal calls
            calls += 1
            if calls == 1:
                raise TimeoutError("lost")
            retrying.set()
            await asyncio.sleep(3600)

        absent = VerificationResult.absent(verified_provider_reference=REF, retry_safe=True)
        task = asyncio.create_task(execute(runner, op, verifier=fixed_verifier(absent)))
        await retrying.wait()
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

    run(scenario())


# -- the remaining details mutation testing asked for --------------------------------------


def test_a_bad_text_argument_is_named() -> None:
    async def scenario() -> None:
        with pytest.raises(InvalidArgumentError) as info:
            await ActionRunner(InMemoryLedger()).execute(
                3,  # type: ignore[arg-type]
                CountingOperation(),
                request={},
                idempotency_key="k",
            )
        assert str(info.value) == "action_name must be a str, not int"

    run(scenario())


def test_a_partial_ledger_is_refused_naming_every_missing_method() -> None:
    class Partial:
        async def claim(self, receipt: Any) -> Any: ...
        async def find(self, action_name: str, key: str) -> Any: ...
        async def start_attempt(self, receipt: Any) -> Any: ...
        async def release(self, action_id: str, version: int) -> Any: ...

    with pytest.raises(InvalidArgumentError) as info:
        ActionRunner(Partial())  # type: ignore[arg-type]
    assert str(info.value).endswith("(missing get, record)")


def test_the_missing_value_marker_reads_as_missing_and_stays_one_object() -> None:
    import copy
    import pickle

    from dataoad._verification import MISSING

    assert repr(MISSING) == "<missing>"
    assert pickle.loads(pickle.dumps(MISSING)) is MISSING
    assert copy.deepcopy(MISSING) is MISSING


def test_observation_details_are_measured_as_compact_json() -> None:
    # 370 keys: with wider separators the same details would exceed the bound.
    details = {f"k{i:03d}": i for i in range(370)}
    import json

    assert len(json.dumps(details, separators=(",", ":"))) <= 4000 < len(json.dumps(details))

    async def scenario() -> None:
        result = await execute(
            ActionRunner(InMemoryLedger()),
            CountingOperation(TimeoutError("lost")),
            verifier=fixed_verifier(
                VerificationResult.confirmed(verified_provider_reference=REF, details=details)
            ),
        )
        assert result.receipt.metadata["verification"]["details"] == details
        assert result.receipt.updated_at >= result.receipt.attempt_records[-1].finished_at

    run(scenario())


def test_an_attempt_start_error_carries_what_a_concurrent_writer_stored() -> None:
    from dataoad.testing._ledger_contract import started

    async def scenario() -> None:
        for raises in (True, False):
            inner = InMemoryLedger()
            ledger = FaultyLedger(inner)

            async def start_attempt(
                receipt: ActionReceipt, inner: InMemoryLedger = inner, raises: bool = raises
            ) -> bool:
                # Another worker (holding the same claim) starts its attempt first.
                previous = await inner.get(receipt.action_id)
                assert previous is not None
                assert await inner.start_attempt(started(previous, seconds=5))
                if raises:
                    raise ConnectionError("write failed")
                return False

            ledger.start_attempt = start_attempt  # type: ignore[method-assign]
            op = CountingOperation()
            with pytest.raises(ActionPersistenceError) as info:
                await execute(ActionRunner(ledger), op)
            stored = await inner.find("charge", "k")
            assert op.calls == 0
            assert info.value.receipt == stored
            assert stored is not None
            assert stored.attempts == 1
            if not raises:
                assert str(info.value).endswith(
                    "start (released or recovered concurrently?); the operation was not invoked"
                )

    run(scenario())


def test_a_refused_attempt_start_whose_read_back_fails_carries_the_claim() -> None:
    async def scenario() -> None:
        ledger = FaultyLedger(InMemoryLedger())
        ledger.start_attempt = refuse  # type: ignore[method-assign]
        ledger.inject("get", FAIL)
        with pytest.raises(ActionPersistenceError) as info:
            await execute(ActionRunner(ledger))
        assert isinstance(info.value.receipt, ActionReceipt)
        assert info.value.receipt.attempts == 0

    run(scenario())


def test_ledger_errors_are_quoted_in_what_the_operator_reads() -> None:
    async def scenario() -> None:
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

    run(scenario())


def test_a_release_that_loses_a_race_says_nothing_was_released(
    caplog: pytest.LogCaptureFixture,
) -> None:
    async def scenario() -> None:
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

    run(scenario())
    released = [(lvl, f) for e, lvl, f in events(caplog) if e == "released"]
    assert len(released) == 1
    assert released[0][1]["action_id"]


def test_duplicates_leave_records_naming_the_claim_they_met(
    caplog: pytest.LogCaptureFixture,
) -> None:
    from dataoad import ActionInProgressError, IdempotencyConflictError

    async def scenario() -> None:
        ledger = InMemoryLedger()
        stuck = await stranded(ledger)
        runner = ActionRunner(ledger)
        with pytest.raises(ActionInProgressError):
            await execute(runner)
        with pytest.raises(IdempotencyConflictError):
            await runner.execute("charge", CountingOperation(), request={}, idempotency_key="k")
        for event, _, fields in events(caplog)[-2:]:
            assert fields["action_id"] == stuck.action_id, event

    run(scenario())


def test_a_reconciliation_moves_the_receipts_update_time() -> None:
    async def scenario() -> None:
        ledger = InMemoryLedger()
        unknown_result = await unknown(ledger)
        await asyncio.sleep(0.001)
        settled = await ActionRunner(ledger).reconcile(
            unknown_result.receipt.action_id, fixed_verifier(confirmed())
        )
        assert settled.receipt.updated_at > unknown_result.receipt.updated_at
        assert settled.receipt.execution_status is ActionStatus.UNKNOWN

    run(scenario())
