"""Growth: overhead as the ledger grows, and as one action's attempt records grow."""

from __future__ import annotations

import asyncio
import sqlite3
import time
import uuid
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from dataoad import ActionRunner, DefinitiveFailure, RetryPolicy, SQLiteLedger
from dataoad._receipt import ActionReceipt
from dataoad._status import ActionStatus, ClaimState
from dataoad.ledgers._codec import WRITTEN, row_of


def filler(n: int) -> tuple[Any, ...]:
    """A completed receipt row, as the SQLite ledger stores it."""
    return row_of(filler_receipt(n), datetime.isoformat)


def filler_receipt(n: int) -> ActionReceipt:
    """A completed CONFIRMED receipt last changed on 2026-01-01."""
    at = datetime(2026, 1, 1, tzinfo=UTC)
    return ActionReceipt(
        action_id=uuid.uuid4().hex,
        action_name="charge",
        idempotency_key=f"old-{n}",
        request_hash="0" * 64,
        provider_reference=None,
        risk=None,
        claim_state=ClaimState.COMPLETED,
        attempts=0,
        execution_status=ActionStatus.CONFIRMED,
        verification_status=None,
        final_status=ActionStatus.CONFIRMED,
        provider_request_id=None,
        error=None,
        metadata={},
        attempt_records=(),
        version=2,
        created_at=at,
        updated_at=at,
    )


async def sqlite_with(path: Path, rows: int) -> SQLiteLedger:
    """A ledger file holding ``rows`` completed receipts (inserted in bulk)."""
    async with SQLiteLedger(path):
        pass  # creates the schema
    conn = sqlite3.connect(path)
    placeholders = ", ".join("?" for _ in WRITTEN)
    with conn:
        conn.executemany(
            f"INSERT INTO receipts ({', '.join(WRITTEN)}) VALUES ({placeholders})",
            (filler(n) for n in range(rows)),
        )
        # The ledger stamps stored_at (by its clock) on every write; rows
        # that accumulated were stored when they last changed.
        conn.execute("UPDATE receipts SET stored_at = updated_at")
    conn.close()
    return SQLiteLedger(path)


def attempts_step(runner: ActionRunner, attempts: int) -> Callable[[int], Awaitable[Any]]:
    """One execute that fails retryably ``attempts - 1`` times, then succeeds."""
    policy = RetryPolicy(max_attempts=attempts, retry_on_failed=True)

    async def step(n: int) -> Any:
        calls = 0

        async def operation() -> None:
            nonlocal calls
            calls += 1
            if calls < attempts:
                raise DefinitiveFailure("rejected before processing", retryable=True)

        return await runner.execute(
            "charge", operation, request={"n": 1}, idempotency_key=f"a{attempts}-{n}", policy=policy
        )

    return step


async def timed(step: Callable[[int], Awaitable[Any]], count: int) -> float:
    """Median seconds per step."""
    samples = []
    for n in range(count):
        began = time.perf_counter()
        await step(n)
        samples.append(time.perf_counter() - began)
    samples.sort()
    return samples[len(samples) // 2]


async def _noop() -> None:
    return None


def fresh_step(runner: ActionRunner) -> Callable[[int], Awaitable[Any]]:
    async def step(n: int) -> Any:
        return await runner.execute("charge", _noop, request={"n": 1}, idempotency_key=f"new-{n}")

    return step


async def ledger_growth(folder: Path, sizes: list[int], count: int) -> dict[str, float]:
    """Median execute overhead (µs) on a SQLite ledger already holding each size."""
    figures: dict[str, float] = {}
    for size in sizes:
        ledger = await sqlite_with(folder / f"grown-{size}.sqlite3", size)
        async with ledger:
            figures[f"{size:.0e}"] = await timed(fresh_step(ActionRunner(ledger)), count) * 1e6
    return figures


def run(coro: Any) -> Any:
    return asyncio.run(coro)
