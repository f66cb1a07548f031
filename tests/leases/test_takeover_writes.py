"""The takeover write itself: its faults, its event, who may attempt it, the default owner.

A takeover is one conditional write proven like every other: a lost
acknowledgement is read back, a failed write leaves the claim where it was
(the caller meets a claim in progress), and a read-back that shows a later
fence than the proposed one cannot be explained and is raised.
"""

from __future__ import annotations

import logging
import os
import re
import socket
import time
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import pytest

from dataoad import (
    ActionInProgressError,
    ActionRunner,
    ActionStatus,
    DefinitiveFailure,
    EventKind,
    InMemoryLedger,
    InvalidArgumentError,
    NothingInvokedError,
    RetryPolicy,
)
from dataoad.testing import FaultyLedger, LedgerFault, ManualClock
from suite_support import CountingOperation, Recorder
from suite_support.leases import LEASE, REQUEST, counting, crash_after_start


async def expired_claim() -> tuple[InMemoryLedger, FaultyLedger, str]:
    """A's claim, attempt 1 started, whose lease ran out; and a faulty view of the ledger."""
    clock = ManualClock()
    inner = InMemoryLedger(clock=clock)
    await crash_after_start(ActionRunner(inner, owner="A"))
    clock.advance(LEASE)
    stored = await inner.find("charge", "k")
    assert stored is not None
    return inner, FaultyLedger(inner), stored.action_id


async def take(ledger: object, **runner: object) -> object:
    return await ActionRunner(ledger, owner="B", **runner).execute(  # type: ignore[arg-type]
        "charge", counting(), request=REQUEST, idempotency_key="k"
    )


async def test_a_takeover_whose_acknowledgement_is_lost_is_read_back_and_kept() -> None:
    inner, faulty, action_id = await expired_claim()
    faulty.inject("take_over", LedgerFault.LOSE_ACKNOWLEDGEMENT)
    result = await take(faulty)
    assert result.taken_over  # type: ignore[attr-defined]
    assert result.status is ActionStatus.UNKNOWN  # type: ignore[attr-defined]
    stored = await inner.get(action_id)
    assert stored is not None
    assert (stored.owner, stored.fencing_token) == ("B", 2)


async def test_a_takeover_that_failed_before_writing_leaves_the_claim_in_progress() -> None:
    inner, faulty, action_id = await expired_claim()
    before = await inner.get(action_id)
    faulty.inject("take_over", LedgerFault.FAIL_BEFORE_WRITE)
    with pytest.raises(ActionInProgressError):
        await take(faulty)
    assert await inner.get(action_id) == before


async def test_a_takeover_read_back_showing_a_later_fence_is_raised_not_guessed() -> None:
    inner, faulty, action_id = await expired_claim()

    def two_more_owners(method: str) -> None:
        if method == "take_over":
            # Between this runner's read and its write, the claim changed
            # owner twice: the failed write's read-back shows fence 3.
            current = inner._by_id[action_id]
            inner._by_id[action_id] = current.evolve(
                owner="C", fencing_token=3, version=current.version + 2
            )

    faulty.on_call = two_more_owners
    faulty.inject("take_over", LedgerFault.FAIL_BEFORE_WRITE)
    with pytest.raises(NothingInvokedError) as info:
        await take(faulty)
    error = info.value
    assert error.operation_invoked is False
    assert error.receipt is not None
    assert (error.receipt.owner, error.receipt.fencing_token) == ("C", 3)
    assert str(error) == (
        f"taking over action {action_id} could not be proven (LedgerFaultError: injected: "
        "take_over failed before write); nothing was invoked"
    )


async def test_a_takeover_is_announced_with_the_new_holder_and_the_old() -> None:
    inner, ledger, action_id = await expired_claim()
    before = await inner.get(action_id)
    assert before is not None
    seen = Recorder()
    await take(ledger, observers=[seen])
    (event,) = seen.of(EventKind.TAKEN_OVER)
    assert event.level == logging.WARNING
    assert event.receipt is not None
    assert (event.receipt.action_id, event.receipt.owner) == (action_id, "B")
    assert event.receipt.fencing_token == 2
    assert event.fields["previous_owner"] == "A"
    assert event.fields["attempts"] == 1
    assert event.receipt.updated_at > before.updated_at  # a takeover is a new version, stamped


async def test_an_unleased_claim_is_never_offered_to_the_ledger_for_takeover() -> None:
    inner = InMemoryLedger()
    await crash_after_start(ActionRunner(inner, owner="A", lease=None))
    faulty = FaultyLedger(inner)
    with pytest.raises(ActionInProgressError):
        await take(faulty)
    assert "take_over" not in faulty.calls


