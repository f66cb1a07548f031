"""idemkit 1.0.2: its function decorator ``idempotent`` with an explicit ``idempotency_key``.

The method surface (``idemkit.adapters.ai``) is idemkit's guard for one
function call: claim the key, run the function while a heartbeat renews the
lease, store its JSON result, replay that result to a duplicate. It runs on
``InMemoryBackend`` or ``PostgresBackend`` (asyncpg); idemkit has no SQLite
backend. Defaults otherwise (``MethodConfig()``: 60 s lease, no
``validation_fingerprint``, so a key is not checked against the request).
"""

from __future__ import annotations

import importlib.util
import uuid
import warnings
from typing import Any

from idemkit.adapters.ai import idempotent
from idemkit.backends.memory import InMemoryBackend
from idemkit.backends.postgres import PostgresBackend, init_pg

from benchmarks.peers import REQUEST, Peer, Session, Storage

__all__ = ["PEER"]

PROMISE = (
    "A first call makes two durable writes on PostgreSQL (the claim's INSERT, then the fenced"
    " UPDATE to COMPLETED with its pg_notify in one transaction) and none in memory; a duplicate"
    " runs the claim's INSERT ... ON CONFLICT DO NOTHING, two conditional UPDATEs that match"
    " nothing and a SELECT, and replays the stored JSON result. An operation that raises or times"
    " out after its effect committed has its claim deleted, so the next call with the key runs it"
    " again: nothing is recorded as unknown."
)


class _Idemkit:
    """The idemkit peer; ``noop_runs`` counts every run of the guarded no-op, across sessions."""

    name = "idemkit"
    promise = PROMISE

    def __init__(self) -> None:
        self.noop_runs = 0

    def unsupported(self, storage: Storage) -> str | None:
        """Why idemkit cannot run on ``storage`` (None: it can)."""
        if storage.kind == "memory":
            return None
        if storage.kind == "sqlite":
            return (
                "no SQLite backend (idemkit 1.0.2 ships memory, Redis, PostgreSQL, MongoDB"
                " and DynamoDB ones)"
            )
        if storage.kind == "postgres":
            if storage.dsn is None:
                return "no PostgreSQL DSN"
            if importlib.util.find_spec("asyncpg") is None:
                return "asyncpg is not installed; pip install 'idemkit[postgres]'"
            return None
        return f"no {storage.kind} backend"

    async def open(self, storage: Storage, prefix: str) -> Session:
        """A guarded no-op on a fresh backend, with one key (``{prefix}done``) already completed."""
        if why := self.unsupported(storage):
            raise ValueError(why)
        table: str | None = None
        backend: InMemoryBackend | PostgresBackend
        if storage.kind == "postgres" and storage.dsn is not None:
            # A table of its own per session, 40 characters: idemkit accepts at most
            # 46 so that its index names fit PostgreSQL's 63.
            table = f"idemkit_{uuid.uuid4().hex}"
            # from_url checks on first use that the table exists; init_pg is what
            # idemkit's documented `idemkit init-pg` runs.
            await init_pg(storage.dsn, table=table)
            backend = PostgresBackend.from_url(storage.dsn, table=table)
        else:
            backend = InMemoryBackend()

        async def close() -> None:
            await backend.aclose()
            if storage.dsn is not None and table is not None:
                import asyncpg

                conn = await asyncpg.connect(storage.dsn)
                try:
                    await conn.execute(f"DROP TABLE IF EXISTS {table}")
                finally:
                    await conn.close()

        async def noop(customer_id: str, amount_cents: int, currency: str) -> None:
            self.noop_runs += 1

        # Without a `scope` idemkit runs single-tenant, which is this benchmark's
        # case; it says so in a UserWarning at every decoration (every session).
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=r"idemkit: tool .* has no scope")
            guarded = idempotent(backend=backend)(noop)

        async def call(key: str) -> Any:
            return await guarded(**REQUEST, idempotency_key=key)

        completed = f"{prefix}done"
        before = self.noop_runs
        try:
            await call(completed)
            if self.noop_runs != before + 1:
                raise RuntimeError("idemkit did not run the no-op for a fresh key")
        except BaseException:
            await close()
            raise

        # The counter checks cost nanoseconds and prove each step did what it is measured for.
        async def first(n: int) -> Any:
            before = self.noop_runs
            result = await call(f"{prefix}k{n}")
            if self.noop_runs != before + 1:
                raise RuntimeError(f"idemkit did not run the no-op once for key {prefix}k{n}")
            return result

        async def replay(n: int) -> Any:
            before = self.noop_runs
            result = await call(completed)
            if self.noop_runs != before:
                raise RuntimeError("idemkit ran the no-op again for a completed key")
            return result

        return Session(first=first, replay=replay, close=close)


PEER: Peer = _Idemkit()
