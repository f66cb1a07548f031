"""Peers: the libraries users would pick instead, each doing its equivalent of one guarded call.

Every peer runs the workload Dataoad runs in ``benchmarks``: a no-op
operation guarded by an idempotency key (a fresh key per first call, a
completed key for a replay), with the same request, on the same storage
with the same durability settings. A peer that is not installed (the
``bench`` extra) or does not support a storage says why instead of a
figure. Nothing here is imported by the library or its tests.
"""

from __future__ import annotations

import dataclasses
import importlib
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, Protocol

__all__ = ["PEERS", "REQUEST", "Peer", "Session", "Step", "Storage", "load"]

#: The request every library guards (the same as Dataoad's benchmark request).
REQUEST: dict[str, Any] = {"customer_id": "customer_123", "amount_cents": 2_500, "currency": "EUR"}

Step = Callable[[int], Awaitable[Any]]


@dataclasses.dataclass(frozen=True)
class Storage:
    """Where a peer keeps its records, with the durability Dataoad gets in the same run."""

    #: "memory", "sqlite" or "postgres".
    kind: str
    #: A fresh private folder for any file the peer needs (its SQLite database lives here).
    folder: Path
    #: For "sqlite": "FULL" or "NORMAL", with journal_mode=WAL.
    synchronous: str | None = None
    #: For "postgres": a libpq URL of a database the peer may create tables in.
    dsn: str | None = None


@dataclasses.dataclass
class Session:
    """One opened peer: its two calls and how to close it."""

    #: A first call: guard the no-op under a key never used before (built from ``n``).
    first: Step
    #: A replay: the same call again for a key already completed; the no-op must not run.
    replay: Step
    close: Callable[[], Awaitable[None]]


class Peer(Protocol):
    """A library measured beside Dataoad."""

    name: str
    #: For the README: writes per first call and what a timeout after commit leads to.
    promise: str

    def unsupported(self, storage: Storage) -> str | None:
        """Why this peer cannot run on ``storage`` (None: it can)."""
        ...

    async def open(self, storage: Storage, prefix: str) -> Session:
        """Open the peer on ``storage``; every key it uses starts with ``prefix``."""
        ...


#: Module (under ``benchmarks.peers``) of each peer, in the order they are reported.
PEERS: dict[str, str] = {
    "Powertools": "_powertools",
    "idemkit": "_idemkit",
    "agent-runtime-governance": "_governance",
    "DBOS": "_dbos",
}


def load(name: str) -> Peer | str:
    """The peer called ``name``, or why it cannot be loaded (its library is not installed)."""
    try:
        module = importlib.import_module(f"benchmarks.peers.{PEERS[name]}")
    except ImportError as exc:
        return f"not installed ({exc}); pip install -e '.[bench]'"
    peer: Peer = module.PEER
    return peer
