"""First calls and replays: Dataoad, its floors and its peers, interleaved in one run.

Each configuration is a ``Session`` (``benchmarks.peers``): a first call on
a fresh key and a replay of a completed one, opened on one storage. Every
round opens each configuration of a storage in turn, warms it up, times
``count`` first calls and ``count`` replays, and closes it, so drift on a
shared machine hits every configuration alike. A figure is the median over
rounds of each round's median; ratios are taken between figures of the same
run only.

Floors, the same work without a library around it:

* memory: the request hash, then claim, start and completion as three
  sections under one ``threading.Lock`` on a dict (replay: the hash and one
  look-up);
* SQLite: the three statements (claim, start, completion) in plain
  ``sqlite3`` on the loop's thread, autocommit, the same journal and
  synchronous setting; and the two statements a fused claim needs through
  ``aiosqlite``, each awaited (the floor of a ledger that never blocks the
  event loop);
* PostgreSQL: the three statements on one ``asyncpg`` connection (replay:
  one ``SELECT`` by key).
"""

from __future__ import annotations

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
from typing import Any, Final

import aiosqlite
import rfc8785

from benchmarks import _postgres as pg
from benchmarks.peers import PEERS, REQUEST, Session, Storage, load
from dataoad import ActionResult, ActionRunner, InMemoryLedger, SQLiteLedger
from dataoad._arguments import prepare_call
from dataoad._attempts import Call, _fused_claim
from dataoad._events import EventSink
from dataoad._invoking import invoke
from dataoad._receipt import AttemptRecord, utc_now
from dataoad._settled import completed, exposed_value

__all__ = ["STORAGES", "run_calls"]

#: The storages compared, in the order they are reported.
STORAGES = ("memory", "sqlite FULL", "sqlite NORMAL", "postgres")

Opener = Callable[[Storage, str], Awaitable[Session]]


async def _noop() -> None:
    return None


def _hash() -> str:
    return hashlib.sha256(rfc8785.dumps(REQUEST)).hexdigest()


async def _closed() -> None:
    return None


# -- Dataoad -------------------------------------------------------------------------------


async def open_dataoad(storage: Storage, prefix: str, *, sync_operation: bool = False) -> Session:
    """Dataoad's ``execute`` of a no-op on ``storage`` (PostgreSQL: the default pool).

    The default pool (up to 10 connections) is what ``PostgresLedger(dsn)``
    gives a user, and with two or more connections the ledger keeps one
    checked out for consecutive statements (``_postgres_lane``); a single
    caller uses one connection either way, like the floor.
    """
    if storage.kind == "memory":
        ledger: Any = InMemoryLedger()
    elif storage.kind == "sqlite":
        ledger = SQLiteLedger(
            storage.folder / f"{prefix}dataoad.sqlite3",
            synchronous=storage.synchronous,  # type: ignore[arg-type]
        )
    else:
        assert storage.dsn is not None
        ledger = await pg.ledger(storage.dsn)
    runner = ActionRunner(ledger)

    def sync_noop() -> None:
        return None

    operation: Any = sync_noop if sync_operation else _noop
    await runner.execute("charge", operation, request=REQUEST, idempotency_key=f"{prefix}done")

    async def first(n: int) -> Any:
        return await runner.execute(
            "charge", operation, request=REQUEST, idempotency_key=f"{prefix}k{n}"
        )

    async def replay(n: int) -> Any:
        return await runner.execute(
            "charge", operation, request=REQUEST, idempotency_key=f"{prefix}done"
        )

    async def close() -> None:
        if storage.kind == "postgres":
            await pg.drop(ledger)
        else:
            await ledger.close()

    return Session(first, replay, close)


