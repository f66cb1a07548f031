"""The runner's declared seams: observers, typed evidence records, SQL bound by name."""

from __future__ import annotations

import dataclasses
import logging
from typing import Any

import pytest

from dataoad import (
    ActionRunner,
    ActionStatus,
    ClaimState,
    EventKind,
    InMemoryLedger,
    InvalidArgumentError,
    ObservationSource,
    RecoveryRecord,
    RunnerEvent,
    VerificationObservation,
)
from dataoad.ledgers._codec import WRITTEN
from dataoad.ledgers._statements import POSTGRES, SQLITE, Statements, compile_sql
from dataoad.testing import FaultyLedger, LedgerFault
from suite_support import REF, REQUEST, CountingOperation, closing, confirmed, unstarted


class Recorder:
    """An observer that keeps every event."""

    def __init__(self) -> None:
        self.events: list[RunnerEvent] = []

    def on_event(self, event: RunnerEvent) -> None:
        self.events.append(event)

    def kinds(self, verb: str) -> list[EventKind]:
        return [e.kind for e in self.events if e.verb == verb]


async def lost() -> None:
    raise TimeoutError("response lost")


# -- observers -----------------------------------------------------------------


@pytest.mark.asyncio
async def test_an_observer_sees_every_verb_and_its_transitions(new_ledger: Any) -> None:
    seen = Recorder()
    ledger = new_ledger()
    runner = ActionRunner(ledger, observers=[seen])
    first = await runner.execute(
        "charge", lost, request=REQUEST, idempotency_key="k", provider_reference=REF
    )
    await runner.reconcile(first.receipt.action_id, lambda r: confirmed())
    assert seen.kinds("execute") == [
        EventKind.CALL_STARTED,
        EventKind.CLAIMED,
        EventKind.ATTEMPT_STARTED,
        EventKind.COMPLETED,
        EventKind.CALL_FINISHED,
    ]
    assert seen.kinds("reconcile") == [
        EventKind.CALL_STARTED,
        EventKind.RECONCILED,
        EventKind.CALL_FINISHED,
    ]
    execute_calls = {e.call for e in seen.events if e.verb == "execute"}
    assert len(execute_calls) == 1  # one call id ties a verb's events together
    finished = seen.events[4]
    assert finished.result is not None
    assert finished.result.status is ActionStatus.UNKNOWN
    assert finished.receipt == first.receipt  # the finished call names its receipt
    assert finished.action_name == "charge"
    reconciled = seen.events[-1]
    assert reconciled.action_id == first.receipt.action_id
    assert reconciled.result.status is ActionStatus.CONFIRMED
    await closing(ledger)


@pytest.mark.asyncio
async def test_an_observer_sees_refusals_and_releases() -> None:
    inner = InMemoryLedger()
    faulty = FaultyLedger(inner)
    # The claim lands but its acknowledgement and the read-back are lost.
    faulty.inject("claim", LedgerFault.LOSE_ACKNOWLEDGEMENT)
    faulty.inject("find", LedgerFault.FAIL_BEFORE_WRITE)
    seen = Recorder()
    with pytest.raises(Exception, match="not invoked"):
        await ActionRunner(faulty, observers=[seen]).execute(
            "charge", CountingOperation(), request=REQUEST, idempotency_key="k"
        )
    failed = seen.events[-1]
    assert failed.kind is EventKind.CALL_FINISHED
    assert type(failed.error).__name__ == "NothingInvokedError"
    [stranded] = inner.snapshot()
    # The refusal's receipt travels with the finished call: observers (spans,
    # metrics) can name the claim that was left behind.
    assert failed.receipt is not None
    assert failed.receipt.action_id == stranded.action_id
    legacy = await unstarted(inner, key="legacy")  # only a v0.1 runner left these
    await ActionRunner(inner, observers=[seen]).release_unstarted(legacy.action_id)
    assert seen.kinds("release_unstarted") == [
        EventKind.CALL_STARTED,
        EventKind.RELEASED,
        EventKind.CALL_FINISHED,
    ]
    released = seen.events[-1]
    assert released.result is None  # the verb returns nothing
    assert released.error is None


@pytest.mark.asyncio
async def test_a_raising_observer_changes_nothing(caplog: pytest.LogCaptureFixture) -> None:
    class Broken:
        def on_event(self, event: RunnerEvent) -> None:
            raise RuntimeError("telemetry down")

    operation = CountingOperation()
    ledger = InMemoryLedger()
    with caplog.at_level(logging.WARNING, logger="dataoad"):
        result = await ActionRunner(ledger, observers=[Broken()]).execute(
            "charge", operation, request=REQUEST, idempotency_key="k"
        )
    assert result.status is ActionStatus.CONFIRMED
    assert operation.calls == 1
    assert [r.final_status for r in ledger.snapshot()] == [ActionStatus.CONFIRMED]
    assert any("telemetry down" in (r.exc_text or "") for r in caplog.records)


