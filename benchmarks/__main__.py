"""``python -m benchmarks``: per-action overhead of ``execute`` against its floors.

Every figure is measured in this process and this run, next to the floor it
is compared with, because these machines are shared and noisy: only ratios
within one run mean anything. ``--quick`` runs for about a minute in total;
``--json FILE`` also writes the results.

Floors: the bare awaited no-op; the same three conditional transitions
(claim, attempt start, completion) done directly (a dict and a lock for
memory, plain sqlite3 with the same journal and durability settings for
SQLite), plus the request hash Dataoad computes.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import sqlite3
import statistics
import tempfile
import threading
import time
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import rfc8785

from dataoad import ActionRunner, InMemoryLedger, SQLiteLedger

REQUEST = {"customer_id": "customer_123", "amount_cents": 2_500, "currency": "EUR"}


async def noop() -> None:
    return None


def summarise(samples: list[float]) -> dict[str, float]:
    ordered = sorted(samples)
    p99 = ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))]
    median = statistics.median(ordered)
    return {"median_us": median * 1e6, "p99_us": p99 * 1e6, "per_second": 1 / median}


async def measure(step: Callable[[int], Awaitable[Any]], count: int) -> dict[str, float]:
    samples = []
    for n in range(count):
        started = time.perf_counter()
        await step(n)
        samples.append(time.perf_counter() - started)
    return summarise(samples)


# -- floors ------------------------------------------------------------------------------


def memory_floor() -> Callable[[int], Awaitable[None]]:
    lock = threading.Lock()
    rows: dict[tuple[str, str], dict[str, Any]] = {}

    async def step(n: int) -> None:
        hashlib.sha256(rfc8785.dumps(REQUEST)).hexdigest()
        key = ("charge", f"k{n}")
        with lock:  # claim
            if key in rows:
                return
            rows[key] = {"version": 1, "attempts": 0}
        with lock:  # attempt start
            row = rows[key]
            if row["version"] == 1:
                row.update(version=2, attempts=1)
        await noop()
        with lock:  # completion
            row = rows[key]
            if row["version"] == 2:
                row.update(version=3, state="COMPLETED")

    return step


def sqlite_floor(path: Path, synchronous: str) -> Callable[[int], Awaitable[None]]:
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute(f"PRAGMA synchronous={synchronous}")
    conn.execute(
        "CREATE TABLE r (id TEXT PRIMARY KEY, name TEXT, key TEXT, version INT, attempts INT,"
        " state TEXT, body TEXT, UNIQUE (name, key))"
    )

    async def step(n: int) -> None:
        action_id = uuid.uuid4().hex
        body = json.dumps({"request_hash": hashlib.sha256(rfc8785.dumps(REQUEST)).hexdigest()})
        conn.execute(
            "INSERT INTO r VALUES (?, 'charge', ?, 1, 0, 'PENDING', ?) ON CONFLICT DO NOTHING",
            (action_id, f"k{n}", body),
        )
        conn.execute(
            "UPDATE r SET version = 2, attempts = 1 WHERE id = ? AND version = 1", (action_id,)
        )
        await noop()
        conn.execute(
            "UPDATE r SET version = 3, state = 'COMPLETED' WHERE id = ? AND version = 2",
            (action_id,),
        )

    return step


# -- Dataoad ------------------------------------------------------------------------------


def dataoad_step(runner: ActionRunner) -> Callable[[int], Awaitable[Any]]:
    async def step(n: int) -> Any:
        return await runner.execute("charge", noop, request=REQUEST, idempotency_key=f"k{n}")

    return step


async def run(count: int) -> dict[str, Any]:
    results: dict[str, Any] = {}
    results["bare awaited no-op"] = await measure(lambda n: noop(), count)
    results["memory floor"] = await measure(memory_floor(), count)
    results["InMemoryLedger execute"] = await measure(
        dataoad_step(ActionRunner(InMemoryLedger())), count
    )
    with tempfile.TemporaryDirectory() as folder:
        for sync in ("FULL", "NORMAL"):
            floor = sqlite_floor(Path(folder) / f"floor-{sync}.db", sync)
            results[f"sqlite3 floor ({sync})"] = await measure(floor, count)
            async with SQLiteLedger(
                Path(folder) / f"ledger-{sync}.sqlite3", synchronous=sync
            ) as ledger:  # type: ignore[arg-type]
                results[f"SQLiteLedger execute ({sync})"] = await measure(
                    dataoad_step(ActionRunner(ledger)), count
                )
    results["PostgresLedger"] = "skipped: PostgresLedger is not implemented yet (issue 7)"
    ratios = {
        "InMemoryLedger / memory floor (goal <= 2.0)": results["InMemoryLedger execute"][
            "median_us"
        ]
        / results["memory floor"]["median_us"],
    }
    for sync, goal in (("FULL", 0.8), ("NORMAL", 0.7)):
        ratios[f"SQLiteLedger {sync} throughput / sqlite3 floor (goal >= {goal})"] = (
            results[f"SQLiteLedger execute ({sync})"]["per_second"]
            / results[f"sqlite3 floor ({sync})"]["per_second"]
        )
    return {"results": results, "ratios": ratios, "count": count}


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks", description=__doc__)
    parser.add_argument("--quick", action="store_true", help="fewer iterations (about a minute)")
    parser.add_argument("--json", metavar="FILE", help="also write the results as JSON")
    args = parser.parse_args()
    count = 300 if args.quick else 3000
    report = asyncio.run(run(count))
    print(f"{count} actions per measurement\n")
    for name, figures in report["results"].items():
        if isinstance(figures, str):
            print(f"{name:<34} {figures}")
        else:
            print(
                f"{name:<34} median {figures['median_us']:9.1f} us  p99 {figures['p99_us']:9.1f} us"
                f"  {figures['per_second']:10.0f}/s"
            )
    print()
    for name, ratio in report["ratios"].items():
        print(f"{name:<62} {ratio:6.2f}")
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
