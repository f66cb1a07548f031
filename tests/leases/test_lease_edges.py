"""Leases at their edges: lost renewals, refused renewals, racing sweeps, busy merges.

The main behaviour is in ``test_leases.py``; these pin what happens when a
renewal, a sweep or a zombie's merge meets a ledger error or a concurrent
writer, each the way the rules in ``dataoad._leases`` promise.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Callable
from datetime import timedelta

import pytest

import dataoad._leases as leases_module
from dataoad import (
    ActionInProgressError,
    ActionRunner,
    ActionStatus,
    ClaimFencedError,
    EventKind,
    InMemoryLedger,
    InvalidArgumentError,
    VerificationResult,
)
from dataoad.testing import FaultyLedger, LedgerFault, ManualClock
from suite_support import Recorder, Unlisted, unstarted
from suite_support.leases import LEASE, REQUEST, counting, crash_after_start, paused_holder


async def test_a_lost_renewal_is_retried_and_the_claim_kept() -> None:
    faulty = FaultyLedger(InMemoryLedger())
    faulty.inject("renew", LedgerFault.FAIL_BEFORE_WRITE, times=2)
    release = asyncio.Event()

    async def long_charge() -> str:
        await release.wait()
        return "ch"

    holder = asyncio.create_task(
        ActionRunner(faulty, owner="A", lease=0.3).execute(
            "charge", long_charge, request=REQUEST, idempotency_key="k"
        )
    )
    await asyncio.sleep(1.0)  # over three leases: two renewals lost, the rest kept it
    assert faulty.calls.count("renew") >= 5
    with pytest.raises(ActionInProgressError):
        await ActionRunner(faulty.inner, owner="B", lease=0.3).execute(
            "charge", counting(), request=REQUEST, idempotency_key="k"
        )
    release.set()
    assert (await holder).status is ActionStatus.CONFIRMED


async def test_a_refused_renewal_stops_renewing_and_says_fenced() -> None:
    clock = ManualClock()
    inner = InMemoryLedger(clock=clock)
    faulty = FaultyLedger(inner)
    seen = Recorder()
    zombie = await paused_holder(ActionRunner(faulty, owner="A", lease=0.3, observers=[seen]))
    clock.advance(1.0)  # the ledger's clock passes A's lease before it renews
    await ActionRunner(inner, owner="B").execute(
        "charge", counting(), request=REQUEST, idempotency_key="k"
    )
    await asyncio.sleep(0.3)  # A's renewal task wakes, is refused and stops
    refused = faulty.calls.count("renew")
    assert refused >= 1
    assert len(seen.of(EventKind.FENCED)) == 1
    await asyncio.sleep(0.3)
    assert faulty.calls.count("renew") == refused  # no renewal after the refusal
    zombie.finish.set()
    with pytest.raises(ClaimFencedError):
        await zombie.task


class _Paced(InMemoryLedger):
    """A ledger that stops a renewal arriving sooner than a third of a lease after the last.

    A renewal loop that forgot to sleep spins on a ledger whose renewal never
    yields, and would hold the event loop for good; this one ends that
    renewal task instead, so the test fails rather than hangs.
    """

    def __init__(self, interval: float) -> None:
        super().__init__()
        self.interval = interval
        self.renewed_at: list[float] = []
        self.too_soon: list[float] = []

    async def renew(self, action_id: str, fencing_token: int, lease: float) -> bool:
        now = asyncio.get_running_loop().time()
        if self.renewed_at and now - self.renewed_at[-1] < self.interval / 2:
            self.too_soon.append(now - self.renewed_at[-1])
            task = asyncio.current_task()
            assert task is not None
            task.cancel()
            await asyncio.sleep(0)
        self.renewed_at.append(now)
        return await super().renew(action_id, fencing_token, lease)


class _OwnSleepClock:
    """A clock of the caller's own (not ``SystemClock``): its attempts renew from a task."""

    def monotonic(self) -> float:
        return asyncio.get_running_loop().time()

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(seconds)


