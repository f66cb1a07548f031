"""``python -m benchmarks``: what ``execute`` costs, against its floors and its peers.

Every figure is measured in this process and this run, next to the floor it
is compared with, because these machines are shared and noisy: only ratios
within one run mean anything. ``--quick`` runs for a few minutes in total;
``--json FILE`` also writes the results; ``--peers`` (the ``bench`` extra)
adds the libraries users would pick instead, interleaved with Dataoad in
the same rounds (``_calls``). Every ratio that states a goal is printed with
``met`` or ``missed``.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import re
import statistics
import tempfile
import time
import traceback
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import rfc8785

from benchmarks import _calls as calls
from benchmarks import _concurrency as concurrency
from benchmarks import _contention as contention
from benchmarks import _growth as growth
from benchmarks import _postgres as pg
from benchmarks import _retention as retention
from benchmarks import _structure as structure
from dataoad import ActionRunner, InMemoryLedger, PostgresLedger, SQLiteLedger
from dataoad._canonical import checked_request_hash

REQUEST: dict[str, str | int] = {
    "customer_id": "customer_123",
    "amount_cents": 2_500,
    "currency": "EUR",
}


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


# -- Dataoad ------------------------------------------------------------------------------


async def rfc8785_hash(n: int) -> str:
    return hashlib.sha256(rfc8785.dumps(REQUEST)).hexdigest()


async def dataoad_hash(n: int) -> str:
    # What execute does with a request: the strict-JSON check and the hash.
    return checked_request_hash(REQUEST)


async def stdlib_hash(n: int) -> str:
    text = json.dumps(REQUEST, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(text.encode()).hexdigest()


async def run_floors(count: int, results: dict[str, Any], ratios: dict[str, Any]) -> None:
    """The request check and hash next to the stdlib's canonical JSON (first calls: ``calls``)."""
    results["bare awaited no-op"] = await measure(lambda n: noop(), count)
    results["request check and hash (Dataoad)"] = await measure(dataoad_hash, count)
    results["request hash (rfc8785 + sha256)"] = await measure(rfc8785_hash, count)
    results["request hash floor (json.dumps sorted + sha256)"] = await measure(stdlib_hash, count)
    ratios["request check and hash / stdlib canonical json + sha256 (goal <= 1.2)"] = (
        results["request check and hash (Dataoad)"]["median_us"]
        / results["request hash floor (json.dumps sorted + sha256)"]["median_us"]
    )


async def run_first_calls(args: argparse.Namespace, report: dict[str, Any]) -> None:
    """First calls and replays on every storage: Dataoad, floors and (--peers) peers."""
    results, ratios = report["results"], report["ratios"]
    ratios.update(await calls.operation_counts())
    ratios.update(await structure.structure_figures())
    rounds = args.rounds or (3 if args.quick else 6)
    count = 200 if args.quick else 1000
    report["calls"] = {"rounds": rounds, "calls per round": count, "peers": args.peers}
    figures = await _with_postgres(
        args,
        results,
        "postgres",
        lambda dsn: calls.run_calls(count, rounds, args.peers, dsn, results),
    )
    ratios.update(calls.call_goals(figures))


async def _with_postgres(
    args: argparse.Namespace,
    results: dict[str, Any],
    label: str,
    run: Callable[[str | None], Awaitable[Any]],
) -> Any:
    """``run(dsn)`` with a PostgreSQL server (None with --no-postgres, or why not as ``label``)."""
    if args.no_postgres:
        return await run(None)
    async with pg.server() as (dsn, _, why):
        if dsn is None:
            results[label] = why
        else:
            results["postgres server"] = await pg.server_durability(dsn)
        return await run(dsn)


async def run_many_agents(args: argparse.Namespace, report: dict[str, Any]) -> None:
    """C = 1, 8, 64 concurrent first calls: throughput, latency and loop stall (``_concurrency``)."""
    results, ratios = report["results"], report["ratios"]
    rounds = args.rounds or 3
    count = 256 if args.quick else 1024
    report["concurrency"] = {"rounds": rounds, "calls per level": count, "peers": args.peers}
    figures = await _with_postgres(
        args,
        results,
        "concurrency on postgres",
        lambda dsn: concurrency.run_concurrency(count, rounds, args.peers, dsn, results),
    )
    ratios.update(concurrency.concurrency_goals(figures))