@pytest.mark.asyncio
async def test_events_are_logged_under_their_kinds_value(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO, logger="dataoad"):
        await ActionRunner(InMemoryLedger()).execute(
            "charge", CountingOperation(), request=REQUEST, idempotency_key="k"
        )
    logged = [r.dataoad["event"] for r in caplog.records]  # type: ignore[attr-defined]
    assert logged == ["claimed", "attempt_started", "completed"]
    assert {EventKind(name) for name in logged} <= set(EventKind)


@pytest.mark.parametrize(
    ("observers", "named"), [([object()], "object"), ("on_event", "str"), (3, "int")]
)
def test_a_bad_observer_is_refused_when_the_runner_is_made(observers: Any, named: str) -> None:
    with pytest.raises(InvalidArgumentError, match="observer") as refused:
        ActionRunner(InMemoryLedger(), observers=observers)
    assert named in str(refused.value)


@pytest.mark.asyncio
async def test_observers_never_see_an_invalid_name_or_id_as_one() -> None:
    """A verb refused for a bad argument still reports its call, without the bad value."""
    seen = Recorder()
    runner = ActionRunner(InMemoryLedger(), observers=[seen])
    with pytest.raises(InvalidArgumentError):
        await runner.execute(  # type: ignore[call-overload]
            42, CountingOperation(), request=REQUEST, idempotency_key="k"
        )
    with pytest.raises(InvalidArgumentError):
        await runner.reconcile(7, lambda r: confirmed())  # type: ignore[arg-type]
    assert [e.kind for e in seen.events] == [EventKind.CALL_STARTED, EventKind.CALL_FINISHED] * 2
    assert all(e.action_name is None and e.action_id is None for e in seen.events)


# -- typed evidence records ----------------------------------------------------------


@pytest.mark.asyncio
async def test_observations_and_recovery_are_typed_records_in_the_stored_shape(
    new_ledger: Any,
) -> None:
    ledger = new_ledger()
    runner = ActionRunner(ledger)
    first = await runner.execute(
        "charge", lost, request=REQUEST, idempotency_key="k", provider_reference=REF
    )
    settled = await runner.reconcile(first.receipt.action_id, lambda r: confirmed())
    stored = await runner.receipt(first.receipt.action_id)
    [observation] = stored.observations
    assert observation.source is ObservationSource.RECONCILE
    assert observation.status is ActionStatus.CONFIRMED
    assert observation.claimed is ActionStatus.CONFIRMED
    assert observation.provider_request_id == "pr_1"
    assert observation.number == 1
    # The JSON shape is what v0.1 stored, so old files and tables still read.
    raw = stored.metadata["verification_observations"][0]
    assert dict(raw) == dict(observation.to_json())
    assert VerificationObservation.from_json(raw) == observation
    assert stored.metadata["verification"] == raw
    assert settled.receipt == stored
    assert stored.recovery is None
    await closing(ledger)


def test_an_observation_written_before_numbering_still_reads() -> None:
    raw = {
        "source": "execute",
        "attempt": 1,
        "status": "UNKNOWN",
        "observed_at": "2026-01-01T00:00:00+00:00",
        "provider_request_id": None,
        "error": "verifier raised TimeoutError: slow",
    }
    observation = VerificationObservation.from_json(raw)
    assert observation.number is None
    assert not observation.answered
    assert observation.source is ObservationSource.EXECUTE
    assert dict(observation.to_json()) == raw


def test_a_recovery_record_round_trips() -> None:
    raw = {"method": "recover_pending", "recovered_at": "2026-01-01T00:00:00+00:00", "attempts": 2}
    record = RecoveryRecord.from_json(raw)
    assert record.attempts == 2
    assert dict(record.to_json()) == raw
    with pytest.raises(ValueError, match="recovery record"):
        RecoveryRecord.from_json({"method": "x"})


# -- SQL written once, bound by name --------------------------------------------------


def test_a_repeated_name_is_one_numbered_parameter_but_two_question_marks() -> None:
    template = "UPDATE t SET a = :a WHERE b = :b AND NOT (:a = 'x')"
    pg = compile_sql(template, POSTGRES)
    assert pg.sql == "UPDATE t SET a = $1 WHERE b = $2 AND NOT ($1 = 'x')"
    assert pg.bind({"a": 1, "b": 2}) == (1, 2)
    lite = compile_sql(template, SQLITE)
    assert lite.sql == "UPDATE t SET a = ? WHERE b = ? AND NOT (? = 'x')"
    assert lite.bind({"a": 1, "b": 2}) == (1, 2, 1)
    with pytest.raises(KeyError, match="b"):
        lite.bind({"a": 1})