@pytest.mark.parametrize("clock", [None, _OwnSleepClock()], ids=["system clock", "own clock"])
async def test_renewals_wait_a_third_of_the_lease_between_them(clock: object) -> None:
    lease = 0.3
    ledger = _Paced(interval=lease / leases_module.RENEWALS_PER_LEASE)
    runner = ActionRunner(ledger, owner="A", lease=lease, clock=clock)  # type: ignore[arg-type]

    async def long_charge() -> str:
        await asyncio.sleep(0.75)  # over two leases
        return "ch"

    began = asyncio.get_running_loop().time()
    done = await runner.execute("charge", long_charge, request=REQUEST, idempotency_key="k")
    elapsed = asyncio.get_running_loop().time() - began
    assert done.status is ActionStatus.CONFIRMED
    assert ledger.too_soon == []
    # Each a third of a lease after the last, the first a third in: the
    # claim was kept all along, and never renewed more often than that.
    assert 4 <= len(ledger.renewed_at) <= elapsed / ledger.interval, ledger.renewed_at


async def test_a_sweep_skips_a_claim_renewed_after_it_was_listed() -> None:
    clock = ManualClock()
    inner = InMemoryLedger(clock=clock)
    await crash_after_start(ActionRunner(inner, owner="A"), key="k")
    clock.advance(LEASE)
    faulty = FaultyLedger(inner)

    def renewed_in_between(method: str) -> None:
        if method == "take_over":
            # The worker was only slow: its renewal lands between the
            # sweep's listing and its takeover (written directly: this hook is sync).
            (held,) = inner._by_id.values()
            inner._by_id[held.action_id] = dataclasses.replace(
                held, lease_expires_at=clock() + timedelta(seconds=LEASE)
            )

    faulty.on_call = renewed_in_between
    results = await ActionRunner(faulty, owner="S").recover_stale()
    assert results == []
    assert faulty.calls.count("take_over") == 1
    (held,) = await inner.receipts()
    assert held.is_pending
    assert held.owner == "A"  # neither settled nor released: the worker keeps it
    assert held.fencing_token == 1


async def test_a_sweep_that_cannot_settle_one_claim_goes_on_to_the_next() -> None:
    clock = ManualClock()
    inner = InMemoryLedger(clock=clock)
    dead = ActionRunner(inner, owner="A")
    for key in ("a", "b"):
        await crash_after_start(dead, key=key)
    clock.advance(LEASE)
    faulty = FaultyLedger(inner)
    faulty.inject("record", LedgerFault.FAIL_BEFORE_WRITE)  # the first settlement fails
    seen = Recorder()
    results = await ActionRunner(faulty, owner="S", observers=[seen]).recover_stale()
    assert len(results) == 1
    assert results[0].status is ActionStatus.UNKNOWN
    (failed,) = seen.of(EventKind.STALE_CLAIM_NOT_SETTLED)
    assert failed.receipt is not None
    assert failed.receipt.idempotency_key != results[0].receipt.idempotency_key
    assert "injected" in str(failed.fields["reason"])
    pending = await inner.receipts(pending=True)
    assert [r.idempotency_key for r in pending] == [failed.receipt.idempotency_key]
    assert pending[0].owner == "S"  # taken over, left for the next sweep after its lease


async def test_a_sweep_needs_a_ledger_that_lists_receipts() -> None:
    with pytest.raises(InvalidArgumentError, match="cannot list receipts"):
        await ActionRunner(Unlisted(), owner="S").recover_stale()


async def test_a_zombie_merge_that_meets_a_concurrent_write_merges_again() -> None:
    clock = ManualClock()
    inner = InMemoryLedger(clock=clock)
    faulty = FaultyLedger(inner)
    zombie = await paused_holder(ActionRunner(faulty, owner="A"))
    clock.advance(LEASE)
    taken = await ActionRunner(inner, owner="B").execute(
        "charge", counting(), request=REQUEST, idempotency_key="k"
    )
    assert taken.status is ActionStatus.UNKNOWN
    bumped = False

    def concurrent(method: str) -> None:
        nonlocal bumped
        if method == "record" and faulty.calls.count("record") == 2 and not bumped:
            # The zombie's own record was refused (fenced); just before its
            # merge, another writer (a reconcile, say) changes the receipt.
            bumped = True
            current = inner._by_id[taken.receipt.action_id]
            inner._by_id[current.action_id] = current.evolve(version=current.version + 1)

    faulty.on_call = concurrent
    zombie.finish.set()
    with pytest.raises(ClaimFencedError):
        await zombie.task
    assert bumped
    stored = await inner.get(taken.receipt.action_id)
    assert stored is not None
    assert stored.final_status is ActionStatus.CONFIRMED  # merged on the second round
    assert stored.owner == "B"


