"""agent-runtime-governance 0.9.1: a ``Runtime`` tool in ``ExecutionMode.IDEMPOTENT``.

Only an IDEMPOTENT tool goes through the idempotency store (a MUTATING one,
the default mode, is never deduplicated); its key comes with the call in
``InvocationOptions(idempotency_key=...)``. The stores are
``InMemoryIdempotencyStore`` (the default) and ``SQLiteIdempotencyStore``;
there is no PostgreSQL store. Defaults otherwise: an empty pipeline and
``RuntimeLimits()``.

No approval, identity or signing set-up is needed: ``Runtime.tool`` defaults
to ``requires_approval=False`` and risk LOW, and with an empty pipeline the
runtime allows the call without a decision provider.
"""

from __future__ import annotations

import asyncio
import sqlite3
from typing import Any

# The package has no py.typed marker, so everything imported from it is Any.
from agent_runtime_governance import (  # type: ignore[import-untyped]
    ExecutionMode,
    InMemoryIdempotencyStore,
    InvocationOptions,
    Runtime,
    SQLiteIdempotencyStore,
    sqlite_wal_is_safe,
)

from benchmarks.peers import REQUEST, Peer, Session, Storage

__all__ = ["PEER"]

PROMISE = (
    "A first call commits twice on SQLite (the pending claim inserted under BEGIN IMMEDIATE, then"
    " its UPDATE to completed), each on a fresh connection in a worker thread, and writes nothing"
    " durable in memory; a duplicate takes the write lock, reads the completed row and returns"
    " its stored result without writing. A tool that times out (a TimeoutError, the runtime's own"
    " 30 s limit included) or is cancelled is recorded UNKNOWN and later calls with the key fail"
    " with IdempotencyOutcomeUnknownError, while any other exception deletes the claim, so the"
    " next call runs the tool again."
)


class _Governance:
    """The agent-runtime-governance peer; ``noop_runs`` counts every run of the no-op."""

    name = "agent-runtime-governance"
    promise = PROMISE

    def __init__(self) -> None:
        self.noop_runs = 0

    def unsupported(self, storage: Storage) -> str | None:
        """Why the runtime cannot run on ``storage`` with the same durability (None: it can)."""
        if storage.kind == "memory":
            return None
        if storage.kind == "sqlite":
            if storage.synchronous != "FULL":
                return (
                    f"synchronous={storage.synchronous} cannot be set: SQLiteIdempotencyStore"
                    " opens a connection per operation and sets PRAGMA synchronous=FULL on each"
                    " (_sqlite.connect_sqlite), with no hook"
                )
            if not sqlite_wal_is_safe():
                return (
                    f"journal_mode=WAL refused on SQLite {sqlite3.sqlite_version}:"
                    " SQLiteIdempotencyStore allows WAL only on 3.44.6-3.44.x, 3.50.7-3.50.x or"
                    " 3.51.3 and later (WAL-reset race) and would run in DELETE mode"
                )
            return None
        if storage.kind == "postgres":
            return (
                "no PostgreSQL store (agent-runtime-governance 0.9.1 has in-memory and SQLite"
                " ones; its roadmap defers PostgreSQL)"
            )
        return f"no {storage.kind} store"

    async def open(self, storage: Storage, prefix: str) -> Session:
        """A fresh runtime and IDEMPOTENT no-op tool, with one key (``{prefix}done``) completed."""
        if why := self.unsupported(storage):
            raise ValueError(why)
        if storage.kind == "sqlite":
            # The constructor creates the schema on a blocking connection.
            store = await asyncio.to_thread(
                SQLiteIdempotencyStore,
                storage.folder / "governance.sqlite3",
                journal_mode="wal",
            )
        else:
            store = InMemoryIdempotencyStore()
        runtime = Runtime(idempotency_store=store)

        async def noop(customer_id: str, amount_cents: int, currency: str) -> None:
            self.noop_runs += 1

        tool = runtime.tool(name="charge", execution_mode=ExecutionMode.IDEMPOTENT)(noop)

        async def call(key: str) -> Any:
            return await tool.ainvoke(**REQUEST, _governance=InvocationOptions(idempotency_key=key))

        async def close() -> None:
            await runtime.aclose()

        completed = f"{prefix}done"
        before = self.noop_runs
        try:
            await call(completed)
            if self.noop_runs != before + 1:
                raise RuntimeError("agent-runtime-governance did not run the no-op for a fresh key")
        except BaseException:
            await close()
            raise

        # The counter checks cost nanoseconds and prove each step did what it is measured for.
        async def first(n: int) -> Any:
            before = self.noop_runs
            result = await call(f"{prefix}k{n}")
            if self.noop_runs != before + 1:
                raise RuntimeError(
                    f"agent-runtime-governance did not run the no-op once for key {prefix}k{n}"
                )
            return result

        async def replay(n: int) -> Any:
            before = self.noop_runs
            result = await call(completed)
            if self.noop_runs != before:
                raise RuntimeError(
                    "agent-runtime-governance ran the no-op again for a completed key"
                )
            return result

        return Session(first=first, replay=replay, close=close)


PEER: Peer = _Governance()
