"""What a planted bug is: a broken rule, how to plant it, who must report it."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import pytest

from dataoad import InMemoryLedger

__all__ = ["PlantedBug", "ReleasesStartedClaimsLedger", "names"]


@dataclasses.dataclass(frozen=True)
class PlantedBug:
    """A broken rule, how to plant it, and which properties must report it."""

    name: str
    trigger: str
    machine: str  # runner | ledger | merge | group | shared (the runner on one SQLite connection)
    expected: frozenset[str]
    plant: Callable[[pytest.MonkeyPatch], dict[str, Any]]
    #: The runner machine's backend when the bug exists on one only (None: any).
    backend: str | None = None


def names(*invariants: str) -> frozenset[str]:
    """The properties of which one must report a bug."""
    return frozenset(invariants)


class ReleasesStartedClaimsLedger(InMemoryLedger):
    """Releases any PENDING claim, whatever its attempts or version (shared by two bugs)."""

    async def release(self, action_id: str, version: int) -> bool:
        with self._lock:
            current = self._by_id.get(action_id)
            if current is None or not current.is_pending:
                return False
            del self._by_id[action_id]
            del self._by_key[(current.namespace, current.action_name, current.idempotency_key)]
            return True
