"""What a planted bug is: a broken rule, how to plant it, who must report it."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import pytest

__all__ = ["PlantedBug", "names"]


@dataclasses.dataclass(frozen=True)
class PlantedBug:
    """A broken rule, how to plant it, and which properties must report it."""

    name: str
    trigger: str
    machine: str  # runner | ledger | merge
    expected: frozenset[str]
    plant: Callable[[pytest.MonkeyPatch], dict[str, Any]]
    #: The runner machine's backend when the bug exists on one only (None: any).
    backend: str | None = None


def names(*invariants: str) -> frozenset[str]:
    """The properties of which one must report a bug."""
    return frozenset(invariants)
