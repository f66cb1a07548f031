"""Retention: how fast ``prune`` deletes, and how long live writers wait meanwhile.

A ledger is filled with old completed receipts (inserted in bulk, the way
they would have accumulated). Then ``prune`` deletes them in batches while
another client of the same storage keeps running ``execute`` on fresh keys;
each of that writer's calls is timed. The figures: receipts deleted per
second, the writer's median call without a prune running (measured first,
same run) and its longest and 99th-percentile call during the prune.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from typing import Any

from dataoad import ActionRunner, ActionStatus


async def _writer(
    runner: ActionRunner, prefix: str, stop: asyncio.Event, samples: list[float]
) -> None:
    n = 0
    while not stop.is_set():
        began = time.perf_counter()
        await runner.execute("charge", _noop, request={"n": n}, idempotency_key=f"{prefix}-{n}")
        samples.append(time.perf_counter() - began)
        n += 1
        await asyncio.sleep(0)


async def _noop() -> None:
    return None


def _quantile(samples: list[float], q: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def prune_under_load(
    ledger: Any,
    writer_ledger: Any,
    rows: int,
    *,
    batch_size: int = 500,
    warmup_calls: int = 200,
) -> dict[str, float]:
    """Prune ``rows`` old receipts from ``ledger`` while ``writer_ledger`` keeps writing."""
    runner = ActionRunner(writer_ledger)
    idle: list[float] = []
    for n in range(warmup_calls):
        began = time.perf_counter()
        await runner.execute("charge", _noop, request={"n": n}, idempotency_key=f"idle-{n}")
        idle.append(time.perf_counter() - began)
    stop = asyncio.Event()
    during: list[float] = []
    writer = asyncio.create_task(_writer(runner, "busy", stop, during))
    await asyncio.sleep(0.05)  # the writer is running before the prune starts
    began = time.perf_counter()
    deleted = await ledger.prune(
        completed_before=datetime(2026, 6, 1, tzinfo=UTC),
        statuses=(ActionStatus.CONFIRMED, ActionStatus.FAILED),
        batch_size=batch_size,
    )
    seconds = time.perf_counter() - began
    stop.set()
    await writer
    if deleted != rows:
        raise RuntimeError(f"prune deleted {deleted} of {rows} old receipts")
    return {
        "receipts": float(rows),
        "deleted_per_second": deleted / seconds,
        "prune_seconds": seconds,
        "writer_calls_during": float(len(during)),
        "writer_median_idle_ms": _quantile(idle, 0.5) * 1e3,
        "writer_p99_during_ms": _quantile(during, 0.99) * 1e3 if during else float("nan"),
        "writer_max_wait_ms": max(during) * 1e3 if during else float("nan"),
    }


Opener = Callable[[], Awaitable[Any]]
