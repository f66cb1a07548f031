"""Freeing a key through the proven-write rule: what is announced, proven, refused or raised.

``test_lifecycle.py`` drives expiry and ``reopen`` end to end; these pin the
write underneath both: a freed key is announced once (``RETIRED``), a lost
acknowledgement is proven by reading back, a write that cannot be proven
either way raises ``NothingInvokedError``, and a write that failed after
another writer changed the receipt is decided afresh, not raised.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest

from dataoad import (
    ActionRunner,
    ActionStatus,
    DefinitiveFailure,
    EventKind,
    InMemoryLedger,
    InvalidArgumentError,
    NothingInvokedError,
    RecoveryRefusedError,
)
from dataoad.testing import FaultyLedger, LedgerFault, ManualClock
from suite_support import LEDGER_START, Recorder, UnknownLandsFirst


async def declined() -> str:
    raise DefinitiveFailure("card declined")


async def paid() -> str:
    return "ch_1"


async def a_receipt(ledger: Any, operation: Any) -> tuple[ActionRunner, Recorder, str]:
    """A runner that records its events, and the id of a definitive receipt it wrote."""
    seen = Recorder()
    runner = ActionRunner(ledger, observers=[seen])
    done = await runner.execute("charge", operation, request={}, idempotency_key="k")
    assert done.status in (ActionStatus.CONFIRMED, ActionStatus.FAILED)
    assert done.receipt.version == WRITTEN_AT
    return runner, seen, done.receipt.action_id


#: The version of a receipt the runner completed in one attempt (claim, outcome).
WRITTEN_AT = 2


def retired_events(seen: Recorder) -> list[tuple[str, int, bool]]:
    found: list[tuple[str, int, bool]] = []
    for e in seen.of(EventKind.RETIRED):
        assert e.receipt is not None  # a RETIRED event names the receipt it freed
        found.append((e.fields["reason"], e.receipt.version, e.receipt.retired_at is not None))
    return found


@pytest.mark.parametrize("fault", [None, LedgerFault.LOSE_ACKNOWLEDGEMENT])
async def test_an_expired_key_is_announced_freed_once(fault: LedgerFault | None) -> None:
    inner = InMemoryLedger()
    ledger = FaultyLedger(inner)
    runner, seen, action_id = await a_receipt(ledger, paid)
    if fault is not None:
        ledger.inject("retire", fault)  # committed, acknowledgement lost: proven by reading
    fresh = await runner.execute("charge", paid, request={}, idempotency_key="k", expires_after=0)
    assert not fresh.replayed
    assert retired_events(seen) == [("expired", WRITTEN_AT + 1, True)]
    old = await inner.get(action_id)
    assert old is not None
    assert old.retired_at is not None


@pytest.mark.parametrize("fault", [None, LedgerFault.LOSE_ACKNOWLEDGEMENT])
async def test_a_reopened_key_is_announced_freed_once(fault: LedgerFault | None) -> None:
    inner = InMemoryLedger()
    ledger = FaultyLedger(inner)
    runner, seen, action_id = await a_receipt(ledger, declined)
    if fault is not None:
        ledger.inject("retire", fault)
    await runner.reopen(action_id)
    assert retired_events(seen) == [("reopened", WRITTEN_AT + 1, True)]


async def test_a_retire_that_cannot_be_proven_says_which_action_and_why() -> None:
    ledger = FaultyLedger(InMemoryLedger())
    runner, seen, action_id = await a_receipt(ledger, declined)
    ledger.inject("retire", LedgerFault.FAIL_BEFORE_WRITE)
    with pytest.raises(NothingInvokedError) as info:
        await runner.reopen(action_id)
    message = str(info.value)
    assert message.startswith(f"freeing the key of action {action_id} could not be proven (")
    assert "injected" in message
    assert message.endswith("); nothing was invoked")
    assert info.value.receipt is None
    assert seen.of(EventKind.RETIRED) == []


async def test_a_retire_whose_read_back_fails_too_is_raised_not_taken_for_a_refusal() -> None:
    inner = InMemoryLedger()
    ledger = FaultyLedger(inner)
    runner, _, action_id = await a_receipt(ledger, declined)
    ledger.inject("retire", LedgerFault.FAIL_BEFORE_WRITE)

    def then_reads_fail(method: str) -> None:
        if method == "retire":  # the reopen's own read went through; the read-back fails
            ledger.inject("get", LedgerFault.FAIL_BEFORE_WRITE)

    ledger.on_call = then_reads_fail
    with pytest.raises(NothingInvokedError, match="freeing the key"):
        await runner.reopen(action_id)
    stored = await inner.get(action_id)
    assert stored is not None
    assert stored.retired_at is None


async def test_a_retire_that_fails_after_another_writer_changed_the_receipt_decides_again() -> None:
    # A zombie's UNKNOWN evidence lands, then the retire's connection drops.
    ledger = UnknownLandsFirst(then=ConnectionError("connection reset"))
    runner, _, action_id = await a_receipt(ledger, declined)
    # Not "could not be proven": the read-back shows the change, so reopen
    # decides on what is stored now, an UNKNOWN it must refuse.
    with pytest.raises(RecoveryRefusedError, match="UNKNOWN"):
        await runner.reopen(action_id)


async def test_a_receipt_too_young_to_expire_is_answered_as_read_again() -> None:
    """Refused by the ledger's clock: the receipt read again is the same, so it replays,
    without a second claim."""
    ledger = FaultyLedger(InMemoryLedger())
    seen = Recorder()
    runner = ActionRunner(ledger, observers=[seen], namespace="tenant")
    first = await runner.execute("charge", paid, request={}, idempotency_key="k")
    ledger.calls.clear()
    again = await runner.execute(
        "charge", paid, request={}, idempotency_key="k", expires_after=3600
    )
    assert again.replayed
    assert again.receipt == first.receipt
    assert ledger.calls == ["claim", "retire", "find"]  # read again in its namespace
    assert seen.of(EventKind.RETIRED) == []


async def test_a_receipt_that_cannot_be_read_again_after_a_refused_expiry_is_raised() -> None:
    ledger = FaultyLedger(InMemoryLedger())
    runner = ActionRunner(ledger)
    await runner.execute("charge", paid, request={}, idempotency_key="k")
    ledger.inject("find", LedgerFault.FAIL_BEFORE_WRITE)
    with pytest.raises(NothingInvokedError) as info:
        await runner.execute("charge", paid, request={}, idempotency_key="k", expires_after=3600)
    assert str(info.value).startswith("could not read the ledger for 'charge': ")
    assert "injected" in str(info.value)
    assert str(info.value).endswith("; nothing was invoked")
    assert info.value.operation_invoked is False
    assert info.value.receipt is None


async def test_the_claim_made_after_an_expiry_holds_a_lease_like_any_claim() -> None:
    ledger = InMemoryLedger()
    runner = ActionRunner(ledger, lease=30.0)
    await runner.execute("charge", paid, request={}, idempotency_key="k")
    leases: list[object] = []

    async def looks() -> str:
        (pending,) = await ledger.receipts(pending=True)
        leases.append(pending.lease_expires_at)
        return "ch_2"

    fresh = await runner.execute("charge", looks, request={}, idempotency_key="k", expires_after=0)
    assert not fresh.replayed
    assert len(leases) == 1
    assert leases[0] is not None  # a worker that dies now is taken over, not held forever


async def test_expiry_on_a_ledger_that_cannot_free_keys_is_refused_by_name() -> None:
    class NoRetire(InMemoryLedger):
        retire = None  # type: ignore[assignment]  # a ledger written before v0.2's lifecycle

    ledger = NoRetire()
    with pytest.raises(InvalidArgumentError) as info:
        await ActionRunner(ledger).execute(
            "charge", paid, request={}, idempotency_key="k", expires_after=60
        )
    assert str(info.value) == (
        f"ledger {NoRetire.__qualname__} cannot free keys (no retire), so it cannot expire receipts"
    )
    assert await ledger.receipts() == []


async def test_a_freed_receipt_is_stamped_when_freed_by_the_ledger_s_clock(
    clocked: tuple[Any, ManualClock],
) -> None:
    """Freeing a key stores a new version of its receipt: ``stored_at`` is when, by the ledger."""
    ledger, clock = clocked
    runner = ActionRunner(ledger)
    done = await runner.execute("charge", paid, request={}, idempotency_key="k")
    written = await ledger.get(done.receipt.action_id)
    assert written is not None
    assert written.stored_at == LEDGER_START
    clock.advance(60)
    fresh = await runner.execute("charge", paid, request={}, idempotency_key="k", expires_after=30)
    assert not fresh.replayed
    old = await ledger.get(done.receipt.action_id)
    assert old is not None
    assert old.retired_at is not None
    assert old.stored_at == LEDGER_START + timedelta(seconds=60)