@pytest.mark.faults_may_remain("five failing writes stand for every later write failing")
async def test_a_zombie_whose_merge_fails_keeps_its_evidence_in_the_error() -> None:
    clock = ManualClock()
    inner = InMemoryLedger(clock=clock)
    faulty = FaultyLedger(inner)
    zombie = await paused_holder(ActionRunner(faulty, owner="A"))
    clock.advance(LEASE)
    taken = await ActionRunner(inner, owner="B").execute(
        "charge", counting(), request=REQUEST, idempotency_key="k"
    )
    failing = False

    def fail_the_merge(method: str) -> None:
        nonlocal failing
        # The zombie's own record is refused (fenced); every write after it,
        # its merge of what it saw, then fails.
        if method == "get" and faulty.calls.count("record") == 1 and not failing:
            failing = True
            faulty.inject("record", LedgerFault.FAIL_BEFORE_WRITE, times=5)

    faulty.on_call = fail_the_merge
    zombie.finish.set()
    with pytest.raises(ClaimFencedError) as info:
        await zombie.task
    assert info.value.operation_invoked is True
    assert info.value.observed_status is ActionStatus.CONFIRMED
    assert failing
    stored = await inner.get(taken.receipt.action_id)
    assert stored is not None
    assert stored == taken.receipt  # nothing written; the evidence is in the error


async def test_a_sweep_reports_itself_as_the_recover_stale_verb() -> None:
    clock = ManualClock()
    ledger = InMemoryLedger(clock=clock)
    await crash_after_start(ActionRunner(ledger, owner="A"))
    clock.advance(LEASE)
    seen = Recorder()
    await ActionRunner(ledger, owner="S", observers=[seen]).recover_stale()
    assert seen.events
    assert {e.verb for e in seen.events} == {"recover_stale"}
    (finished,) = seen.of(EventKind.CALL_FINISHED)
    assert isinstance(finished.result, list)
    assert finished.result[0].status is ActionStatus.UNKNOWN


async def test_a_sweep_looks_at_100_claims_unless_told_and_accepts_1_to_10000() -> None:
    clock = ManualClock()
    ledger = InMemoryLedger(clock=clock)
    dead = ActionRunner(ledger, owner="A")
    for n in range(102):
        await crash_after_start(dead, key=f"k{n}")
    clock.advance(LEASE)
    sweeper = ActionRunner(ledger, owner="S")
    assert len(await sweeper.recover_stale()) == 100
    assert len(await sweeper.recover_stale(limit=1)) == 1
    assert len(await sweeper.recover_stale(limit=10_000)) == 1
    assert await ledger.receipts(pending=True) == []


async def test_a_taker_of_an_unstarted_claim_verifies_its_own_attempt() -> None:
    clock = ManualClock()
    ledger = InMemoryLedger(clock=clock)
    # A claim whose attempt never started, as a v0.1 runner (before the fused claim) left one.
    await unstarted(ledger, request=REQUEST, provider_reference="ref-k", owner="A", lease=LEASE)
    stranded = await ledger.find("charge", "k")
    assert stranded is not None
    assert stranded.attempts == 0
    clock.advance(LEASE)

    async def times_out() -> str:
        raise TimeoutError("no answer")

    taken = await ActionRunner(ledger, owner="B").execute(
        "charge",
        times_out,
        request=REQUEST,
        idempotency_key="k",
        provider_reference="ref-k",
        verifier=lambda r: VerificationResult.confirmed(verified_provider_reference="ref-k"),
    )
    assert taken.taken_over
    assert taken.receipt.action_id == stranded.action_id
    assert taken.receipt.attempt_records[0].execution_status is ActionStatus.UNKNOWN
    assert taken.status is ActionStatus.CONFIRMED  # its verifier's bound evidence


class _SteppedLoop:
    """Enough of an event loop for the shared first-renewal timer: a clock the test moves,
    and the timers armed on it."""

    def __init__(self) -> None:
        self.now = 0.0
        self.armed: list[float] = []

    def time(self) -> float:
        return self.now

    def call_at(self, when: float, callback: Callable[[], None]) -> None:
        self.armed.append(when)
        self.fire = callback


class _Keeper:
    def __init__(self) -> None:
        self.started: list[bool] = []

    def _start(self, wait_first: bool) -> None:
        self.started.append(wait_first)


