"""``execute(..., wait_in_progress=...)``: a bounded wait for a duplicate's claim holder.

Each rule runs through every front end (the runner, the decorator and the
sync facade), with the claim holder running in the test's own event loop.
"""

from __future__ import annotations

import asyncio
import math
from typing import Any

import pytest

from dataoad import (
    ActionInProgressError,
    ActionRunner,
    ActionStatus,
    IdempotencyConflictError,
    InMemoryLedger,
    InvalidArgumentError,
)
from dataoad.testing import LedgerFault
from suite_support import (
    FRONT_ENDS_AND_OPERATION_KINDS,
    REF,
    REQUEST,
    CountingOperation,
    call_via,
    execute,
    reached,
    stranded,
    unstarted,
)

FAIL = LedgerFault.FAIL_BEFORE_WRITE


@pytest.fixture(params=FRONT_ENDS_AND_OPERATION_KINDS)
def front_end(request: pytest.FixtureRequest) -> str:
    return str(request.param)


class HeldOperation:
    """An operation that runs until released, counting its calls."""

    def __init__(self) -> None:
        self.calls = 0
        self.started = asyncio.Event()
        self.release = asyncio.Event()

    async def __call__(self) -> str:
        self.calls += 1
        self.started.set()
        await self.release.wait()
        return "charged"


async def start_holder() -> tuple[ActionRunner, HeldOperation, asyncio.Task[Any]]:
    """A runner, and a first caller that holds the claim inside its operation."""
    runner = ActionRunner(InMemoryLedger())
    held = HeldOperation()
    holder = asyncio.create_task(
        runner.execute("charge", held, request=REQUEST, idempotency_key="k")
    )
    await reached(held.started, holder)
    return runner, held, holder


async def test_waiter_gets_the_holders_receipt_as_a_replay(front_end: str) -> None:
    runner, held, holder = await start_holder()
    asyncio.get_running_loop().call_later(0.05, held.release.set)
    duplicate = CountingOperation("must not run")
    waited = await call_via(
        front_end,
        runner,
        "charge",
        duplicate,
        request=REQUEST,
        idempotency_key="k",
        wait_in_progress=10,
    )
    first = await holder
    assert duplicate.calls == 0
    assert held.calls == 1
    assert waited.replayed
    assert waited.status is ActionStatus.CONFIRMED
    assert waited.receipt == first.receipt


async def test_waiter_gives_up_with_in_progress_error_when_time_runs_out(front_end: str) -> None:
    runner, held, holder = await start_holder()
    duplicate = CountingOperation("must not run")
    loop = asyncio.get_running_loop()
    began = loop.time()
    with pytest.raises(ActionInProgressError) as info:
        await call_via(
            front_end,
            runner,
            "charge",
            duplicate,
            request=REQUEST,
            idempotency_key="k",
            wait_in_progress=0.2,
        )
    assert loop.time() - began >= 0.2
    assert info.value.receipt is not None
    assert info.value.receipt.is_pending
    assert duplicate.calls == 0
    held.release.set()
    assert (await holder).status is ActionStatus.CONFIRMED


class ClaimPausedLedger(InMemoryLedger):
    """A ledger whose first new claim, once stored, waits until the test lets it through.

    The claim counts attempt 1 itself (the fused claim), so this is the
    holder's window after its claim is durable and before its operation runs.
    """

    def __init__(self) -> None:
        super().__init__()
        self.claimed = asyncio.Event()
        self.proceed = asyncio.Event()

    async def claim(self, receipt: Any, **lease: Any) -> Any:
        stored, created = await super().claim(receipt, **lease)
        if created and not self.claimed.is_set():  # only the holder's: a waiter claims nothing
            self.claimed.set()
            await self.proceed.wait()
        return stored, created


async def test_a_waiter_never_takes_a_claim_whose_attempt_has_not_started(front_end: str) -> None:
    """The README: waiting never takes the holder's claim, even before its operation runs."""

    ledger = ClaimPausedLedger()
    runner = ActionRunner(ledger)
    held = CountingOperation("charged")
    holder = asyncio.create_task(
        runner.execute("charge", held, request=REQUEST, idempotency_key="k")
    )
    await reached(ledger.claimed, holder)
    [claim] = ledger.snapshot()
    assert held.calls == 0
    duplicate = CountingOperation("must not run")
    with pytest.raises(ActionInProgressError):
        await call_via(
            front_end,
            runner,
            "charge",
            duplicate,
            request=REQUEST,
            idempotency_key="k",
            wait_in_progress=0.1,
        )
    # The holder's claim is still the holder's: same id, untouched.
    assert ledger.snapshot() == [claim]
    ledger.proceed.set()
    first = await holder
    assert first.status is ActionStatus.CONFIRMED
    assert first.receipt.action_id == claim.action_id
    assert (held.calls, duplicate.calls) == (1, 0)
    # A claim whose attempt really never started is now only a v0.1
    # runner's: a waiter does not take that one either while its lease lives.
    legacy = await unstarted(ledger, "legacy", owner="v0.1-worker", lease=60.0)
    with pytest.raises(ActionInProgressError):
        await call_via(
            front_end,
            runner,
            "charge",
            duplicate,
            request=REQUEST,
            idempotency_key="legacy",
            provider_reference=REF,
            wait_in_progress=0.1,
        )
    assert await ledger.find("charge", "legacy") == legacy
    assert duplicate.calls == 0


