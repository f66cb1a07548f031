"""Many agents at once: C concurrent first calls on distinct keys in one event loop.

What users of an agent runtime feel is not one lone call: it is how many
actions per second many concurrent tasks get, and whether the event loop
keeps running meanwhile. For C = 1, 8 and 64 concurrent tasks, each making
first calls on fresh keys, every configuration reports throughput, the
latency of one call (p50, p99) and the worst stall of the event loop (the
largest lateness of a 1 ms ticker running beside the calls).

Configurations, on SQLite (WAL, synchronous=FULL) and PostgreSQL:

* Dataoad (``ActionRunner.execute``; PostgreSQL: the default pool);
* Powertools (the ``bench`` extra), which is synchronous and blocks the loop
  for a whole call, as an asyncio caller of it gets;
* floors: SQLite, a group-commit writer on its own thread running the two
  statements of a fused claim and its completion, each awaited, with one
  transaction per group; PostgreSQL, the same two statements through an
  asyncpg pool of the ledger's default size (10);
* layers between them, to say where a gap lies: Dataoad's ledger alone
  (its ``claim`` and ``record`` of the receipts a first call writes, built
  by the runner's own code, with no runner above), and Dataoad's own two
  statements and table with none of the ledger's own Python: on PostgreSQL
  through a plain asyncpg pool of the same size (what Dataoad's row costs
  the driver and the server), on SQLite through the floor's bare
  group-commit writer, once with each call's receipts built and encoded
  and once with the values encoded a single time (what the table and its
  SQL cost alone).

Rounds interleave the configurations; a figure is the median over rounds.
Beside the ratios, the run's commit latency (one fsync of a small file in
the run's folder; one committed INSERT on the server) says what a commit
costs on this machine today.
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
import sqlite3
import statistics
import tempfile
import threading
import time
import uuid
from collections.abc import Awaitable, Callable
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

from benchmarks.peers import Session, Storage, load
from dataoad import (
    ActionReceipt,
    ActionRunner,
    ActionStatus,
    InMemoryLedger,
    PostgresLedger,
    RetryPolicy,
    SQLiteLedger,
)
from dataoad._attempts import Call, _fused_claim
from dataoad._canonical import checked_request_hash
from dataoad._clock import SystemClock, utc_now
from dataoad._leases import DEFAULT_LEASE, Tenure, default_owner
from dataoad._proven import ProvenLedger
from dataoad._settled import completed
from dataoad.ledgers._codec import values_of
from dataoad.ledgers._sqlite_file import clock_text
from dataoad.ledgers.sqlite import _SQL as _SQLITE_SQL
from dataoad.ledgers.sqlite import _values_of as sqlite_values_of

__all__ = ["LEVELS", "concurrency_goals", "run_concurrency"]

#: The numbers of concurrent tasks.
LEVELS = (1, 8, 64)
#: The PostgresLedger's default pool size, which the floor's pool matches.
POOL_SIZE = 10

Opener = Callable[[Storage, str], Awaitable[Session]]


async def _noop() -> None:
    return None


# -- Dataoad --------------------------------------------------------------------------------


async def _open_ledger(storage: Storage, prefix: str) -> tuple[Any, Callable[[], Awaitable[None]]]:
    """A fresh SQLite FULL file or a default-pool PostgresLedger table, and how to drop it."""
    if storage.kind == "sqlite":
        ledger: Any = SQLiteLedger(storage.folder / f"{prefix}dataoad.sqlite3")
    else:
        assert storage.dsn is not None
        ledger = PostgresLedger(storage.dsn, table=f"bench_{uuid.uuid4().hex[:12]}")
        await ledger.migrate()

    async def close() -> None:
        if storage.kind == "postgres":
            pool = await ledger._raw_pool()
            for suffix in ("", "_schema", "_audit"):
                await pool.execute(f'DROP TABLE IF EXISTS "public"."{ledger.table}{suffix}"')
        await ledger.close()

    return ledger, close


async def open_dataoad(storage: Storage, prefix: str) -> Session:
    """``execute`` of a no-op, on SQLite FULL or a default-pool PostgresLedger."""
    ledger, close = await _open_ledger(storage, prefix)
    runner = ActionRunner(ledger)

    async def first(n: int) -> Any:
        return await runner.execute(
            "charge", _noop, request={"n": n}, idempotency_key=f"{prefix}k{n}"
        )

    return Session(first, first, close)


#: Who the ledger-alone configurations write as (the runner's own claim builder needs one).
_TENURE = Tenure(owner=default_owner(), lease=DEFAULT_LEASE, clock=SystemClock())
_STORE_SCOPE = ProvenLedger(InMemoryLedger(), "")


def _writes_of_a_first_call(key: str) -> tuple[ActionReceipt, Callable[[ActionReceipt], Any]]:
    """The claim a first call writes and how its completion is built, by the runner's own code."""
    call = Call(
        action_name="charge",
        operation=_noop,
        idempotency_key=key,
        digest=checked_request_hash({"n": key}),
        provider_reference=None,
        verify=None,
        risk=None,
        metadata={},
        policy=RetryPolicy(),
    )
    claim = _fused_claim(_STORE_SCOPE, call, _TENURE)

    def completed_from(stored: ActionReceipt) -> ActionReceipt:
        finished = dataclasses.replace(
            stored.attempt_records[-1],
            execution_status=ActionStatus.CONFIRMED,
            retry_decision="stop",
            finished_at=utc_now(),
        )
        final, _ = completed(stored, [finished], (), stored.metadata, None)
        return final

    return claim, completed_from


