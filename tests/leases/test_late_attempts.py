"""An attempt that begins late in its lease: renewed first, or never invoked.

Between the write that counts an attempt and the call of its operation the
runner may stall (an observer that blocks the loop, a paused process). If
the lease ran out meanwhile, another worker may have taken the claim over
and, on retry-safe evidence, run the operation itself: invoking then would
run it twice for one claim. So an attempt that begins a third of its lease
or more after its counting write was *sent* (by the runner's clock) renews
under its fencing token first, and runs only if that renewal was kept.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import threading
import time
import types
from pathlib import Path
from typing import Any

import pytest

from dataoad import (
    ActionRunner,
    ActionStatus,
    ClaimFencedError,
    ClaimState,
    DefinitiveFailure,
    EventKind,
    InMemoryLedger,
    NothingInvokedError,
    OutcomeNotRecordedError,
    RetryPolicy,
    SQLiteLedger,
    VerificationResult,
)
from dataoad._clock import SystemClock
from dataoad._leases import RENEWALS_PER_LEASE
from dataoad.testing import FaultyLedger, LedgerFault, ManualClock
from suite_support.leases import REQUEST

LEASE = 30.0
INTERVAL = LEASE / RENEWALS_PER_LEASE
RETRY_FAILED = RetryPolicy(max_attempts=3, retry_on_failed=True)


class RunnerClock:
    """The runner's monotonic clock, moved only by the test (a stall moves it)."""

    def __init__(self) -> None:
        self.now = 100.0

    def monotonic(self) -> float:
        return self.now

    async def sleep(self, seconds: float) -> None:
        await asyncio.Event().wait()  # renewal tasks stay parked: the test renews


class StallAt:
    """An observer that blocks the loop on the ``nth`` ATTEMPT_STARTED and runs ``during``."""

    def __init__(self, during: Any, nth: int = 1) -> None:
        self.during = during
        self.nth = nth
        self.seen = 0

    def on_event(self, event: Any) -> None:
        if event.kind is EventKind.ATTEMPT_STARTED:
            self.seen += 1
            if self.seen == self.nth:
                self.during()


def in_another_thread(work: Any) -> Any:
    """Run the coroutine ``work()`` to its end on a loop of its own (another worker)."""
    outcome: list[Any] = []

    def run() -> None:
        try:
            outcome.append(asyncio.run(work()))
        except BaseException as exc:  # the test's thread re-raises it
            outcome.append(exc)

    thread = threading.Thread(target=run)
    thread.start()
    thread.join()
    if isinstance(outcome[0], BaseException):
        raise outcome[0]
    return outcome[0]


def stalls_past_the_lease(ledger_clock: ManualClock, a_clock: RunnerClock, b_call: Any) -> Any:
    """A stall of A past its lease, during which B (another worker) runs ``b_call()`` to its end."""
    results: list[Any] = []

    def stall() -> None:
        ledger_clock.advance(LEASE + 1)
        a_clock.now += LEASE + 1
        results.append(in_another_thread(b_call))

    stall.results = results  # type: ignore[attr-defined]
    return stall


def b_takes_over_and_charges(
    ledger: Any, ledger_clock: ManualClock, a_clock: RunnerClock, charges: list[str]
) -> Any:
    """A's stall past its lease, during which B takes the claim over, reads retry-safe absence and charges."""
    b = ActionRunner(ledger, owner="B", lease=LEASE, policy=RETRY_FAILED)
    return stalls_past_the_lease(ledger_clock, a_clock, lambda: b_charges(b, charges))


def b_charges(b: ActionRunner, charges: list[str]) -> Any:
    """B's call for the key: it takes the claim over, reads retry-safe absence, charges."""
    return b.execute(
        "charge",
        charge_as("B", charges),
        request=REQUEST,
        idempotency_key="k",
        provider_reference="ref-k",
        verifier=provider_reads(charges),
    )