async def test_a_runner_without_leases_never_takes_over() -> None:
    inner, faulty, action_id = await expired_claim()
    with pytest.raises(ActionInProgressError):
        await take(faulty, lease=None)
    assert "take_over" not in faulty.calls
    stored = await inner.get(action_id)
    assert stored is not None
    assert stored.owner == "A"


@pytest.mark.parametrize(
    ("hostname", "host"), [("h" * 100, "h" * 64), ("", "host"), ("web-1", "web-1")]
)
def test_the_default_owner_is_host_pid_and_a_random_suffix(
    hostname: str, host: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(socket, "gethostname", lambda: hostname)
    owners = {ActionRunner(InMemoryLedger()).owner for _ in range(3)}
    assert len(owners) == 3  # every runner its own
    for owner in owners:
        assert re.fullmatch(rf"{re.escape(host)}:{os.getpid()}:[0-9a-f]{{8}}", owner), owner


class LedgerBeforeLeases:
    """A v0.1 ledger: its claim and start_attempt take no lease argument at all."""

    def __init__(self) -> None:
        self.inner = InMemoryLedger()

    async def claim(self, receipt: Any) -> Any:
        return await self.inner.claim(receipt)

    async def start_attempt(self, receipt: Any) -> bool:
        return await self.inner.start_attempt(receipt)

    def __getattr__(self, name: str) -> Any:
        if name in ("take_over", "renew"):
            raise AttributeError(name)
        return getattr(self.inner, name)


async def test_a_runner_without_leases_runs_on_a_ledger_from_before_leases() -> None:
    ledger = LedgerBeforeLeases()
    op = counting("ch_1")
    result = await ActionRunner(ledger, lease=None).execute(  # type: ignore[arg-type]
        "charge", op, request=REQUEST, idempotency_key="k"
    )
    assert result.status is ActionStatus.CONFIRMED
    assert result.taken_over is False  # a plain first call took nothing over
    assert op.calls == [1]
    stored = await ledger.inner.find("charge", "k")
    assert stored is not None
    assert stored.lease_expires_at is None


async def test_a_runner_without_leases_retries_on_a_ledger_from_before_leases() -> None:
    """A retry's attempt start passes no lease to a ledger whose start_attempt takes none."""
    ledger = LedgerBeforeLeases()
    op = CountingOperation(DefinitiveFailure("busy", retryable=True), "ch_2")

    result = await ActionRunner(
        ledger,  # type: ignore[arg-type]
        lease=None,
        policy=RetryPolicy(max_attempts=2, retry_on_failed=True),
    ).execute("charge", op, request=REQUEST, idempotency_key="k")
    assert result.status is ActionStatus.CONFIRMED
    assert result.receipt.attempts == 2
    stored = await ledger.inner.find("charge", "k")
    assert stored == result.receipt
    assert stored is not None
    assert stored.lease_expires_at is None


@pytest.mark.skipif(not hasattr(time, "tzset"), reason="time.tzset is POSIX-only")
def test_sqlite_lease_times_are_stored_in_utc_whatever_the_hosts_zone(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Stored lease times compare as text, so every host must write them in one zone."""
    from dataoad.ledgers._sqlite_file import clock_text

    moment = datetime(2026, 6, 1, 12, 0, tzinfo=UTC)
    monkeypatch.setenv("TZ", "Asia/Kolkata")
    time.tzset()
    try:
        assert clock_text(moment) == "2026-06-01T12:00:00.000000+00:00"
        shifted = moment.astimezone(timezone(timedelta(hours=-7)))
        assert clock_text(shifted) == "2026-06-01T12:00:00.000000+00:00"
    finally:
        monkeypatch.undo()
        time.tzset()


def test_the_longest_lease_is_a_day_and_the_refusals_say_what_to_do() -> None:
    assert ActionRunner(InMemoryLedger(), lease=86_400).lease == 86_400.0
    assert ActionRunner(InMemoryLedger(), lease=0.001).lease == 0.001
    with pytest.raises(InvalidArgumentError) as info:
        ActionRunner(LedgerBeforeLeases())  # type: ignore[arg-type]
    assert str(info.value) == (
        "ledger LedgerBeforeLeases keeps no leases (no take_over and renew); "
        "pass lease=None to run without them"
    )
    with pytest.raises(InvalidArgumentError) as info:
        ActionRunner(InMemoryLedger(), owner="")
    assert str(info.value) == "owner must not be empty"


def test_a_ledger_clock_that_cannot_be_called_is_refused_by_name() -> None:
    with pytest.raises(InvalidArgumentError) as info:
        InMemoryLedger(clock=5)  # type: ignore[arg-type]
    assert str(info.value) == "clock must be a callable returning an aware datetime, not int"