async def open_no_layers(storage: Storage, prefix: str) -> Session:
    """Dataoad's own work of a call in memory, with none of the runner's layers (#40's prototype).

    What a first call must do with today's receipts, rules and ledger,
    written out straight: the arguments checked and the request hashed
    (``prepare_call``), the fused claim built and inserted into the
    ``InMemoryLedger``, the operation, the finished attempt, the settled
    receipt (``completed``), the value rule and the proven write's one
    ledger call. Left out are the layers: verb accounting and events,
    ``ProvenLedger``'s error handling, the lease timer, the attempt
    context and the wait. A replay is the argument checks and the claim
    finding its key held. Its ratio to Powertools is the floor a runner
    with no layers at all would stand on, so it says how much of #40's gap
    the layers explain and how much the receipts and the ledger do.
    """
    ledger = InMemoryLedger()
    runner = ActionRunner(ledger)
    store, tenure = runner._store, runner._tenure
    # Never heard: a call this quick is never late in its lease.
    events = EventSink((), "execute")

    def prepared(key: str) -> Call:
        return prepare_call(
            "charge",
            _noop,
            request=REQUEST,
            idempotency_key=key,
            provider_reference=None,
            verifier=None,
            risk=None,
            metadata=None,
            policy=None,
            default_policy=runner.policy,
            namespace=store.namespace,
            expires_after=None,
            bounds=runner._bounds,
        )

    async def first(n: int) -> ActionResult[Any]:
        call = prepared(f"{prefix}k{n}")
        sent = tenure.clock.monotonic()
        claimed, created = await ledger.claim(_fused_claim(store, call, tenure), lease=tenure.lease)
        if not created:
            raise RuntimeError(f"the claim of a fresh key was not created: {claimed!r}")
        execution = await invoke(
            call.operation,
            verifying=False,
            store=store,
            held=claimed,
            tenure=tenure,
            events=events,
            sent=sent,
        )
        started = claimed.attempt_records[-1]
        finished = AttemptRecord(
            number=started.number,
            started_at=started.started_at,
            execution_status=execution.status,
            error=execution.error,
            retry_decision="stop",
            finished_at=utc_now(),
        )
        final, settlement = completed(claimed, [finished], (), claimed.metadata, execution.error)
        value = exposed_value(settlement, execution.value, None)
        if not await ledger.record(final):
            raise RuntimeError("the completion of a fresh claim was refused")
        return ActionResult(final, value=value)

    async def replay(n: int) -> ActionResult[Any]:
        # The key this session's own first call completed: a replay of what it stored.
        call = prepared(f"{prefix}k0")
        held, created = await ledger.claim(_fused_claim(store, call, tenure), lease=tenure.lease)
        if created or held.request_hash != call.digest or held.is_pending:
            raise RuntimeError("a replay did not find its completed key")
        return ActionResult(held, replayed=True)

    await first(0)
    return Session(first, replay, _closed)


# -- floors --------------------------------------------------------------------------------


async def open_memory_floor(storage: Storage, prefix: str) -> Session:
    lock = threading.Lock()
    rows: dict[str, dict[str, Any]] = {}

    async def first(n: int) -> None:
        digest = _hash()
        key = f"{prefix}k{n}"
        with lock:  # claim
            rows[key] = {"version": 1, "attempts": 0, "hash": digest}
        with lock:  # attempt start
            rows[key] = {**rows[key], "version": 2, "attempts": 1}
        await _noop()
        with lock:  # completion
            rows[key] = {**rows[key], "version": 3, "state": "COMPLETED"}

    async def replay(n: int) -> Any:
        digest = _hash()
        with lock:
            row = rows[f"{prefix}k0"]
        return row["hash"] == digest

    await first(0)
    return Session(first, replay, _closed)


_TABLE = (
    "CREATE TABLE r (id TEXT PRIMARY KEY, key TEXT UNIQUE, version INT, attempts INT,"
    " state TEXT, body TEXT)"
)


