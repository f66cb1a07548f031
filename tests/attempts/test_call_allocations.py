"""What one call builds: tasks, receipts and attempt records, counted (never timed).

A first call's cost in memory is mostly what it builds (#40). These tests
hold the counts: no task unless an attempt outlasts a third of its lease
(then exactly the renewal task), one receipt built by the runner per durable
write (a replay: only the claim its lookup proposes), and two attempt records per attempt (started,
finished). Receipts a ledger builds to stamp what it stored (``stored_at``,
the lease) are counted apart: they are the ledger's, one per write.
"""

from __future__ import annotations

import asyncio
import sys
from collections import Counter
from collections.abc import Callable, Coroutine, Iterator
from contextlib import contextmanager
from typing import Any

import pytest

import dataoad._receipt as receipt_module
from dataoad import ActionRunner, DefinitiveFailure, InMemoryLedger, Ledger, RetryPolicy
from dataoad._leases import RENEWAL_TASK_NAME
from dataoad._receipt import ActionReceipt, AttemptRecord
from dataoad.testing import FaultyLedger
from suite_support import REQUEST, closing

WRITES = ("claim", "start_attempt", "record", "release", "take_over", "retire")


async def noop() -> str:
    return "ok"


@contextmanager
def tasks_created(loop: asyncio.AbstractEventLoop) -> Iterator[list[asyncio.Task[Any]]]:
    """Every task created on ``loop`` inside the block, by anyone."""
    created: list[asyncio.Task[Any]] = []

    def factory(
        loop: asyncio.AbstractEventLoop, coro: Coroutine[Any, Any, Any], **kwargs: Any
    ) -> asyncio.Task[Any]:
        task = asyncio.Task(coro, loop=loop, **kwargs)
        created.append(task)
        return task

    previous = loop.get_task_factory()
    loop.set_task_factory(factory)  # type: ignore[arg-type]
    try:
        yield created
    finally:
        loop.set_task_factory(previous)


def _builder() -> str:
    """Who built the receipt being built: the first caller outside ``_receipt`` and this file.

    Walks up rather than counting frames: a mutation run's trampolines add some.
    """
    frame = sys._getframe(1)
    while frame.f_globals.get("__name__") in (__name__, receipt_module.__name__):
        assert frame.f_back is not None
        frame = frame.f_back
    module = str(frame.f_globals.get("__name__", ""))
    return "ledger" if module.startswith("dataoad.ledgers") else "runner"


@pytest.fixture
def built(monkeypatch: pytest.MonkeyPatch) -> Counter[str]:
    """Receipts and attempt records built, by who built them (runner or ledger)."""
    counts: Counter[str] = Counter()
    copy_with = receipt_module._copy_with
    assembled = receipt_module._assembled
    receipt_init = ActionReceipt.__post_init__
    record_init = AttemptRecord.__init__

    def copying(receipt: ActionReceipt, changes: dict[str, Any]) -> ActionReceipt:
        counts[f"receipt by {_builder()}"] += 1
        return copy_with(receipt, changes)

    def assembling(fields: dict[str, Any]) -> ActionReceipt:
        counts[f"receipt by {_builder()}"] += 1
        return assembled(fields)

    def constructing(receipt: ActionReceipt) -> None:
        counts[f"receipt by {_builder()}"] += 1
        receipt_init(receipt)

    def recording(record: AttemptRecord, *args: Any, **kwargs: Any) -> None:
        counts["attempt record"] += 1
        record_init(record, *args, **kwargs)

    monkeypatch.setattr(receipt_module, "_copy_with", copying)
    monkeypatch.setattr(receipt_module, "_assembled", assembling)
    monkeypatch.setattr(ActionReceipt, "__post_init__", constructing)
    monkeypatch.setattr(AttemptRecord, "__init__", recording)
    return counts


def writes(counted: FaultyLedger) -> int:
    return sum(1 for call in counted.calls if call in WRITES)