async def run_postgres(
    count: int, seconds: int, results: dict[str, Any], ratios: dict[str, Any]
) -> None:
    """PostgresLedger on one connection and on a pool of 8, against the raw floor and pgbench."""
    async with pg.server() as (dsn, local, why):
        if dsn is None:
            results["PostgreSQL"] = why
            ratios["PostgresLedger / pgbench (goal >= 0.5)"] = why
            return
        results["postgres server"] = await pg.server_durability(dsn)
        step, close = await pg.raw_floor(dsn)
        results["asyncpg floor (3 statements, 1 connection)"] = await measure(step, count)
        await close()
        rate = pg.pgbench_rate(local, dsn, seconds)
        results["pgbench floor (same 3 statements, C client)"] = (
            rate if isinstance(rate, str) else {"per_second": rate}
        )
        one = await pg.ledger(dsn, min_size=1, max_size=1)
        results["PostgresLedger execute (1 connection)"] = await measure(
            pg.runner_step(ActionRunner(one), "one-"), count
        )
        await one.close()
        pooled = await pg.ledger(dsn, min_size=8, max_size=8)
        pool_result = await contention.contend(pooled, 8, max(1, count // 8), "distinct", "pool-")
        results["PostgresLedger execute (pool of 8, 8 tasks)"] = pool_result
        await pooled.close()
        single = results["PostgresLedger execute (1 connection)"]["per_second"]
        floor = results["asyncpg floor (3 statements, 1 connection)"]["per_second"]
        ratios["PostgresLedger 1 connection / asyncpg floor"] = single / floor
        if not isinstance(rate, str):
            ratios["PostgresLedger 1 connection / pgbench (goal >= 0.5)"] = single / rate
        ratios["PostgresLedger pool of 8 / 1 connection (goal >= 1.0)"] = (
            pool_result["per_second"] / single
        )
        await run_contention(count, dsn, results, ratios)


async def run_contention(
    count: int, dsn: str | None, results: dict[str, Any], ratios: dict[str, Any]
) -> None:
    """Tasks (1, 4, 16, 64) and 4 processes, distinct keys and one hot key."""
    with tempfile.TemporaryDirectory() as folder:
        backends: dict[str, Callable[[str], Any]] = {
            "SQLite": lambda name: str(Path(folder) / f"{name}.sqlite3"),
        }
        if dsn is not None:
            backends["PostgreSQL"] = lambda name: f"{dsn}#{name}"
        for backend, spec_for in backends.items():
            for tasks in (1, 4, 16, 64):
                for mode in ("distinct", "hot"):
                    spec = spec_for(f"c_{mode}_{tasks}_{uuid.uuid4().hex[:6]}")
                    if backend == "PostgreSQL":
                        await (await pg.ledger(spec.rsplit("#", 1)[0])).close()
                        made = contention.open_ledger(spec)
                        await made.migrate()
                    else:
                        made = contention.open_ledger(spec)
                    async with made as ledger:
                        figure = await contention.contend(
                            ledger, tasks, max(1, count // tasks), mode, ""
                        )
                    if mode == "hot" and figure["invocations"] != 1:
                        raise AssertionError(f"hot key invoked {figure['invocations']} times")
                    results[f"{backend} {tasks} tasks, {mode} keys"] = figure
            single_spec = spec_for(f"p1_{uuid.uuid4().hex[:6]}")
            multi_spec = spec_for(f"p4_{uuid.uuid4().hex[:6]}")
            hot_spec = spec_for(f"p4hot_{uuid.uuid4().hex[:6]}")
            for spec in (single_spec, multi_spec, hot_spec):
                if backend == "PostgreSQL":
                    dsn_part, table = spec.rsplit("#", 1)
                    from dataoad import PostgresLedger

                    async with PostgresLedger(dsn_part, table=table) as made:
                        await made.migrate()
                else:
                    async with contention.open_ledger(spec):
                        pass
            one = contention.processes(single_spec, 1, count, "distinct")
            four = contention.processes(multi_spec, 4, count, "distinct")
            hot = contention.processes(hot_spec, 4, count, "hot")
            if hot["invocations"] != 1:
                raise AssertionError(f"hot key invoked {hot['invocations']} times by 4 processes")
            results[f"{backend} 1 process"] = one
            results[f"{backend} 4 processes, distinct keys"] = four
            results[f"{backend} 4 processes, one hot key"] = hot
            ratios[f"{backend} 4 processes aggregate / 1 process (goal >= 0.7)"] = (
                four["per_second"] / one["per_second"]
            )
            ratios[f"{backend} 4 processes slowest / fair share (goal >= 0.8)"] = four[
                "slowest_share"
            ]
            ratios[f"{backend} 4 processes p99 ms (goal <= 15)"] = four["p99_ms"]


async def run_growth(
    quick: bool,
    count: int,
    results: dict[str, Any],
    ratios: dict[str, Any],
    no_postgres: bool = True,
) -> None:
    """Ledger size from 1e3 upwards, and attempt records per action."""
    sizes = [1_000, 100_000] if quick else [1_000, 10_000, 100_000, 1_000_000]
    with tempfile.TemporaryDirectory() as folder:
        figures = await growth.ledger_growth(Path(folder), sizes, min(count, 300))
    results["SQLite execute median us by ledger size"] = figures
    values = list(figures.values())
    ratios[f"SQLite execute at {sizes[-1]:.0e} / at 1e+03 receipts (goal <= 1.2)"] = (
        values[-1] / values[0]
    )
    per_attempt: dict[str, float] = {}
    memory = ActionRunner(InMemoryLedger())
    for attempts in (1, 4, 16):
        median = await growth.timed(growth.attempts_step(memory, attempts), min(count, 300))
        per_attempt[str(attempts)] = median / attempts * 1e6
    results["InMemoryLedger us per attempt, by attempts per action"] = per_attempt
    ratios["us per attempt at 16 attempts / at 1 attempt"] = per_attempt["16"] / per_attempt["1"]
    if not no_postgres:
        await _postgres_growth(sizes[0], sizes[-1], min(count, 300), results, ratios)


async def _postgres_growth(
    small: int, large: int, count: int, results: dict[str, Any], ratios: dict[str, Any]
) -> None:
    """PostgresLedger execute on a table already holding ``small`` and ``large`` receipts."""
    async with pg.server() as (dsn, _, why):
        if dsn is None:
            results["PostgreSQL growth"] = why
            return
        figures: dict[str, float] = {}
        for size in (small, large):
            ledger = await pg.ledger(dsn, min_size=1, max_size=1)
            try:
                await pg.fill(ledger, size, growth.filler_receipt)
                pool = await ledger._ready_pool()
                await pool.execute(f'ANALYZE "{ledger.schema}"."{ledger.table}"')
                step = growth.fresh_step(ActionRunner(ledger))
                figures[f"{size:.0e}"] = await growth.timed(step, count) * 1e6
            finally:
                await pg.drop(ledger)
    results["PostgreSQL execute median us by ledger size"] = figures
    ratios[f"PostgreSQL execute at {large:.0e} / at {small:.0e} receipts (goal <= 1.2)"] = (
        figures[f"{large:.0e}"] / figures[f"{small:.0e}"]
    )


async def run_retention(
    quick: bool, no_postgres: bool, results: dict[str, Any], ratios: dict[str, Any]
) -> None:
    """Prune old receipts in batches while another client keeps writing."""
    rows = 10_000 if quick else 100_000
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "retention.sqlite3"
        await (await growth.sqlite_with(path, rows)).close()
        async with SQLiteLedger(path) as ledger, SQLiteLedger(path) as writer:
            figures = await retention.prune_under_load(ledger, writer, rows)
    results[f"SQLite prune of {rows:.0e} receipts, a writer running"] = figures
    ratios["SQLite writer's longest wait during prune, ms (goal <= 250)"] = figures[
        "writer_max_wait_ms"
    ]
    if no_postgres:
        return
    async with pg.server() as (dsn, _, why):
        if dsn is None:
            results["PostgreSQL prune"] = why
            return
        table_ledger = await pg.ledger(dsn, min_size=1, max_size=2)
        try:
            await pg.fill(table_ledger, rows, growth.filler_receipt)
            pg_writer = PostgresLedger(dsn, table=table_ledger.table, min_size=1, max_size=2)
            try:
                figures = await retention.prune_under_load(table_ledger, pg_writer, rows)
            finally:
                await pg_writer.close()
        finally:
            await pg.drop(table_ledger)
    results[f"PostgreSQL prune of {rows:.0e} receipts, a writer running"] = figures
    ratios["PostgreSQL writer's longest wait during prune, ms (goal <= 250)"] = figures[
        "writer_max_wait_ms"
    ]


def run_suite_speed(quick: bool, results: dict[str, Any]) -> None:
    """How fast the verification suite itself explores (needs the dev extra)."""
    try:
        from benchmarks import _suite_speed as suite_speed
    except ImportError as exc:
        results["verification suite speed"] = (
            f"skipped: needs the dev extra (pip install -e '.[dev]'): {exc}"
        )
        return
    results["stateful runner machine (memory)"] = suite_speed.stateful_steps_per_second(
        10 if quick else 60
    )
    results["python -m stateful_tests.exhaustive (real runner)"] = (
        suite_speed.exhaustive_states_per_second()
    )


#: The measurements, in order; ``--sections`` picks some.
SECTIONS = (
    "calls",
    "concurrency",
    "floors",
    "postgres",
    "contention",
    "growth",
    "retention",
    "suite",
)

GOAL = re.compile(r"\(goal (<=|>=) ([0-9.]+)\)")


def verdict(name: str, value: Any) -> str:
    """``met``, ``missed`` or ``not measured`` for a ratio whose name states its goal; else ``""``."""
    goal = GOAL.search(name)
    if goal is None:
        return ""
    if not isinstance(value, int | float):
        return "not measured"
    bound = float(goal.group(2))
    return "met" if (value <= bound if goal.group(1) == "<=" else value >= bound) else "missed"


async def _section(name: str, args: argparse.Namespace, report: dict[str, Any]) -> None:
    count, results, ratios = report["count"], report["results"], report["ratios"]
    if name == "calls":
        await run_first_calls(args, report)
    elif name == "concurrency":
        await run_many_agents(args, report)
    elif name == "floors":
        await run_floors(count, results, ratios)
    elif name == "postgres":
        await run_postgres(count, 5 if args.quick else 20, results, ratios)
    elif name == "contention":
        # With a server, run_postgres measured contention on both backends.
        if args.no_postgres or "postgres" not in args.sections or "PostgreSQL" in results:
            await run_contention(count, None, results, ratios)
    elif name == "growth":
        await run_growth(args.quick, count, results, ratios, args.no_postgres)
    elif name == "retention":
        await run_retention(args.quick, args.no_postgres, results, ratios)


async def run(args: argparse.Namespace, report: dict[str, Any]) -> None:
    """Run the async sections; a failing one is recorded and the rest still run."""
    for name in args.sections:
        if name == "suite" or (name == "postgres" and args.no_postgres):
            continue
        try:
            await _section(name, args, report)
        except Exception as exc:  # keep every figure measured so far
            traceback.print_exc()
            report["results"][f"{name}: FAILED"] = f"{type(exc).__name__}: {exc}"


def _line(name: str, figures: Any) -> str:
    if isinstance(figures, str):
        return f"{name:<52} {figures}"
    if "median_us" in figures:
        return (
            f"{name:<52} median {figures['median_us']:9.1f} us  p99 {figures['p99_us']:9.1f} us"
            f"  {figures['per_second']:10.0f}/s"
        )
    return f"{name:<52} " + "  ".join(
        f"{k}={v:.3g}" if isinstance(v, float) else f"{k}={v}" for k, v in figures.items()
    )


def print_report(report: dict[str, Any]) -> None:
    """Every figure, then every ratio with met or missed against its stated goal."""
    print(f"{report['count']} actions per measurement\n")
    for name, figures in report["results"].items():
        print(_line(name, figures))
    print()
    for name, ratio in report["ratios"].items():
        shown = ratio if isinstance(ratio, str) else f"{ratio:8.2f}"
        print(f"{name:<72} {shown}  {report['verdicts'].get(name, '')}".rstrip())


def main(argv: list[str] | None = None) -> int:
    """Run the benchmarks; exit 1 when a measurement failed (its figures are still printed)."""
    parser = argparse.ArgumentParser(prog="python -m benchmarks", description=__doc__)
    parser.add_argument("--quick", action="store_true", help="fewer iterations (about a minute)")
    parser.add_argument("--json", metavar="FILE", help="also write the results as JSON")
    parser.add_argument(
        "--peers",
        action="store_true",
        help="also run Powertools, idemkit, agent-runtime-governance and DBOS (the bench extra)",
    )
    parser.add_argument(
        "--rounds", type=int, default=0, help="interleaved rounds of first calls (default 3/6)"
    )
    parser.add_argument(
        "--no-postgres", action="store_true", help="leave PostgreSQL out (no server is started)"
    )
    parser.add_argument(
        "--sections",
        nargs="+",
        choices=SECTIONS,
        default=list(SECTIONS),
        help="which measurements to run (default: all)",
    )
    args = parser.parse_args(argv)
    report: dict[str, Any] = {"results": {}, "ratios": {}, "count": 300 if args.quick else 3000}
    try:
        asyncio.run(run(args, report))
        if "suite" in args.sections:
            # The state machines run their own event loops, so outside asyncio.run.
            try:
                run_suite_speed(args.quick, report["results"])
            except Exception as exc:
                traceback.print_exc()
                report["results"]["suite: FAILED"] = f"{type(exc).__name__}: {exc}"
    finally:
        # Whatever happened, print (and keep) what was measured.
        report["verdicts"] = {
            name: verdict(name, ratio)
            for name, ratio in report["ratios"].items()
            if verdict(name, ratio)
        }
        print_report(report)
        if args.json:
            Path(args.json).write_text(json.dumps(report, indent=2))
    return 1 if any(name.endswith(": FAILED") for name in report["results"]) else 0


if __name__ == "__main__":
    raise SystemExit(main())