def test_attempts_share_one_first_renewal_timer_and_each_renews_a_third_of_a_lease_in() -> None:
    """One timer serves every attempt of an interval: it starts the renewals of those due,
    re-arms for the next one waiting, and never starts one whose attempt ended."""
    loop = _SteppedLoop()
    timers = leases_module._FirstRenewals(loop, 0.1)  # type: ignore[arg-type]
    first, ended, later = _Keeper(), _Keeper(), _Keeper()
    timers.add(first)  # type: ignore[arg-type]
    loop.now = 0.05
    timers.add(ended)  # type: ignore[arg-type]
    loop.now = 0.08
    timers.add(later)  # type: ignore[arg-type]
    assert loop.armed == [0.1]  # one timer, for the earliest
    loop.now = 0.09
    timers.discard(ended)  # type: ignore[arg-type]
    loop.now = 0.1
    loop.fire()
    assert (first.started, ended.started, later.started) == ([False], [], [])
    assert loop.armed == [0.1, pytest.approx(0.18)]  # re-armed for the next one waiting
    loop.now = 0.12
    joined = _Keeper()
    timers.add(joined)  # type: ignore[arg-type]
    assert loop.armed == [0.1, pytest.approx(0.18)]  # the armed timer serves it too
    loop.now = 0.18
    loop.fire()
    assert later.started == [False]
    assert joined.started == []
    assert loop.armed == [0.1, pytest.approx(0.18), pytest.approx(0.22)]
    loop.now = 0.22
    loop.fire()
    assert joined.started == [False]
    assert len(loop.armed) == 3  # nothing waits: no timer
    again = _Keeper()
    loop.now = 1.0
    timers.add(again)  # type: ignore[arg-type]
    assert loop.armed[-1] == pytest.approx(1.1)


def test_the_shared_timer_starts_a_renewal_at_most_a_millisecond_early() -> None:
    """asyncio may run a timer a clock tick early; a renewal that early is harmless,
    one started two milliseconds early would be another rule."""
    loop = _SteppedLoop()
    timers = leases_module._FirstRenewals(loop, 0.1)  # type: ignore[arg-type]
    keeper = _Keeper()
    timers.add(keeper)  # type: ignore[arg-type]
    loop.now = 0.098
    loop.fire()
    assert keeper.started == []
    assert loop.armed == [0.1, 0.1]
    loop.now = 0.0995
    loop.fire()
    assert keeper.started == [False]
    # Exactly the allowance early is early enough.
    edge = _Keeper()
    loop.now = 0.0
    timers.add(edge)  # type: ignore[arg-type]
    loop.now = 0.1 - leases_module._EARLY
    assert loop.now + leases_module._EARLY == 0.1
    loop.fire()
    assert edge.started == [False]


async def test_a_loops_attempts_of_one_lease_share_one_timer_and_another_loop_has_its_own() -> None:
    loop = asyncio.get_running_loop()
    shared = leases_module._first_renewals(loop, 0.1)
    assert leases_module._first_renewals(loop, 0.1) is shared
    assert leases_module._first_renewals(loop, 0.2) is not shared
    other = asyncio.new_event_loop()
    try:
        elsewhere = leases_module._first_renewals(other, 0.1)
    finally:
        other.close()
    assert elsewhere is not shared
    assert leases_module._first_renewals(loop, 0.1) is not shared  # this thread moved on


async def test_runners_of_different_leases_on_one_loop_each_keep_their_claims() -> None:
    """The shared timers are per interval: a 0.3 s lease and a 0.6 s lease held side by
    side through more than three of each are both renewed, and neither can be taken."""
    ledger = InMemoryLedger()
    release = asyncio.Event()

    async def long_charge() -> str:
        await release.wait()
        return "ch"

    holders = [
        asyncio.create_task(
            ActionRunner(ledger, owner=f"A{lease}", lease=lease).execute(
                "charge", long_charge, request=REQUEST, idempotency_key=f"k{lease}"
            )
        )
        for lease in (0.3, 0.6)
    ]
    await asyncio.sleep(2.0)
    other = counting()
    for lease in (0.3, 0.6):
        with pytest.raises(ActionInProgressError):
            await ActionRunner(ledger, owner="B", lease=0.3).execute(
                "charge", other, request=REQUEST, idempotency_key=f"k{lease}"
            )
    release.set()
    for holder in holders:
        assert (await holder).status is ActionStatus.CONFIRMED
    assert other.calls == []