async def open_ledger_alone(storage: Storage, prefix: str) -> Session:
    """The ledger's two writes of a first call (claim, then record), with no runner above it.

    What the ledger costs (encoding, statements, commits): the gap between
    this and the floor is the ledger's, between Dataoad and this the runner's.
    """
    ledger, close = await _open_ledger(storage, prefix)

    async def first(n: int) -> None:
        claim, completion_of = _writes_of_a_first_call(f"{prefix}k{n}")
        stored, created = await ledger.claim(claim, lease=DEFAULT_LEASE)
        if not created:
            raise RuntimeError(f"the claim of a fresh key was not created: {stored!r}")
        await _noop()
        if not await ledger.record(completion_of(stored)):
            raise RuntimeError("the completion of a fresh claim was refused")

    return Session(first, first, close)


async def open_postgres_statements(storage: Storage, prefix: str) -> Session:
    """The PostgresLedger's own two statements and table, straight through an asyncpg pool.

    Dataoad's schema and SQL at the floor's kind of client: the gap between
    the fused floor and this is what Dataoad's row costs the driver and the
    server (its 30 to 40 values, its indexes, the claim's look-up), with
    none of the ledger's own Python.
    """
    import asyncpg

    ledger, close_ledger = await _open_ledger(storage, prefix)
    pool = await asyncpg.create_pool(storage.dsn, min_size=POOL_SIZE, max_size=POOL_SIZE)
    claim_sql, record_sql = ledger._sql["claim_or_held"], ledger._sql["record"]

    async def first(n: int) -> None:
        claim, completion_of = _writes_of_a_first_call(f"{prefix}k{n}")
        values = {**values_of(claim), "now": None, "lease": DEFAULT_LEASE}
        rows = await pool.fetch(claim_sql.sql, *claim_sql.bind(values))
        if not rows or not rows[0][-1]:
            raise RuntimeError(f"the claim of a fresh key was not created: {rows!r}")
        await _noop()
        final = completion_of(claim)
        values = {**values_of(final), "previous_version": 1, "now": None}
        if not await pool.fetch(record_sql.sql, *record_sql.bind(values)):
            raise RuntimeError("the completion of a fresh claim was refused")

    async def close() -> None:
        await pool.close()
        await close_ledger()

    return Session(first, first, close)


async def sqlite_statements_table(storage: Storage, prefix: str) -> Path:
    """A new SQLite ledger file, its table and schema made by the ledger itself."""
    path = storage.folder / f"{prefix}statements.sqlite3"
    async with SQLiteLedger(path) as ledger:
        await ledger.get("none")
    return path


def _claim_values(claim: ActionReceipt, now: datetime) -> dict[str, Any]:
    lease_end = clock_text(now + timedelta(seconds=DEFAULT_LEASE))
    return {**sqlite_values_of(claim), "now": clock_text(now), "lease_end": lease_end}