async def test_zero_wait_looks_once() -> None:
    runner, held, holder = await start_holder()
    with pytest.raises(ActionInProgressError):
        await runner.execute(
            "charge", held, request=REQUEST, idempotency_key="k", wait_in_progress=0
        )
    held.release.set()
    await holder
    assert held.calls == 1


async def test_a_conflict_is_raised_at_once_not_waited_on(front_end: str) -> None:
    runner, held, holder = await start_holder()
    loop = asyncio.get_running_loop()
    began = loop.time()
    with pytest.raises(IdempotencyConflictError):
        await call_via(
            front_end,
            runner,
            "charge",
            CountingOperation(),
            request={**REQUEST, "amount_cents": 1},
            idempotency_key="k",
            wait_in_progress=30,
        )
    assert loop.time() - began < 5
    held.release.set()
    await holder


async def test_a_claim_released_unstarted_while_waiting_is_claimed_afresh(front_end: str) -> None:
    inner = InMemoryLedger()
    # The runner no longer leaves a claim with no attempt started (attempt 1
    # is counted with the claim): only a v0.1 runner's can be released unstarted.
    stranded = await unstarted(inner, provider_reference=None)
    runner = ActionRunner(inner)
    asyncio.get_running_loop().call_later(
        0.05, lambda: asyncio.ensure_future(runner.release_unstarted(stranded.action_id))
    )
    waiter = CountingOperation("charged")
    result = await call_via(
        front_end,
        runner,
        "charge",
        waiter,
        request=REQUEST,
        idempotency_key="k",
        wait_in_progress=10,
    )
    # The released claim never invoked anything; the waiter's own claim did, once.
    assert waiter.calls == 1
    assert not result.replayed
    assert result.receipt.action_id != stranded.action_id


class RecordingLedger(InMemoryLedger):
    """Counts every ledger call, to prove bad arguments touch nothing."""

    def __init__(self) -> None:
        super().__init__()
        self.calls = 0

    async def find(self, *args: Any) -> Any:
        self.calls += 1
        return await super().find(*args)

    async def claim(self, *args: Any, **lease: Any) -> Any:
        self.calls += 1
        return await super().claim(*args, **lease)


@pytest.mark.parametrize("bad", [-1, -0.001, math.nan, math.inf, True, "1", 3601, [1], 1e300])
async def test_bad_wait_is_refused_before_any_ledger_access(bad: Any) -> None:
    ledger = RecordingLedger()
    op = CountingOperation()
    with pytest.raises(InvalidArgumentError, match="wait_in_progress"):
        await ActionRunner(ledger).execute(
            "charge", op, request=REQUEST, idempotency_key="k", wait_in_progress=bad
        )
    assert ledger.calls == 0
    assert op.calls == 0


def test_a_clock_without_the_clock_protocol_is_refused_before_anything_runs() -> None:
    from dataoad import InvalidArgumentError

    class NoSleep:
        def monotonic(self) -> float:
            return 0.0

    with pytest.raises(
        InvalidArgumentError,
        match=r"^clock must have monotonic\(\) and an async sleep\(seconds\), not .*NoSleep$",
    ):
        ActionRunner(InMemoryLedger(), clock=NoSleep())  # type: ignore[arg-type]


async def test_wait_in_progress_accepts_its_documented_maximum() -> None:
    from dataoad._arguments import MAX_WAIT_IN_PROGRESS

    result = await execute(ActionRunner(InMemoryLedger()), wait_in_progress=MAX_WAIT_IN_PROGRESS)
    assert result.status is ActionStatus.CONFIRMED
    with pytest.raises(InvalidArgumentError):
        await execute(ActionRunner(InMemoryLedger()), wait_in_progress=MAX_WAIT_IN_PROGRESS + 1)


async def test_waiting_backs_off_by_doubling_and_stops_at_the_deadline() -> None:
    from dataoad import ActionInProgressError
    from dataoad._waiting import WAIT_FIRST_DELAY, WAIT_MAX_DELAY

    # The README's numbers: back off from 5 ms to 250 ms between looks.
    assert (WAIT_FIRST_DELAY, WAIT_MAX_DELAY) == (0.005, 0.25)

    ledger = InMemoryLedger()
    await stranded(ledger)  # the claim of "k" stays PENDING
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
    assert sleeps == pytest.approx([WAIT_FIRST_DELAY, 2 * WAIT_FIRST_DELAY, 4 * WAIT_FIRST_DELAY])
    assert now[0] == pytest.approx(total)
    # The delay never grows past the cap.
    sleeps.clear()
    now[0] = 0.0
    with pytest.raises(ActionInProgressError):
        await execute(runner, wait_in_progress=3.0)
    assert max(sleeps) == WAIT_MAX_DELAY
    # Never past the deadline: 3 s is no sum of the back-off's delays, so the last
    # sleep is cut to what remains (a full one would wait 3.065 s).
    assert now[0] == pytest.approx(3.0)
    assert sleeps[-1] < WAIT_MAX_DELAY