@pytest.mark.parametrize("dialect", [SQLITE, POSTGRES], ids=lambda d: d.name)
def test_every_statement_binds_only_known_names(dialect: Any) -> None:
    statements = Statements("receipts", dialect)
    # The lease and the time of storing are stamped from the ledger's clock,
    # never taken from the receipt; an age asked for is judged by it too.
    lease = {"lease_end"} if dialect is SQLITE else {"now", "lease"}
    clock = lease | {"now"}
    age = {"cutoff"} if dialect is SQLITE else {"older_than"}
    judged = {"now"}
    transition = {*WRITTEN, "previous_version", "previous_attempts", *clock}
    expected = {
        "claim": set(WRITTEN) | clock,
        "get": {"action_id"},
        "find": {"namespace", "action_name", "idempotency_key"},
        "release": {"action_id", "version"},
        "start_attempt": transition,
        "record": set(WRITTEN) | {"previous_version", "now"},
        "take_over": set(WRITTEN)
        - {"metadata", "attempt_records", "claim_state"}
        - {"execution_status", "verification_status", "final_status", "provider_request_id"}
        - {"error"}
        | {"previous_version"}
        | clock
        | judged,
        # A renewal is not a transition: it moves the lease, not the time of storing.
        "renew": {"action_id", "fencing_token"} | lease,
        # Retiring sets retired_at over the exact version, every column the same,
        # and an expiry asks the ledger's clock whether the receipt is old enough.
        "retire": set(WRITTEN) | {"previous_version", "now"} | age,
    }
    for name, names in expected.items():
        assert set(statements[name].names) == names, name
    # Identity and version are conditions, never assigned by a transition.
    record = statements["record"].sql
    assert "SET claim_state" in record
    assert "action_name = " not in record.split("WHERE")[0]
    assert (dialect.null_safe_equal + " ") in record.split("WHERE")[1]


@pytest.mark.parametrize("dialect", [SQLITE, POSTGRES], ids=lambda d: d.name)
def test_a_listing_binds_each_filter_it_uses(dialect: Any) -> None:
    listing, values = Statements("receipts", dialect).listing(
        final_status=ActionStatus.UNKNOWN, pending=None, action_name="charge", since=None, limit=5
    )
    assert listing.bind(values) == ("UNKNOWN", "charge", 5)
    assert listing.sql.endswith(("ORDER BY created_at, action_id LIMIT ?", "LIMIT $3"))


def test_a_sync_runner_hands_its_observers_the_same_events() -> None:
    from dataoad import SyncActionRunner

    seen = Recorder()
    runner = SyncActionRunner(InMemoryLedger(), observers=[seen])
    try:
        runner.execute("charge", lambda: "ok", request=REQUEST, idempotency_key="k")
    finally:
        runner.close()
    assert seen.kinds("execute") == [
        EventKind.CALL_STARTED,
        EventKind.CLAIMED,
        EventKind.ATTEMPT_STARTED,
        EventKind.COMPLETED,
        EventKind.CALL_FINISHED,
    ]


async def test_a_recovered_claim_carries_a_typed_recovery_record() -> None:
    from suite_support import stranded

    ledger = InMemoryLedger()
    stuck = await stranded(ledger)
    result = await ActionRunner(ledger).recover_pending(stuck.action_id, lambda r: confirmed())
    recovery = result.receipt.recovery
    assert recovery is not None
    assert recovery.method == "recover_pending"
    assert recovery.attempts == 1
    assert result.receipt.metadata["recovery"] == recovery.to_json()
    [observation] = result.receipt.observations
    assert observation.source is ObservationSource.RECOVER


def test_every_field_of_a_stored_observation_reads_back() -> None:
    from datetime import UTC, datetime

    from dataoad import VerificationHealth

    observation = VerificationObservation(
        source=ObservationSource.RECOVER,
        attempt=2,
        status=ActionStatus.UNKNOWN,
        observed_at=datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC),
        claimed=ActionStatus.FAILED,
        health=VerificationHealth.DEGRADED,
        conclusive_absence=False,
        retry_safe=True,
        verified_provider_reference="ref-9",
        provider_request_id="pr_9",
        reason="index lagging",
        details={"region": "eu", "lag_s": 3},
        error="verified_provider_reference 'ref-9' does not match",
        number=7,
    )
    stored = observation.to_json()
    assert dict(stored) == {
        "source": "recover",
        "attempt": 2,
        "status": "UNKNOWN",
        "observed_at": "2026-01-02T03:04:05+00:00",
        "claimed": "FAILED",
        "health": "DEGRADED",
        "conclusive_absence": False,
        "retry_safe": True,
        "verified_provider_reference": "ref-9",
        "provider_request_id": "pr_9",
        "reason": "index lagging",
        "details": {"region": "eu", "lag_s": 3},
        "error": "verified_provider_reference 'ref-9' does not match",
        "number": 7,
    }
    back = VerificationObservation.from_json(stored)
    assert back == observation
    assert back.answered
    assert back.source.covers_the_action
    assert not ObservationSource.EXECUTE.covers_the_action
    with pytest.raises(ValueError, match="not a stored verification observation"):
        VerificationObservation.from_json({"source": "execute"})


