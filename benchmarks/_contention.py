"""Contention: concurrent tasks and processes on distinct keys and on one hot key.

Run as a module, it is one contending process (``python -m
benchmarks._contention SPEC MODE COUNT INDEX``) that prints a JSON summary;
the parent starts several and aggregates.
"""

from __future__ import annotations

import asyncio
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from dataoad import ActionInProgressError, ActionRunner, PostgresLedger, SQLiteLedger

ROOT = Path(__file__).resolve().parents[1]


def open_ledger(spec: str) -> Any:
    """``postgresql://...#table`` or a SQLite file path."""
    if spec.startswith("postgresql://"):
        dsn, table = spec.rsplit("#", 1)
        return PostgresLedger(dsn, table=table, min_size=1, max_size=8)
    return SQLiteLedger(spec)


class Counter:
    """The operation: counts its invocations (the hot key must have exactly one)."""

    def __init__(self) -> None:
        self.calls = 0

    async def __call__(self) -> None:
        self.calls += 1


async def contend(ledger: Any, tasks: int, per_task: int, mode: str, prefix: str) -> dict[str, Any]:
    """``tasks`` concurrent callers, ``per_task`` executes each; latency and outcome counts."""
    runner = ActionRunner(ledger)
    operation = Counter()
    latencies: list[float] = []
    in_progress = replayed = 0

    async def caller(t: int) -> None:
        nonlocal in_progress, replayed
        for n in range(per_task):
            key = f"{prefix}hot" if mode == "hot" else f"{prefix}t{t}-{n}"
            began = time.perf_counter()
            try:
                result = await runner.execute(
                    "charge", operation, request={"n": 1}, idempotency_key=key
                )
                replayed += result.replayed
            except ActionInProgressError:
                in_progress += 1
            latencies.append(time.perf_counter() - began)

    began = time.perf_counter()
    await asyncio.gather(*(caller(t) for t in range(tasks)))
    elapsed = time.perf_counter() - began
    latencies.sort()
    return {
        "calls": len(latencies),
        "seconds": elapsed,
        "per_second": len(latencies) / elapsed,
        "p99_ms": latencies[min(len(latencies) - 1, int(len(latencies) * 0.99))] * 1e3,
        "median_ms": statistics.median(latencies) * 1e3,
        "invocations": operation.calls,
        "in_progress": in_progress,
        "replayed": replayed,
    }


def processes(spec: str, count: int, per_process: int, mode: str) -> dict[str, Any]:
    """``count`` OS processes, each one task; aggregate and slowest-process share."""
    children = [
        subprocess.Popen(
            [sys.executable, "-m", "benchmarks._contention", spec, mode, str(per_process), str(i)],
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for i in range(count)
    ]
    summaries = []
    for child in children:
        out, err = child.communicate(timeout=900)
        if child.returncode != 0:
            raise RuntimeError(f"contending process failed: {err[-500:]}")
        summaries.append(json.loads(out))
    wall = max(s["seconds"] for s in summaries)
    total = sum(s["calls"] for s in summaries)
    rates = [s["per_second"] for s in summaries]
    return {
        "processes": count,
        "per_second": total / wall,
        "slowest_share": min(rates) / (sum(rates) / len(rates)),
        "p99_ms": max(s["p99_ms"] for s in summaries),
        "invocations": sum(s["invocations"] for s in summaries),
    }


def main(argv: list[str]) -> None:
    spec, mode, per_process, index = argv[0], argv[1], int(argv[2]), int(argv[3])

    async def run() -> dict[str, Any]:
        async with open_ledger(spec) as ledger:
            prefix = "" if mode == "hot" else f"p{index}-"
            return await contend(ledger, 1, per_process, mode, prefix)

    print(json.dumps(asyncio.run(run())))


if __name__ == "__main__":
    main(sys.argv[1:])