def _record_values(final: ActionReceipt, now: datetime) -> dict[str, Any]:
    values = sqlite_values_of(final)
    values.update(previous_version=final.version - 1, now=clock_text(now), lease_end=None)
    return values


def _statement_values(
    claim: ActionReceipt, completion_of: Callable[[ActionReceipt], ActionReceipt]
) -> tuple[dict[str, Any], dict[str, Any]]:
    moment = utc_now()
    return _claim_values(claim, moment), _record_values(completion_of(claim), moment)


def encoded_once(prefix: str) -> Callable[[int], tuple[tuple[Any, ...], tuple[Any, ...]]]:
    """The SQLite ledger's claim and record arguments of call ``n``, encoded a single time.

    Only the ids change from call to call (one receipt per key), so a layer
    that runs them costs what the table and the SQL cost, with none of the
    receipts' building and encoding.
    """
    claim_sql, record_sql = _SQLITE_SQL["claim"], _SQLITE_SQL["record"]
    claimed_once, recorded_once = _statement_values(*_writes_of_a_first_call(f"{prefix}template"))

    def arguments(n: int) -> tuple[tuple[Any, ...], tuple[Any, ...]]:
        ids = {"action_id": f"{prefix}a{n}", "idempotency_key": f"{prefix}k{n}"}
        return claim_sql.bind({**claimed_once, **ids}), record_sql.bind({**recorded_once, **ids})

    return arguments


async def _sqlite_statements(storage: Storage, prefix: str, *, encode_each_call: bool) -> Session:
    """The SQLiteLedger's own claim and record statements on its own table, through the floor's
    bare group-commit writer: no look-up before the claim, no writer lock, no file clock, none
    of the ledger's Python (a single writer needs none of them; this measures, it is no ledger).

    ``encode_each_call``: each call builds its receipts with the runner's own code and encodes
    them with the ledger's codec, as the PostgreSQL layer does; otherwise the values are
    encoded once and only the ids change, so what is left is what the table and SQL cost.
    """
    path = await sqlite_statements_table(storage, prefix)
    writer = _GroupCommitFloor(path, table=None)
    claim_sql, record_sql = _SQLITE_SQL["claim"], _SQLITE_SQL["record"]
    once = encoded_once(prefix)

    async def first(n: int) -> None:
        if encode_each_call:
            claim, completion_of_claim = _writes_of_a_first_call(f"{prefix}k{n}")
            claimed = claim_sql.bind(_claim_values(claim, utc_now()))
        else:
            claimed, recorded = once(n)
        if not await writer.write(claim_sql.sql, claimed):
            raise RuntimeError(f"the claim of a fresh key was not created: call {n}")
        await _noop()
        if encode_each_call:
            recorded = record_sql.bind(_record_values(completion_of_claim(claim), utc_now()))
        if not await writer.write(record_sql.sql, recorded):
            raise RuntimeError("the completion of a fresh claim was refused")

    async def close() -> None:
        writer.close()

    return Session(first, first, close)


async def open_sqlite_statements(storage: Storage, prefix: str) -> Session:
    """Dataoad's statements on its table, each call's receipts built and encoded (see above)."""
    return await _sqlite_statements(storage, prefix, encode_each_call=True)


async def open_sqlite_statements_encoded_once(storage: Storage, prefix: str) -> Session:
    """Dataoad's statements on its table, values encoded once: the table's and SQL's cost."""
    return await _sqlite_statements(storage, prefix, encode_each_call=False)


# -- floors ---------------------------------------------------------------------------------

_SQLITE_TABLE = (
    "CREATE TABLE IF NOT EXISTS floor (id TEXT PRIMARY KEY, key TEXT UNIQUE NOT NULL, "
    "version INTEGER NOT NULL, state TEXT NOT NULL, body TEXT NOT NULL)"
)
_CLAIM = (
    "INSERT INTO floor (id, key, version, state, body) VALUES (?, ?, 1, 'PENDING', ?) "
    "ON CONFLICT (key) DO NOTHING RETURNING id"
)
_FINISH = (
    "UPDATE floor SET version = 2, state = 'COMPLETED', body = ? WHERE id = ? AND version = 1 "
    "RETURNING id"
)
_BODY = '{"attempts":[{"number":1,"started_at":"2026-12-04T00:00:00+00:00"}]}'