async def open_sqlite3_floor(storage: Storage, prefix: str) -> Session:
    """Three autocommit statements in plain sqlite3, run inline (they block the loop)."""
    conn = sqlite3.connect(storage.folder / f"{prefix}floor.db", isolation_level=None)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute(f"PRAGMA synchronous={storage.synchronous}")
    conn.execute(_TABLE)

    async def first(n: int) -> None:
        action_id = uuid.uuid4().hex
        body = json.dumps({"request_hash": _hash()})
        conn.execute(
            "INSERT INTO r VALUES (?, ?, 1, 0, 'PENDING', ?) ON CONFLICT DO NOTHING",
            (action_id, f"k{n}", body),
        )
        conn.execute(
            "UPDATE r SET version = 2, attempts = 1 WHERE id = ? AND version = 1", (action_id,)
        )
        await _noop()
        conn.execute(
            "UPDATE r SET version = 3, state = 'COMPLETED' WHERE id = ? AND version = 2",
            (action_id,),
        )

    async def replay(n: int) -> Any:
        _hash()
        return conn.execute("SELECT * FROM r WHERE key = 'k0'").fetchall()

    async def close() -> None:
        conn.close()

    await first(0)
    return Session(first, replay, close)


async def open_aiosqlite_floor(storage: Storage, prefix: str) -> Session:
    """The fused claim's two statements through aiosqlite, each awaited (never blocking)."""
    conn = await aiosqlite.connect(storage.folder / f"{prefix}afloor.db", isolation_level=None)
    await conn.execute("PRAGMA journal_mode=WAL")
    await conn.execute(f"PRAGMA synchronous={storage.synchronous}")
    await conn.execute(_TABLE)

    async def first(n: int) -> None:
        action_id = uuid.uuid4().hex
        body = json.dumps({"request_hash": _hash()})
        await conn.execute(
            "INSERT INTO r VALUES (?, ?, 1, 1, 'PENDING', ?) ON CONFLICT DO NOTHING",
            (action_id, f"k{n}", body),
        )
        await _noop()
        await conn.execute(
            "UPDATE r SET version = 2, state = 'COMPLETED' WHERE id = ? AND version = 1",
            (action_id,),
        )

    async def replay(n: int) -> Any:
        _hash()
        return await conn.execute_fetchall("SELECT * FROM r WHERE key = 'k0'")

    await first(0)
    return Session(first, replay, conn.close)


async def open_aiosqlite_statements(storage: Storage, prefix: str) -> Session:
    """The floor's two aiosqlite statements, but Dataoad's: its table, claim and record SQL.

    The values are encoded once (only the ids change), and nothing of the
    ledger runs: no look-up, writer lock, clock or receipt. Divided by the
    plain two-statement floor, it is what Dataoad's table and statements
    cost (a wider row, three indexes, conditional SQL); Dataoad divided by
    it is what the ledger's and the runner's work add. Replay: the
    ledger's own look-up by key.
    """
    from benchmarks._concurrency import encoded_once, sqlite_statements_table
    from dataoad.ledgers.sqlite import _SQL

    path = await sqlite_statements_table(storage, prefix)
    conn = await aiosqlite.connect(path, isolation_level=None)
    await conn.execute(f"PRAGMA synchronous={storage.synchronous}")
    claim_sql, record_sql, find = _SQL["claim"].sql, _SQL["record"].sql, _SQL["find"]
    arguments = encoded_once(prefix)
    held = find.bind({"namespace": "", "action_name": "charge", "idempotency_key": f"{prefix}k0"})

    async def first(n: int) -> None:
        claimed, recorded = arguments(n)
        if not await conn.execute_fetchall(claim_sql, claimed):
            raise RuntimeError(f"the claim of a fresh key was not created: call {n}")
        await _noop()
        if not await conn.execute_fetchall(record_sql, recorded):
            raise RuntimeError("the completion of a fresh claim was refused")

    async def replay(n: int) -> Any:
        _hash()
        return await conn.execute_fetchall(find.sql, held)

    await first(0)
    return Session(first, replay, conn.close)