def provider_reads(charges: list[str]) -> Any:
    """A verifier of the provider: confirmed once anyone charged, else retry-safe absence."""

    def verify(receipt: Any) -> VerificationResult:
        if charges:
            return VerificationResult.confirmed(verified_provider_reference="ref-k")
        return VerificationResult.absent(verified_provider_reference="ref-k", retry_safe=True)

    return verify


def charge_as(name: str, charges: list[str], *, fails_first: bool = False) -> Any:
    async def charge() -> str:
        charges.append(name)
        if fails_first and len(charges) == 1:
            raise DefinitiveFailure("declined", retryable=True)
        return f"ch_{name}"

    return charge


async def test_a_stall_past_the_lease_during_which_another_worker_charged_invokes_nothing() -> None:
    # The reproduced double charge: A counts attempt 1, its loop stalls past
    # the lease; B takes over, reads retry-safe absence, charges. A must not.
    ledger_clock = ManualClock()
    ledger = InMemoryLedger(clock=ledger_clock)
    a_clock = RunnerClock()
    charges: list[str] = []

    stall = b_takes_over_and_charges(ledger, ledger_clock, a_clock, charges)

    heard: list[Any] = []

    class Hears:
        def on_event(self, event: Any) -> None:
            heard.append(event)

    a = ActionRunner(
        ledger, owner="A", lease=LEASE, clock=a_clock, observers=[StallAt(stall), Hears()]
    )
    with pytest.raises(ClaimFencedError) as raised:
        await a.execute(
            "charge",
            charge_as("A", charges),
            request=REQUEST,
            idempotency_key="k",
            provider_reference="ref-k",
        )
    # The refused renewal is told as any fenced holder's is: at WARNING, with A's claim.
    fenced = [e for e in heard if e.kind is EventKind.FENCED]
    assert len(fenced) == 1
    assert fenced[0].level == logging.WARNING
    assert fenced[0].receipt is not None
    assert fenced[0].receipt.owner == "A"
    assert (
        "began a third of its lease or more after the write that counted it (the event loop or "
        "process stalled: a blocking observer, a pause), and its lease renewal was refused"
    ) in str(raised.value)
    assert stall.results[0].taken_over
    assert stall.results[0].status is ActionStatus.CONFIRMED
    assert charges == ["B"]
    assert raised.value.operation_invoked is False
    assert "NOT invoked" in str(raised.value)
    # The error shows the claim as it is now, not as A last wrote it.
    assert "settled CONFIRMED by 'B'" in str(raised.value)
    assert raised.value.receipt is not None
    assert raised.value.receipt.owner == "B"
    assert raised.value.receipt.final_status is ActionStatus.CONFIRMED
    stored = await ledger.find("charge", "k")
    assert stored is not None
    assert stored.owner == "B"
    assert stored.final_status is ActionStatus.CONFIRMED


@pytest.mark.parametrize(
    ("stalled", "renewals"),
    [(0.0, 0), (INTERVAL - 0.001, 0), (INTERVAL, 1), (LEASE + 1, 1)],
    ids=["no stall", "just under a third", "a third", "past the lease, nobody took over"],
)
async def test_an_attempt_renews_first_exactly_when_it_begins_a_third_of_its_lease_late(
    stalled: float, renewals: int
) -> None:
    ledger_clock = ManualClock()
    ledger = FaultyLedger(InMemoryLedger(clock=ledger_clock))
    a_clock = RunnerClock()
    charges: list[str] = []

    def stall() -> None:
        ledger_clock.advance(stalled)
        a_clock.now += stalled

    a = ActionRunner(ledger, owner="A", lease=LEASE, clock=a_clock, observers=[StallAt(stall)])
    result = await a.execute(
        "charge", charge_as("A", charges), request=REQUEST, idempotency_key="k"
    )
    assert result.status is ActionStatus.CONFIRMED
    assert charges == ["A"]
    assert ledger.calls.count("renew") == renewals