class _GroupCommitFloor:
    """A writer thread: every statement queued while it commits goes into its next transaction."""

    def __init__(self, path: Path, table: str | None = _SQLITE_TABLE) -> None:
        self._db = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=FULL")
        if table is not None:  # None: a file whose table exists (a Dataoad ledger's)
            self._db.execute(table)
        self._queue: list[tuple[str, tuple[Any, ...], asyncio.Future[Any]]] = []
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._stopped = False
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    async def write(self, sql: str, args: tuple[Any, ...]) -> list[Any]:
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        with self._lock:
            self._queue.append((sql, args, future))
        self._wake.set()
        return await future  # type: ignore[no-any-return]

    def _run(self) -> None:
        while not self._stopped:
            self._wake.wait()
            self._wake.clear()
            with self._lock:
                group, self._queue = self._queue, []
            if not group:
                continue
            self._db.execute("BEGIN IMMEDIATE")
            answers = [self._db.execute(sql, args).fetchall() for sql, args, _ in group]
            self._db.execute("COMMIT")
            for (_, _, future), rows in zip(group, answers, strict=True):
                future.get_loop().call_soon_threadsafe(_settle, future, rows)

    def close(self) -> None:
        self._stopped = True
        self._wake.set()
        self._thread.join()
        self._db.close()


def _settle(future: asyncio.Future[Any], rows: Any) -> None:
    if not future.done():
        future.set_result(rows)


async def open_sqlite_floor(storage: Storage, prefix: str) -> Session:
    """The two statements of a first call, each awaited, committed in groups."""
    writer = _GroupCommitFloor(storage.folder / f"{prefix}floor.sqlite3")

    async def first(n: int) -> None:
        action_id = uuid.uuid4().hex
        await writer.write(_CLAIM, (action_id, f"k{n}", _BODY))
        await _noop()
        await writer.write(_FINISH, (_BODY, action_id))

    async def close() -> None:
        writer.close()

    return Session(first, first, close)


async def open_postgres_floor(storage: Storage, prefix: str) -> Session:
    """The same two statements through an asyncpg pool of the ledger's default size."""
    import asyncpg

    table = f"floor_{uuid.uuid4().hex[:12]}"
    pool = await asyncpg.create_pool(storage.dsn, min_size=POOL_SIZE, max_size=POOL_SIZE)
    await pool.execute(
        f"CREATE TABLE {table} (id text PRIMARY KEY, key text UNIQUE NOT NULL, "
        "version integer NOT NULL, state text NOT NULL, body text NOT NULL)"
    )
    claim = (
        f"INSERT INTO {table} (id, key, version, state, body) VALUES ($1, $2, 1, 'PENDING', $3) "
        "ON CONFLICT (key) DO NOTHING RETURNING id"
    )
    finish = (
        f"UPDATE {table} SET version = 2, state = 'COMPLETED', body = $1 "
        "WHERE id = $2 AND version = 1 RETURNING id"
    )

    async def first(n: int) -> None:
        action_id = uuid.uuid4().hex
        await pool.fetch(claim, action_id, f"k{n}", _BODY)
        await _noop()
        await pool.fetch(finish, _BODY, action_id)

    async def close() -> None:
        await pool.execute(f"DROP TABLE {table}")
        await pool.close()

    return Session(first, first, close)


# -- one level ------------------------------------------------------------------------------


async def _ticker(stop: asyncio.Event) -> float:
    """The worst lateness (s) of a 1 ms sleep while ``stop`` is unset."""
    loop = asyncio.get_running_loop()
    worst = 0.0
    while not stop.is_set():
        began = loop.time()
        await asyncio.sleep(0.001)
        worst = max(worst, loop.time() - began - 0.001)
    return worst