async def open_asyncpg_floor(storage: Storage, prefix: str) -> Session:
    """Three statements on one asyncpg connection (replay: one SELECT by key)."""
    import asyncpg

    assert storage.dsn is not None
    conn = await asyncpg.connect(storage.dsn)
    table = f"floor_{uuid.uuid4().hex[:12]}"
    await conn.execute(
        f"CREATE TABLE {table} (id text PRIMARY KEY, key text UNIQUE, version int,"
        " attempts int, state text, body text)"
    )

    async def first(n: int) -> None:
        action_id = uuid.uuid4().hex
        body = json.dumps({"request_hash": _hash()})
        await conn.execute(
            f"INSERT INTO {table} VALUES ($1, $2, 1, 0, 'PENDING', $3) ON CONFLICT DO NOTHING",
            action_id,
            f"k{n}",
            body,
        )
        await conn.execute(
            f"UPDATE {table} SET version = 2, attempts = 1 WHERE id = $1 AND version = 1",
            action_id,
        )
        await _noop()
        await conn.execute(
            f"UPDATE {table} SET version = 3, state = 'COMPLETED' WHERE id = $1 AND version = 2",
            action_id,
        )

    async def replay(n: int) -> Any:
        _hash()
        return await conn.fetch(f"SELECT * FROM {table} WHERE key = 'k0'")

    async def close() -> None:
        await conn.execute(f"DROP TABLE {table}")
        await conn.close()

    await first(0)
    return Session(first, replay, close)


# -- the run -------------------------------------------------------------------------------


def configurations(storage: str, peers: bool) -> dict[str, Opener | str]:
    """What runs on ``storage``: floors, Dataoad, and (with ``peers``) each peer or why not."""
    kind = storage.split()[0]
    found: dict[str, Opener | str] = {}
    if kind == "memory":
        found["floor"] = open_memory_floor
    elif kind == "sqlite":
        found["floor"] = open_sqlite3_floor
        found["aiosqlite floor"] = open_aiosqlite_floor
        found["Dataoad's statements, aiosqlite"] = open_aiosqlite_statements
    else:
        found["floor"] = open_asyncpg_floor
    found["Dataoad"] = open_dataoad
    if kind == "memory":

        async def sync_op(s: Storage, p: str) -> Session:
            return await open_dataoad(s, p, sync_operation=True)

        found["Dataoad, sync operation"] = sync_op
        found["Dataoad, no runner layers"] = open_no_layers
    if not peers:
        return found
    probe = Storage(kind, Path("."), synchronous=storage.split()[-1], dsn="postgresql://")
    for name in PEERS:
        peer = load(name)
        if isinstance(peer, str):
            found[name] = peer
        elif (why := peer.unsupported(probe)) is not None:
            found[name] = f"not measured: {why}"
        else:
            found[name] = peer.open
    return found


async def _time(step: Callable[[int], Awaitable[Any]], start: int, count: int) -> float:
    samples = []
    for n in range(start, start + count):
        began = time.perf_counter()
        await step(n)
        samples.append(time.perf_counter() - began)
    return statistics.median(samples) * 1e6