@pytest.mark.parametrize("fault", list(LedgerFault))
async def test_a_late_attempt_whose_renewal_cannot_be_proven_is_not_invoked(
    fault: LedgerFault,
) -> None:
    ledger_clock = ManualClock()
    ledger = FaultyLedger(InMemoryLedger(clock=ledger_clock))
    ledger.inject("renew", fault, times=RENEWALS_PER_LEASE)
    a_clock = RunnerClock()
    charges: list[str] = []

    def stall() -> None:
        a_clock.now += INTERVAL

    a = ActionRunner(ledger, owner="A", lease=LEASE, clock=a_clock, observers=[StallAt(stall)])
    with pytest.raises(NothingInvokedError) as raised:
        await a.execute("charge", charge_as("A", charges), request=REQUEST, idempotency_key="k")
    assert charges == []
    assert raised.value.operation_invoked is False
    assert raised.value.receipt is not None  # the claim as A last wrote it: attempt 1 counted
    assert raised.value.receipt.attempts == 1
    assert (
        "and its lease could not be renewed in time. It was NOT invoked; the claim stays "
        "PENDING with this attempt counted, to be settled read-only by a takeover or "
        "recover_pending"
    ) in str(raised.value)
    # Left as a stranded started claim: settled read-only later, never re-run blindly.
    stored = await ledger.inner.find("charge", "k")
    assert stored is not None
    assert stored.is_pending
    assert stored.attempts == 1


async def test_a_renewal_that_is_itself_slow_is_tried_again_then_given_up() -> None:
    # A renewal answered a third of a lease after it was sent proves too
    # little time: the runner tries again, and gives up after as many tries
    # as a lease has renewals.
    ledger = FaultyLedger(InMemoryLedger())
    a_clock = RunnerClock()
    ledger.on_call = lambda method: setattr(
        a_clock, "now", a_clock.now + (INTERVAL if method == "renew" else 0.0)
    )
    charges: list[str] = []

    def stall() -> None:
        a_clock.now += INTERVAL

    a = ActionRunner(ledger, owner="A", lease=LEASE, clock=a_clock, observers=[StallAt(stall)])
    with pytest.raises(NothingInvokedError):
        await a.execute("charge", charge_as("A", charges), request=REQUEST, idempotency_key="k")
    assert charges == []
    assert ledger.calls.count("renew") == RENEWALS_PER_LEASE


async def test_a_retry_that_begins_after_its_lease_passed_on_is_not_invoked_and_says_attempt_1_ran() -> (
    None
):
    ledger_clock = ManualClock()
    ledger = InMemoryLedger(clock=ledger_clock)
    a_clock = RunnerClock()
    charges: list[str] = []

    b = ActionRunner(ledger, owner="B", lease=LEASE)
    stall = stalls_past_the_lease(
        ledger_clock,
        a_clock,
        lambda: b.execute("charge", charge_as("B", charges), request=REQUEST, idempotency_key="k"),
    )

    a = ActionRunner(
        ledger,
        owner="A",
        lease=LEASE,
        clock=a_clock,
        policy=RETRY_FAILED,
        observers=[StallAt(stall, nth=2)],
    )
    with pytest.raises(OutcomeNotRecordedError) as raised:
        await a.execute(
            "charge",
            charge_as("A", charges, fails_first=True),
            request=REQUEST,
            idempotency_key="k",
        )
    # B took attempt 2 over, counted and not run: without a verifier, UNKNOWN.
    assert stall.results[0].taken_over
    assert stall.results[0].status is ActionStatus.UNKNOWN
    assert charges == ["A"]  # attempt 1 only; attempt 2 never ran, nor did B
    assert raised.value.operation_invoked is True
    assert raised.value.observed_status is ActionStatus.FAILED
    assert isinstance(raised.value.__cause__, ClaimFencedError)
    assert "1 earlier attempt(s)" in str(raised.value)
    assert "attempt 2 of action " in str(raised.value)
    assert (
        "could not be started (it began too late in its lease and could not prove it held "
        "the claim), so it was not invoked" in str(raised.value)
    )