async def run_level(
    first: Callable[[int], Awaitable[Any]], tasks: int, calls: int, start: int
) -> dict[str, float]:
    """``tasks`` concurrent tasks making ``calls`` first calls in all; throughput, latency, stall."""
    latencies: list[float] = []
    per_task = max(1, calls // tasks)
    stop = asyncio.Event()
    ticker = asyncio.ensure_future(_ticker(stop))
    await asyncio.sleep(0.002)

    async def task(t: int) -> None:
        for i in range(per_task):
            began = time.perf_counter()
            await first(start + t * per_task + i)
            latencies.append(time.perf_counter() - began)

    began = time.perf_counter()
    await asyncio.gather(*(task(t) for t in range(tasks)))
    elapsed = time.perf_counter() - began
    stop.set()
    stall = await ticker
    latencies.sort()
    return {
        "per_second": len(latencies) / elapsed,
        "p50_ms": statistics.median(latencies) * 1e3,
        "p99_ms": latencies[min(len(latencies) - 1, int(len(latencies) * 0.99))] * 1e3,
        "stall_ms": stall * 1e3,
    }


# -- the run --------------------------------------------------------------------------------


def _fsync_latency_ms(folder: Path) -> float:
    path = folder / "fsync-probe"
    samples = []
    with open(path, "wb") as probe:
        for _ in range(20):
            probe.write(b"x" * 512)
            probe.flush()
            began = time.perf_counter()
            os.fsync(probe.fileno())
            samples.append(time.perf_counter() - began)
    path.unlink()
    return statistics.median(samples) * 1e3


async def _commit_latency_ms(dsn: str) -> float:
    import asyncpg

    conn = await asyncpg.connect(dsn)
    table = f"probe_{uuid.uuid4().hex[:12]}"
    await conn.execute(f"CREATE TABLE {table} (n integer)")
    samples = []
    for n in range(20):
        began = time.perf_counter()
        await conn.execute(f"INSERT INTO {table} VALUES ($1)", n)
        samples.append(time.perf_counter() - began)
    await conn.execute(f"DROP TABLE {table}")
    await conn.close()
    return statistics.median(samples) * 1e3


def _plan(kind: str, peers: bool) -> dict[str, Opener | str]:
    plan: dict[str, Opener | str] = {
        "floor": open_sqlite_floor if kind == "sqlite" else open_postgres_floor,
        "Dataoad": open_dataoad,
        "Dataoad's ledger alone": open_ledger_alone,
    }
    if kind == "postgres":
        plan["Dataoad's statements, asyncpg"] = open_postgres_statements
    else:
        plan["Dataoad's statements, bare writer"] = open_sqlite_statements
        plan["Dataoad's statements encoded once, bare writer"] = open_sqlite_statements_encoded_once
    if peers:
        peer = load("Powertools")
        probe = Storage(kind, Path("."), synchronous="FULL", dsn="postgresql://")
        if isinstance(peer, str):
            plan["Powertools"] = peer
        elif (why := peer.unsupported(probe)) is not None:
            plan["Powertools"] = f"not measured: {why}"
        else:
            plan["Powertools"] = peer.open
    return plan


async def run_concurrency(
    calls: int, rounds: int, peers: bool, dsn: str | None, results: dict[str, Any]
) -> dict[str, dict[str, dict[int, dict[str, float]] | str]]:
    """Per storage and configuration, per level: medians over rounds."""
    samples: dict[tuple[str, str, int], list[dict[str, float]]] = {}
    plans: dict[str, dict[str, Opener | str]] = {"sqlite FULL": _plan("sqlite", peers)}
    if dsn is not None:
        plans["postgres"] = _plan("postgres", peers)
    with tempfile.TemporaryDirectory() as folder:
        results["commit latency, sqlite FULL (one fsync)"] = {"ms": _fsync_latency_ms(Path(folder))}
        if dsn is not None:
            results["commit latency, postgres (one INSERT)"] = {"ms": await _commit_latency_ms(dsn)}
        for round_number in range(rounds):
            for storage, plan in plans.items():
                kind = storage.split()[0]
                where = Path(folder) / f"c{round_number}-{kind}"
                where.mkdir(exist_ok=True)
                place = Storage(kind, where, synchronous="FULL", dsn=dsn)
                for name, opener in plan.items():
                    if isinstance(opener, str):
                        continue
                    prefix = f"c{round_number}{uuid.uuid4().hex[:6]}-"
                    try:
                        session = await opener(place, prefix)
                    except Exception as exc:
                        plan[name] = f"failed: {type(exc).__name__}: {exc}"[:200]
                        continue
                    try:
                        await run_level(session.first, 4, 20, 10_000_000)  # warm
                        for n, level in enumerate(LEVELS):
                            measured = await run_level(session.first, level, calls, n * 1_000_000)
                            samples.setdefault((storage, name, level), []).append(measured)
                    finally:
                        await session.close()
    figures: dict[str, dict[str, dict[int, dict[str, float]] | str]] = {}
    for storage, plan in plans.items():
        figures[storage] = {}
        for name, opener in plan.items():
            if isinstance(opener, str):
                figures[storage][name] = opener
                continue
            levels: dict[int, dict[str, float]] = {}
            for level in LEVELS:
                taken = samples.get((storage, name, level), [])
                if not taken:
                    continue
                levels[level] = {k: statistics.median(s[k] for s in taken) for k in taken[0]}
                results[f"{storage}: {name}, C={level}"] = {
                    k: round(v, 2) for k, v in levels[level].items()
                }
            figures[storage][name] = levels
    return figures


def concurrency_goals(
    figures: dict[str, dict[str, dict[int, dict[str, float]] | str]],
) -> dict[str, float | str]:
    """The issue's goals as ratios of this run's figures (a string says why one is missing)."""
    goals: dict[str, float | str] = {}

    def ratio(storage: str, a: str, b: str, level: int, key: str) -> float | str:
        row = figures.get(storage, {})
        left, right = row.get(a), row.get(b)
        if isinstance(left, str) or left is None or level not in left:
            return f"not measured: {a}" if not isinstance(left, str) else left
        if isinstance(right, str) or right is None or level not in right:
            return f"not measured: {b}" if not isinstance(right, str) else right
        bottom = right[level][key]
        return left[level][key] / bottom if bottom else float("inf")

    for storage in ("sqlite FULL", "postgres"):
        if storage not in figures:
            continue
        goals[f"{storage}: loop stall at C=64 / Powertools (goal <= 0.1)"] = ratio(
            storage, "Dataoad", "Powertools", 64, "stall_ms"
        )
    if "sqlite FULL" in figures:
        for level, bound in ((8, 2), (64, 4)):
            goals[f"sqlite FULL: throughput at C={level} / Powertools (goal >= {bound})"] = ratio(
                "sqlite FULL", "Dataoad", "Powertools", level, "per_second"
            )
        for level in LEVELS:
            goals[f"sqlite FULL: throughput at C={level} / group-commit floor"] = ratio(
                "sqlite FULL", "Dataoad", "floor", level, "per_second"
            )
    if "postgres" in figures:
        # #41's lone caller: a call at most 1.1 times the fused floor's, as throughput.
        goals["postgres: throughput at C=1 / fused 2-statement floor, #41 (goal >= 0.91)"] = ratio(
            "postgres", "Dataoad", "floor", 1, "per_second"
        )
        for level in (8, 64):
            goals[f"postgres: throughput at C={level} / Powertools (goal >= 1.5)"] = ratio(
                "postgres", "Dataoad", "Powertools", level, "per_second"
            )
            goals[f"postgres: throughput at C={level} / fused 2-statement floor (goal >= 0.95)"] = (
                ratio("postgres", "Dataoad", "floor", level, "per_second")
            )
    # Where a throughput gap lies: each layer against the one below it.
    layers = (
        ("Dataoad's ledger alone", "floor", "ledger alone / floor"),
        ("Dataoad", "Dataoad's ledger alone", "Dataoad / its ledger alone"),
        (
            "Dataoad's statements encoded once, bare writer",
            "floor",
            "Dataoad's statements encoded once / floor",
        ),
        (
            "Dataoad's statements, bare writer",
            "Dataoad's statements encoded once, bare writer",
            "Dataoad's statements / the same encoded once",
        ),
        (
            "Dataoad's ledger alone",
            "Dataoad's statements, bare writer",
            "ledger alone / its statements",
        ),
        ("Dataoad's statements, asyncpg", "floor", "Dataoad's statements / fused floor"),
        (
            "Dataoad's ledger alone",
            "Dataoad's statements, asyncpg",
            "ledger alone / its statements",
        ),
    )
    for storage in ("sqlite FULL", "postgres"):
        for upper, lower, label in layers:
            if storage in figures and upper in figures[storage] and lower in figures[storage]:
                for level in LEVELS:
                    goals[f"{storage}: throughput at C={level}, {label}"] = ratio(
                        storage, upper, lower, level, "per_second"
                    )
    return goals