async def test_operator_verbs_tell_observers_their_name_and_action_id() -> None:
    from suite_support import stranded, unstarted

    seen = Recorder()
    ledger = InMemoryLedger()
    runner = ActionRunner(ledger, observers=[seen])
    stuck = await stranded(ledger)
    await runner.recover_pending(stuck.action_id, lambda r: confirmed())
    claim = await unstarted(ledger, key="other")
    await runner.release_unstarted(claim.action_id)
    started = [e for e in seen.events if e.kind is EventKind.CALL_STARTED]
    assert [(e.verb, e.action_id) for e in started] == [
        ("recover_pending", stuck.action_id),
        ("release_unstarted", claim.action_id),
    ]


async def test_a_recovery_merged_into_a_claim_its_worker_completed_adds_no_recovery_note() -> None:
    from suite_support import stranded

    ledger = InMemoryLedger()
    stuck = await stranded(ledger)

    async def verifier(receipt: Any) -> Any:
        # The worker was alive after all: it records its outcome meanwhile.
        current = await ledger.get(receipt.action_id)
        assert current is not None
        done = current.evolve(
            claim_state=ClaimState.COMPLETED,
            final_status=ActionStatus.UNKNOWN,
            execution_status=ActionStatus.UNKNOWN,
            version=current.version + 1,
        )
        assert await ledger.record(done)
        return confirmed()

    result = await ActionRunner(ledger).recover_pending(stuck.action_id, verifier)
    assert result.status is ActionStatus.CONFIRMED
    assert result.receipt.recovery is None


async def test_a_recovered_stranded_claim_says_its_unfinished_attempt_is_unknown() -> None:
    from suite_support import stranded

    ledger = InMemoryLedger()
    stuck = await stranded(ledger)
    assert stuck.execution_status is None
    result = await ActionRunner(ledger).recover_pending(stuck.action_id, lambda r: confirmed())
    assert result.receipt.execution_status is ActionStatus.UNKNOWN
    assert result.receipt.final_status is ActionStatus.CONFIRMED


async def test_an_unproven_merge_carries_what_a_read_back_found() -> None:
    from dataoad import NothingInvokedError
    from dataoad._proven import ProvenLedger
    from suite_support import unknown

    inner = InMemoryLedger()
    done = await unknown(inner)
    current = done.receipt
    newer = current.evolve(version=current.version + 1, error="someone else wrote")
    faulty = FaultyLedger(inner)

    async def record(receipt: Any) -> bool:
        raise ConnectionError("acknowledgement lost")

    async def get(action_id: str) -> Any:
        return newer

    faulty.record = record  # type: ignore[method-assign]
    faulty.get = get  # type: ignore[method-assign]
    proposed = current.evolve(version=current.version + 1)
    with pytest.raises(NothingInvokedError) as info:
        await ProvenLedger(faulty, "").merge(proposed, current)
    assert info.value.receipt == newer
    assert "acknowledgement lost" in str(info.value)


def test_an_observation_holds_its_own_frozen_copy_of_the_details() -> None:
    from datetime import UTC, datetime

    given = {"region": "eu", "zones": ["a"]}
    observation = VerificationObservation(
        ObservationSource.EXECUTE,
        1,
        ActionStatus.CONFIRMED,
        datetime(2026, 1, 2, tzinfo=UTC),
        claimed=ActionStatus.CONFIRMED,
        details=given,
    )
    given["region"] = "us"
    assert observation.details is not None
    assert observation.details["region"] == "eu"
    with pytest.raises(TypeError):
        observation.details["region"] = "us"  # type: ignore[index]


def test_the_observation_count_of_observations_stored_before_numbering() -> None:
    """Receipts written before observations were numbered count them by position."""
    from datetime import UTC, datetime

    from dataoad._observing import protocol_metadata

    legacy = [
        VerificationObservation(
            ObservationSource.EXECUTE, 1, ActionStatus.UNKNOWN, datetime(2026, 1, 1, tzinfo=UTC)
        )
    ] * 2
    assert protocol_metadata({}, legacy, None)["verification_observation_count"] == 2
    numbered = [dataclasses.replace(legacy[0], number=5)]
    assert protocol_metadata({}, numbered, None)["verification_observation_count"] == 5