async def test_a_first_call_and_its_replay_start_no_task_on_every_backend(
    new_ledger: Callable[[], Ledger],
) -> None:
    # The default lease (30 s) on the system clock: a quick attempt needs no
    # renewal, so the runner starts no task (a timer would start one).
    ledger = new_ledger()
    runner = ActionRunner(ledger)
    try:
        await runner.execute("warm", noop, request=REQUEST, idempotency_key="w")
        with tasks_created(asyncio.get_running_loop()) as created:
            first = await runner.execute("a", noop, request=REQUEST, idempotency_key="k")
            replay = await runner.execute("a", noop, request=REQUEST, idempotency_key="k")
    finally:
        await closing(ledger)
    assert first.value == "ok"
    assert replay.replayed
    assert [task.get_name() for task in created] == []


async def test_an_attempt_past_a_third_of_its_lease_gets_exactly_one_renewal_task() -> None:
    # The other side: the renewal timer fires at lease / 3 (0.2 s) and starts
    # one task; the attempt ends (0.35 s) before that task's next renewal.
    runner = ActionRunner(InMemoryLedger(), lease=0.6)

    async def slow() -> str:
        await asyncio.sleep(0.35)
        return "ok"

    with tasks_created(asyncio.get_running_loop()) as created:
        done = await runner.execute("a", slow, request=REQUEST, idempotency_key="k")
    assert done.value == "ok"
    assert [task.get_name().split(":")[0] for task in created] == [RENEWAL_TASK_NAME]
    assert created[0].done()  # stopped with the attempt, never left running


async def test_an_attempt_shorter_than_a_third_of_its_lease_gets_no_task() -> None:
    # A third of the lease is 2 s: a loop woken late from the 50 ms sleep
    # must not reach the renewal timer first.
    runner = ActionRunner(InMemoryLedger(), lease=6.0)

    async def quick() -> str:
        await asyncio.sleep(0.05)
        return "ok"

    with tasks_created(asyncio.get_running_loop()) as created:
        await runner.execute("a", quick, request=REQUEST, idempotency_key="k")
    assert created == []


async def test_a_first_call_builds_one_receipt_per_durable_write(built: Counter[str]) -> None:
    counted = FaultyLedger(InMemoryLedger())  # injects nothing: it records the calls
    runner = ActionRunner(counted)
    built.clear()
    counted.calls.clear()
    await runner.execute("a", noop, request=REQUEST, idempotency_key="k")
    assert writes(counted) == 2
    assert built["receipt by runner"] == 2
    # The memory ledger stamps what it stored (stored_at, the lease) on a copy.
    assert built["receipt by ledger"] == 2
    # One attempt: its started record (in the claim) and its finished one.
    assert built["attempt record"] == 2


async def test_a_replay_builds_only_the_claim_its_lookup_sends(built: Counter[str]) -> None:
    # The claim is the key's lookup too (one ledger call, no find first), so
    # a replay builds the claim it proposes, and nothing after the answer.
    counted = FaultyLedger(InMemoryLedger())
    runner = ActionRunner(counted)
    await runner.execute("a", noop, request=REQUEST, idempotency_key="k")
    built.clear()
    counted.calls.clear()
    replay = await runner.execute("a", noop, request=REQUEST, idempotency_key="k")
    assert replay.replayed
    assert counted.calls == ["claim"]  # the claim found the key held: it wrote nothing
    assert built == Counter({"receipt by runner": 1, "attempt record": 1})


async def test_each_retry_builds_one_receipt_for_its_one_write(built: Counter[str]) -> None:
    calls = 0

    async def declines_twice() -> str:
        nonlocal calls
        calls += 1
        if calls <= 2:
            raise DefinitiveFailure("rejected before processing", retryable=True)
        return "ok"

    counted = FaultyLedger(InMemoryLedger())
    runner = ActionRunner(counted, policy=RetryPolicy(max_attempts=3, retry_on_failed=True))
    built.clear()
    counted.calls.clear()
    done = await runner.execute("a", declines_twice, request=REQUEST, idempotency_key="k")
    assert done.value == "ok"
    assert done.receipt.attempts == 3
    assert writes(counted) == 4  # claim, two attempt starts, the completion
    assert built["receipt by runner"] == writes(counted)
    assert built["attempt record"] == 2 * 3
