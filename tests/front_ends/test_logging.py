"""The dataoad logger: one structured record per transition, and no secrets in it."""

from __future__ import annotations

import logging

import pytest

from dataoad import (
    ActionRunner,
    InMemoryLedger,
    NothingInvokedError,
)
from dataoad.testing import FaultyLedger, LedgerFault
from suite_support import (
    REF,
    REQUEST,
    CountingOperation,
    confirmed,
    events,
    execute,
    fixed_verifier,
    stranded,
    unstarted,
)

LOSE = LedgerFault.LOSE_ACKNOWLEDGEMENT


async def test_one_record_per_transition_without_request_or_values(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="dataoad")

    runner = ActionRunner(InMemoryLedger())
    op = CountingOperation(TimeoutError("lost"), "SECRET-VALUE")
    request = {"card": "SECRET-REQUEST"}
    first = await runner.execute(
        "charge", op, request=request, idempotency_key="k", provider_reference=REF
    )
    await runner.execute("charge", op, request=request, idempotency_key="k", provider_reference=REF)
    await runner.reconcile(first.receipt.action_id, fixed_verifier(confirmed(value="SECRET-VALUE")))
    events = [r.dataoad["event"] for r in caplog.records if hasattr(r, "dataoad")]
    assert events == ["claimed", "attempt_started", "completed", "replayed", "reconciled"]
    completed = next(r for r in caplog.records if r.dataoad["event"] == "completed")  # type: ignore[attr-defined]
    assert completed.dataoad["final_status"] == "UNKNOWN"  # type: ignore[attr-defined]
    assert completed.dataoad["attempt"] == 1  # type: ignore[attr-defined]
    assert completed.dataoad["action_name"] == "charge"  # type: ignore[attr-defined]
    text = "\n".join(r.getMessage() + repr(getattr(r, "dataoad", "")) for r in caplog.records)
    assert "SECRET" not in text


async def test_conflicts_are_warnings_whichever_field_differs(
    caplog: pytest.LogCaptureFixture,
) -> None:
    from dataoad import IdempotencyConflictError

    runner = ActionRunner(InMemoryLedger())
    await execute(runner)
    with pytest.raises(IdempotencyConflictError):
        await runner.execute("charge", CountingOperation(), request=REQUEST, idempotency_key="k")
    assert events(caplog)[-1][:2] == ("conflict", logging.WARNING)


async def test_each_event_is_logged_by_its_own_level(caplog: pytest.LogCaptureFixture) -> None:
    # The logger wants warnings only: the conflict's WARNING is logged, the
    # INFO transitions around it are not (the level asked is the event's).
    from dataoad import IdempotencyConflictError

    caplog.set_level(logging.WARNING, logger="dataoad")
    runner = ActionRunner(InMemoryLedger())
    await execute(runner)
    with pytest.raises(IdempotencyConflictError):
        await runner.execute("charge", CountingOperation(), request=REQUEST, idempotency_key="k")
    logged = [(r.dataoad["event"], r.levelno) for r in caplog.records if hasattr(r, "dataoad")]
    assert logged == [("conflict", logging.WARNING)]


async def test_duplicates_are_told_what_they_met(caplog: pytest.LogCaptureFixture) -> None:
    from dataoad import ActionInProgressError, IdempotencyConflictError

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
    tail = events(caplog)[-2:]
    assert [(e, lvl) for e, lvl, _ in tail] == [
        ("in_progress", logging.INFO),
        ("conflict", logging.WARNING),
    ]


async def test_every_transition_record_names_its_action(caplog: pytest.LogCaptureFixture) -> None:
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
    with pytest.raises(NothingInvokedError):  # gone, but not provably by this release
        await ActionRunner(faulty).release_unstarted(claim.action_id)
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


async def test_duplicates_leave_records_naming_the_claim_they_met(
    caplog: pytest.LogCaptureFixture,
) -> None:
    from dataoad import ActionInProgressError, IdempotencyConflictError

    ledger = InMemoryLedger()
    stuck = await stranded(ledger)
    runner = ActionRunner(ledger)
    with pytest.raises(ActionInProgressError):
        await execute(runner)
    with pytest.raises(IdempotencyConflictError):
        await runner.execute("charge", CountingOperation(), request={}, idempotency_key="k")
    for event, _, fields in events(caplog)[-2:]:
        assert fields["action_id"] == stuck.action_id, event
