"""Exact ledger operation counts per execute: what the benchmarks' README promises.

A first attempt makes 3 durable writes (claim, attempt start, completion)
and 1 read; each retry adds 1 write (its attempt start, which also records
how the previous attempt ended: within the goal of 2); a replay makes 1 read
and 0 writes.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from typing import Any

from dataoad import ActionRunner, DefinitiveFailure, InMemoryLedger, RetryPolicy
from tests.support import REQUEST

WRITES = ("claim", "start_attempt", "record", "release")
READS = ("get", "find")


class CountingLedger(InMemoryLedger):
    """Counts every ledger call by method name."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: Counter[str] = Counter()

    def __getattribute__(self, name: str) -> Any:
        attribute = super().__getattribute__(name)
        if name in WRITES + READS:
            calls = super().__getattribute__("calls")

            async def counted(*args: Any, **kwargs: Any) -> Any:
                calls[name] += 1
                return await attribute(*args, **kwargs)

            return counted
        return attribute

    def writes(self) -> int:
        return sum(self.calls[m] for m in WRITES)

    def reads(self) -> int:
        return sum(self.calls[m] for m in READS)


async def noop() -> str:
    return "ok"


def test_first_attempt_is_three_writes_and_one_read() -> None:
    ledger = CountingLedger()
    asyncio.run(ActionRunner(ledger).execute("a", noop, request=REQUEST, idempotency_key="k"))
    assert ledger.calls == Counter(find=1, claim=1, start_attempt=1, record=1)
    assert (ledger.writes(), ledger.reads()) == (3, 1)


def test_each_retry_adds_one_write() -> None:
    ledger = CountingLedger()
    calls = 0

    async def flaky() -> str:
        nonlocal calls
        calls += 1
        if calls < 3:
            raise DefinitiveFailure("rejected before processing", retryable=True)
        return "ok"

    policy = RetryPolicy(max_attempts=3, retry_on_failed=True)
    asyncio.run(
        ActionRunner(ledger).execute(
            "a", flaky, request=REQUEST, idempotency_key="k", policy=policy
        )
    )
    assert calls == 3
    assert ledger.calls["start_attempt"] == 3
    assert ledger.writes() == 3 + 2 * 1
    assert ledger.reads() == 1


def test_replay_is_one_read_and_no_write() -> None:
    ledger = CountingLedger()
    runner = ActionRunner(ledger)
    asyncio.run(runner.execute("a", noop, request=REQUEST, idempotency_key="k"))
    ledger.calls.clear()
    result = asyncio.run(runner.execute("a", noop, request=REQUEST, idempotency_key="k"))
    assert result.replayed
    assert ledger.calls == Counter(find=1)