async def test_a_blocking_observer_on_a_real_clock_cannot_let_two_workers_charge(
    tmp_path: Path,
) -> None:
    # The defect as reported, on the system clock and a SQLite file: A's
    # observer blocks its loop over 1.2 s with a 1 s lease; B takes the claim
    # over meanwhile from another thread and charges on retry-safe absence.
    # (Each worker must prove its lease within a third of it: 0.4 s leases
    # left a loaded machine's SQLite commit too little time.)
    path = tmp_path / "ledger.sqlite3"
    charges: list[str] = []
    lease = 1.0

    async def b_takes_over() -> Any:
        await asyncio.sleep(lease + 0.2)
        async with SQLiteLedger(path) as ledger:
            b = ActionRunner(ledger, owner="B", lease=30.0, policy=RETRY_FAILED)
            return await b_charges(b, charges)

    b_result: list[Any] = []

    def stall() -> None:
        b_result.append(in_another_thread(b_takes_over))  # blocks A's loop until B is done

    async with SQLiteLedger(path) as ledger:
        a = ActionRunner(ledger, owner="A", lease=lease, observers=[StallAt(stall)])
        with pytest.raises(ClaimFencedError) as raised:
            await a.execute(
                "charge",
                charge_as("A", charges),
                request=REQUEST,
                idempotency_key="k",
                provider_reference="ref-k",
            )
    assert b_result
    assert b_result[0].taken_over
    assert charges == ["B"]
    assert raised.value.operation_invoked is False


async def test_a_claim_taken_over_but_still_pending_is_named_with_its_new_owner() -> None:
    ledger_clock = ManualClock()
    ledger = InMemoryLedger(clock=ledger_clock)
    a_clock = RunnerClock()

    async def never_called() -> None:
        raise AssertionError("invoked after its claim passed to B")

    async def b_takes_over() -> None:
        # B's takeover write alone (its settling would complete the claim).
        stored = await ledger.find("charge", "k")
        assert stored is not None
        taken = stored.evolve(
            owner="B", fencing_token=stored.fencing_token + 1, version=stored.version + 1
        )
        assert await ledger.take_over(taken, lease=LEASE)

    def stall() -> None:
        ledger_clock.advance(LEASE + 1)
        a_clock.now += LEASE + 1
        in_another_thread(b_takes_over)

    a = ActionRunner(ledger, owner="A", lease=LEASE, clock=a_clock, observers=[StallAt(stall)])
    with pytest.raises(ClaimFencedError) as raised:
        await a.execute("charge", never_called, request=REQUEST, idempotency_key="k")
    assert "passed to 'B' (fencing token 2)" in str(raised.value)
    assert raised.value.receipt is not None
    assert raised.value.receipt.owner == "B"
    assert raised.value.operation_invoked is False


class LazyCharge:
    """An awaitable whose request starts only when awaited (as ``session.post(...)`` does)."""

    def __init__(self, charge: Any) -> None:
        self.charge = charge

    def __await__(self) -> Any:
        return self.charge().__await__()


@types.coroutine
def generator_charge(charge: Any) -> Any:
    return (yield from charge().__await__())


class ClosesBadly(LazyCharge):
    """One whose ``close`` raises: closing what is never awaited must not fail the call."""

    def close(self) -> None:
        raise RuntimeError("close failed")


RETURNED_LATE = {
    "a coroutine": lambda charge: charge(),
    "an object whose __await__ starts the call": LazyCharge,
    "a generator-based coroutine": generator_charge,
    "an awaitable whose close raises": ClosesBadly,
}


