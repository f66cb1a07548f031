"""Powertools for AWS Lambda (Python): its idempotency utility around the no-op.

``idempotent_function`` with Powertools' defaults (no local cache, no payload
validation, md5 key hash), keyed by the request's ``idempotency_key`` through
``event_key_jmespath``, on the local persistence layers of
``_powertools_layers`` (Powertools ships none). Powertools is synchronous: each
step calls the decorated function inline and blocks the event loop for the
whole call, which is what an asyncio caller of Powertools gets.

No Lambda context is registered: outside Lambda there is none, and Powertools
does not need one (``save_inprogress`` then stores no in-progress expiry and
warns).
"""

from __future__ import annotations

import importlib.util
import sqlite3
import uuid
import warnings
from typing import Any

from aws_lambda_powertools.utilities.idempotency import IdempotencyConfig, idempotent_function

from benchmarks.peers import REQUEST, Peer, Session, Storage
from benchmarks.peers._powertools_layers import (
    DictPersistenceLayer,
    LocalPersistenceLayer,
    PostgresPersistenceLayer,
    SQLitePersistenceLayer,
)

__all__ = ["PEER"]

PROMISE = (
    "A first call makes 2 writes (a conditional put of an INPROGRESS record, then an update to"
    " COMPLETED with the response); a duplicate makes 1 conditional put that fails and hands back"
    " the stored record (DynamoDB returns it with the failure; the SQL layers here read it with 1"
    " SELECT), and a function that raises, even after its effect committed, has its record"
    " deleted, so a retry runs it again. A timeout leaves the record INPROGRESS and retries are"
    " refused until its in-progress expiry (the Lambda deadline, or the 1-hour record expiry when"
    " no Lambda context is registered, as here), after which a retry runs the function again."
)

_LAYERS = ("memory", "sqlite", "postgres")


class _Powertools:
    """The Powertools peer; ``noop_runs`` counts every run of the guarded no-op, across sessions."""

    name = "Powertools"
    promise = PROMISE

    def __init__(self) -> None:
        self.noop_runs = 0

    def unsupported(self, storage: Storage) -> str | None:
        """Why Powertools cannot run on ``storage`` (None: it can)."""
        if storage.kind not in _LAYERS:
            return f"no {storage.kind} persistence layer"
        if storage.kind == "sqlite" and sqlite3.sqlite_version_info < (3, 35):
            return f"SQLite {sqlite3.sqlite_version} has no RETURNING (3.35+)"
        if storage.kind == "postgres":
            if storage.dsn is None:
                return "no PostgreSQL DSN"
            if importlib.util.find_spec("psycopg") is None:
                return "psycopg is not installed; pip install 'psycopg[binary]'"
        return None

    async def open(self, storage: Storage, prefix: str) -> Session:
        """A guarded no-op on ``storage``, with one key (``{prefix}done``) already completed."""
        layer = _layer(storage)
        # Without a Lambda context, save_inprogress warns on every first call; under
        # warnings-as-errors that warning would surface as IdempotencyPersistenceLayerError.
        warnings.filterwarnings(
            "ignore",
            message="Couldn't determine the remaining time left",
            category=UserWarning,
            module=r"aws_lambda_powertools\.utilities\.idempotency\.base",
        )

        def noop(*, request: dict[str, Any]) -> None:
            self.noop_runs += 1

        # key_prefix replaces the function name in stored keys, so those start with prefix too.
        guarded = idempotent_function(
            noop,
            data_keyword_argument="request",
            persistence_store=layer,
            config=IdempotencyConfig(event_key_jmespath="idempotency_key"),
            key_prefix=prefix,
        )
        completed = {**REQUEST, "idempotency_key": f"{prefix}done"}
        before = self.noop_runs
        guarded(request=completed)
        if self.noop_runs != before + 1:
            layer.close()
            raise RuntimeError("Powertools did not run the no-op for a fresh key")

        # The counter checks cost nanoseconds and prove each step did what it is measured for.
        async def first(n: int) -> None:
            before = self.noop_runs
            guarded(request={**REQUEST, "idempotency_key": f"{prefix}k{n}"})
            if self.noop_runs != before + 1:
                raise RuntimeError(f"Powertools did not run the no-op once for key {prefix}k{n}")

        async def replay(n: int) -> None:
            before = self.noop_runs
            guarded(request=completed)
            if self.noop_runs != before:
                raise RuntimeError("Powertools ran the no-op again for a completed key")

        async def close() -> None:
            layer.close()

        return Session(first=first, replay=replay, close=close)


def _layer(storage: Storage) -> LocalPersistenceLayer:
    """A fresh persistence layer on ``storage``."""
    if storage.kind == "memory":
        return DictPersistenceLayer()
    if storage.kind == "sqlite":
        return SQLitePersistenceLayer(
            storage.folder / "powertools.sqlite3", storage.synchronous or "FULL"
        )
    if storage.kind == "postgres" and storage.dsn is not None:
        # A table of its own per session: the prefix may not be a valid identifier.
        return PostgresPersistenceLayer(storage.dsn, f"powertools_idempotency_{uuid.uuid4().hex}")
    raise ValueError(f"Powertools has no persistence layer for {storage.kind!r} storage")


PEER: Peer = _Powertools()