async def _one(opener: Opener, storage: Storage, prefix: str, count: int) -> tuple[float, float]:
    session = await opener(storage, prefix)
    try:
        warm = max(5, count // 10)
        await _time(session.first, 1, warm)
        await _time(session.replay, 0, warm)
        first = await _time(session.first, 1 + warm, count)
        replay = await _time(session.replay, 0, count)
        return first, replay
    finally:
        await session.close()


async def run_calls(
    count: int, rounds: int, peers: bool, dsn: str | None, results: dict[str, Any]
) -> dict[str, dict[str, dict[str, float] | str]]:
    """Medians (µs) of first calls and replays per storage and configuration."""
    figures: dict[str, dict[str, dict[str, float] | str]] = {}
    samples: dict[tuple[str, str], list[tuple[float, float]]] = {}
    with tempfile.TemporaryDirectory() as folder:
        plans = {}
        for storage in STORAGES:
            if storage == "postgres" and dsn is None:
                continue
            plans[storage] = configurations(storage, peers)
        for round_number in range(rounds):
            for storage, plan in plans.items():
                kind, _, sync = storage.partition(" ")
                where = Path(folder) / f"r{round_number}-{kind}-{sync}"
                where.mkdir(exist_ok=True)
                place = Storage(kind, where, synchronous=sync or None, dsn=dsn)
                for name, opener in plan.items():
                    if isinstance(opener, str):
                        continue
                    prefix = f"r{round_number}{uuid.uuid4().hex[:6]}-"
                    try:
                        samples.setdefault((storage, name), []).append(
                            await _one(opener, place, prefix, count)
                        )
                    except Exception as exc:  # a peer that breaks is reported, not fatal
                        plan[name] = f"failed: {type(exc).__name__}: {exc}"[:200]
        for storage, plan in plans.items():
            figures[storage] = {}
            for name, opener in plan.items():
                taken = samples.get((storage, name), [])
                if isinstance(opener, str) or not taken:
                    figures[storage][name] = opener if isinstance(opener, str) else "no sample"
                    continue
                figures[storage][name] = {
                    "first_us": statistics.median(f for f, _ in taken),
                    "replay_us": statistics.median(r for _, r in taken),
                    "rounds": len(taken),
                }
                results[f"{storage}: {name}"] = {
                    k: round(v, 1) if isinstance(v, float) else v
                    for k, v in figures[storage][name].items()  # type: ignore[union-attr]
                }
    return figures


# -- goals ---------------------------------------------------------------------------------


async def operation_counts() -> dict[str, int]:
    """Ledger writes and reads of a first call, a retry and a replay (in memory)."""
    from dataoad import DefinitiveFailure, RetryPolicy
    from dataoad.testing import FaultyLedger

    writes = ("claim", "start_attempt", "record", "release", "take_over", "retire")
    counted = FaultyLedger(InMemoryLedger())  # no fault injected: it records the calls
    runner = ActionRunner(counted)
    await runner.execute("charge", _noop, request=REQUEST, idempotency_key="first")
    first = list(counted.calls)
    counted.calls.clear()
    await runner.execute("charge", _noop, request=REQUEST, idempotency_key="first")
    replay = list(counted.calls)
    counted.calls.clear()
    failures = iter([True])

    async def declines_once() -> None:
        if next(failures, False):
            raise DefinitiveFailure("declined before processing", retryable=True)

    policy = RetryPolicy(max_attempts=2, retry_on_failed=True)
    await runner.execute(
        "charge", declines_once, request=REQUEST, idempotency_key="retry", policy=policy
    )
    retried = list(counted.calls)
    # A replay's one call is the claim finding the key held: a read, never a write.
    replay_writes = sum(c in writes for c in replay) - replay.count("claim")
    return {
        "commits per first call (goal <= 2)": sum(c in writes for c in first),
        "commits added by a retry (goal <= 1)": sum(c in writes for c in retried)
        - sum(c in writes for c in first),
        "writes per replay (goal <= 0)": replay_writes,
        "ledger calls per replay (goal <= 1)": len(replay),
    }


def _ratio(a: Any, b: Any, which: str) -> float | str:
    if isinstance(a, str):
        return f"not measured: {a}"
    if isinstance(b, str):
        return f"not measured: {b}"
    return float(a[which]) / float(b[which])


_FIRST, _REPLAY = "first_us", "replay_us"
#: Each storage's goal ratios: (what Dataoad is divided by, the figure, the label).
_GOALS: Final[dict[str, tuple[tuple[str, str, str], ...]]] = {
    "memory": (
        ("floor", _FIRST, "first call / floor (goal <= 2.5)"),
        ("Powertools", _FIRST, "first call / Powertools (goal <= 0.5)"),
        ("floor", _REPLAY, "replay / floor (goal <= 1.5)"),
        # #40's goals, beside the older ones above.
        ("Powertools", _FIRST, "first call / Powertools dict layer, #40 (goal <= 1.0)"),
        ("floor", _FIRST, "first call / floor, #40 (goal <= 4.0)"),
        ("Powertools", _REPLAY, "replay / Powertools dict layer, #40 (goal <= 1.0)"),
    ),
    "sqlite FULL": (
        ("floor", _FIRST, "first call / three sqlite3 statements (goal <= 1.0)"),
        ("Powertools", _FIRST, "first call / Powertools sqlite3 layer (goal <= 1.2)"),
        # #41's one-caller goals, beside the older ones.
        ("aiosqlite floor", _FIRST, "first call / two aiosqlite statements, #41 (goal <= 1.25)"),
    ),
    "sqlite NORMAL": (
        ("aiosqlite floor", _FIRST, "first call / two aiosqlite statements (goal <= 1.2)"),
        ("floor", _FIRST, "first call / three inline sqlite3 statements"),
        ("aiosqlite floor", _FIRST, "first call / two aiosqlite statements, #41 (goal <= 2.0)"),
    ),
    "postgres": (
        ("floor", _FIRST, "first call / three asyncpg statements (goal <= 1.0)"),
        ("idemkit", _FIRST, "first call / idemkit (goal <= 0.6)"),
        ("Powertools", _FIRST, "first call / Powertools psycopg layer (goal <= 1.0)"),
        ("floor", _REPLAY, "replay / one asyncpg SELECT (goal <= 2.0)"),
        ("floor", _REPLAY, "replay / one asyncpg SELECT, #41 (goal <= 2.5)"),
    ),
}


def call_goals(figures: dict[str, dict[str, dict[str, float] | str]]) -> dict[str, float | str]:
    """Every ratio the performance goals state (named with their goal), and each peer's."""
    ratios: dict[str, float | str] = {}
    missing = "not measured: no PostgreSQL server"
    for storage in STORAGES:
        row = figures.get(storage, {})
        dataoad = row.get("Dataoad", missing if storage == "postgres" else "no sample")

        def against(name: str, row: Any = row) -> Any:
            return row.get(name, "not measured (no --peers)")

        for divisor, figure, label in _GOALS[storage]:
            ratios[f"{storage}: {label}"] = _ratio(dataoad, against(divisor), figure)
        if storage == "memory":
            sync = against("Dataoad, sync operation")
            if not isinstance(sync, str) and not isinstance(dataoad, str):
                ratios["memory: thread hop of a sync operation, us"] = (
                    sync["first_us"] - dataoad["first_us"]
                )
            # #40's route: a runner with no layers stands on what this measures.
            bare = against("Dataoad, no runner layers")
            ratios["memory: first call with no runner layers / Powertools dict layer, #40"] = (
                _ratio(bare, against("Powertools"), _FIRST)
            )
            ratios["memory: first call / first call with no runner layers"] = _ratio(
                dataoad, bare, _FIRST
            )
            ratios["memory: replay with no runner layers / Powertools dict layer, #40"] = _ratio(
                bare, against("Powertools"), _REPLAY
            )
        if storage.startswith("sqlite"):
            # #41's one-caller goal: the share of Dataoad's table and SQL, and the rest.
            own = against("Dataoad's statements, aiosqlite")
            ratios[f"{storage}: Dataoad's statements via aiosqlite / two aiosqlite statements"] = (
                _ratio(own, against("aiosqlite floor"), _FIRST)
            )
            ratios[f"{storage}: first call / Dataoad's statements via aiosqlite"] = _ratio(
                dataoad, own, _FIRST
            )
        for name in PEERS:
            peer = row.get(name)
            if peer is None or (isinstance(peer, str) and peer.startswith("not measured")):
                continue
            goal = " (goal >= 3.0)" if name in ("agent-runtime-governance", "DBOS") else ""
            ratios[f"{storage}: {name} first call / Dataoad{goal}"] = _ratio(
                peer, dataoad, "first_us"
            )
            ratios[f"{storage}: {name} replay / Dataoad"] = _ratio(peer, dataoad, "replay_us")
    return ratios