@pytest.mark.parametrize("kind", sorted(RETURNED_LATE))
async def test_what_a_sync_operation_returns_after_a_stall_past_the_lease_is_never_awaited(
    kind: str,
) -> None:
    # ``lambda: client.charge(...)``: the lambda runs on a worker thread and
    # the charge starts only when what it returns is awaited on the loop.
    # Here the lease runs out and B charges while the lambda runs.
    ledger_clock = ManualClock()
    ledger = InMemoryLedger(clock=ledger_clock)
    a_clock = RunnerClock()
    charges: list[str] = []
    b_charges = b_takes_over_and_charges(ledger, ledger_clock, a_clock, charges)
    returned: list[Any] = []

    def lambda_charge() -> Any:
        b_charges()
        returned.append(RETURNED_LATE[kind](charge_as("A", charges)))
        return returned[0]

    fenced: list[Any] = []

    class Hears:
        def on_event(self, event: Any) -> None:
            if event.kind is EventKind.FENCED:
                fenced.append(event)

    a = ActionRunner(ledger, owner="A", lease=LEASE, clock=a_clock, observers=[Hears()])
    with pytest.raises(ClaimFencedError) as raised:
        await a.execute(
            "charge",
            lambda_charge,
            request=REQUEST,
            idempotency_key="k",
            provider_reference="ref-k",
        )
    assert charges == ["B"]
    # The refused renewal says so, then the refused outcome write.
    assert len(fenced) == 2
    if inspect.iscoroutine(returned[0]):
        assert inspect.getcoroutinestate(returned[0]) == inspect.CORO_CLOSED
    # Its sync part ran: this call did invoke the operation, and says so.
    assert raised.value.operation_invoked is True
    assert raised.value.observed_status is ActionStatus.UNKNOWN
    stored = await ledger.find("charge", "k")
    assert stored is not None
    assert stored.owner == "B"
    assert stored.final_status is ActionStatus.CONFIRMED


@pytest.mark.parametrize(("stalled", "renewals"), [(INTERVAL - 0.001, 0), (INTERVAL, 1)])
async def test_a_coroutine_a_sync_operation_returns_late_is_awaited_once_the_lease_is_renewed(
    stalled: float, renewals: int
) -> None:
    ledger = FaultyLedger(InMemoryLedger())
    a_clock = RunnerClock()
    charges: list[str] = []

    def lambda_charge() -> Any:
        a_clock.now += stalled
        return charge_as("A", charges)()

    a = ActionRunner(ledger, owner="A", lease=LEASE, clock=a_clock)
    result = await a.execute("charge", lambda_charge, request=REQUEST, idempotency_key="k")
    assert result.status is ActionStatus.CONFIRMED
    assert charges == ["A"]
    assert ledger.calls.count("renew") == renewals


def test_the_default_clock_counts_time_the_host_spent_suspended(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # CLOCK_MONOTONIC stops while a host is suspended; the ledger's wall clock
    # does not. The default clock reads the one that counts the suspend.
    from dataoad import _clock

    if _clock._SUSPEND_AWARE is None:
        assert SystemClock().monotonic() == pytest.approx(time.monotonic(), abs=1.0)
        return
    asked: list[int] = []
    real = time.clock_gettime

    def clock_gettime(which: int) -> float:
        asked.append(which)
        return real(which) + 3600.0  # an hour suspended

    monkeypatch.setattr(time, "clock_gettime", clock_gettime)
    assert SystemClock().monotonic() >= time.monotonic() + 3599.0
    assert asked == [time.CLOCK_BOOTTIME]


async def test_a_caller_cancelled_while_a_late_call_renews_closes_what_it_returned() -> None:
    renewing = asyncio.Event()

    class SlowRenewals(InMemoryLedger):
        async def renew(self, action_id: str, fencing_token: int, lease: float) -> bool:
            renewing.set()
            await asyncio.Event().wait()  # until cancelled
            raise AssertionError("unreachable")

    a_clock = RunnerClock()
    charges: list[str] = []
    returned: list[Any] = []

    def lambda_charge() -> Any:
        a_clock.now += INTERVAL
        returned.append(charge_as("A", charges)())
        return returned[0]

    a = ActionRunner(SlowRenewals(), owner="A", lease=LEASE, clock=a_clock)
    call = asyncio.create_task(
        a.execute("charge", lambda_charge, request=REQUEST, idempotency_key="k")
    )
    await renewing.wait()
    call.cancel()
    with pytest.raises(asyncio.CancelledError):
        await call
    assert charges == []
    assert inspect.getcoroutinestate(returned[0]) == inspect.CORO_CLOSED


@pytest.mark.parametrize("kind", sorted(RETURNED_LATE))
async def test_what_a_late_sync_operation_returned_unawaited_is_recorded_unknown_and_why(
    kind: str,
) -> None:
    # The renewal cannot be proven (lost every time) and no one took over:
    # the attempt is recorded, UNKNOWN, saying its sync part ran.
    ledger = FaultyLedger(InMemoryLedger())
    ledger.inject("renew", LedgerFault.FAIL_BEFORE_WRITE, times=RENEWALS_PER_LEASE)
    a_clock = RunnerClock()
    charges: list[str] = []

    def lambda_charge() -> Any:
        a_clock.now += INTERVAL
        return RETURNED_LATE[kind](charge_as("A", charges))

    a = ActionRunner(ledger, owner="A", lease=LEASE, clock=a_clock)
    result = await a.execute("charge", lambda_charge, request=REQUEST, idempotency_key="k")
    assert charges == []
    assert result.status is ActionStatus.UNKNOWN
    assert result.receipt.error is not None
    assert (
        "the claim's lease could not be kept while the operation's sync part ran (the event "
        "loop stalled), so what it returned was never awaited; the sync part did run"
    ) in result.receipt.error


@pytest.mark.parametrize(
    ("read", "said"),
    [
        ("fails", "the claim could not be read back"),
        ("finds nothing", "the claim could not be read back"),
        # A ledger of another's making may complete a claim without a status.
        ("finds it completed with no status", "the claim was settled by 'Z'"),
    ],
)
async def test_a_refused_late_renewal_whose_claim_cannot_be_read_back_still_refuses(
    read: str, said: str
) -> None:
    class Refuses(InMemoryLedger):
        async def renew(self, action_id: str, fencing_token: int, lease: float) -> bool:
            return False

        async def get(self, action_id: str) -> Any:
            if read == "fails":
                raise ConnectionError("the read path is down")
            if read == "finds nothing":
                return None
            stored = await super().get(action_id)
            assert stored is not None
            return stored.evolve(claim_state=ClaimState.COMPLETED, owner="Z", version=9)

    a_clock = RunnerClock()
    charges: list[str] = []

    def stall() -> None:
        a_clock.now += INTERVAL

    a = ActionRunner(Refuses(), owner="A", lease=LEASE, clock=a_clock, observers=[StallAt(stall)])
    with pytest.raises(ClaimFencedError) as raised:
        await a.execute("charge", charge_as("A", charges), request=REQUEST, idempotency_key="k")
    assert charges == []
    assert raised.value.operation_invoked is False
    assert f"renewal was refused: {said}. It was NOT invoked" in str(raised.value)
    assert raised.value.receipt is not None
    # The claim as it is now when it could be read, else as A last wrote it.
    assert raised.value.receipt.owner == ("Z" if "completed" in read else "A")


async def test_a_key_freed_by_expiry_times_its_new_attempt_from_the_new_claim() -> None:
    # The first claim meets an expired receipt, which is retired (slowly);
    # the attempt is counted by the second claim, and timed from that one.
    ledger_clock = ManualClock()
    ledger = FaultyLedger(InMemoryLedger(clock=ledger_clock))
    a_clock = RunnerClock()
    charges: list[str] = []
    a = ActionRunner(ledger, owner="A", lease=LEASE, clock=a_clock)
    await a.execute("charge", charge_as("A", charges), request=REQUEST, idempotency_key="k")
    ledger_clock.advance(3600)
    ledger.on_call = lambda method: setattr(
        a_clock, "now", a_clock.now + (INTERVAL if method == "retire" else 0.0)
    )
    again = await a.execute(
        "charge",
        charge_as("A", charges),
        request=REQUEST,
        idempotency_key="k",
        expires_after=60.0,
    )
    assert again.replayed is False
    assert charges == ["A", "A"]
    assert ledger.calls.count("retire") == 1
    assert ledger.calls.count("renew") == 0  # the slow retirement is not the attempt's
