"""The abstract world: which external effects exist, and which may still appear."""

from __future__ import annotations

import dataclasses
import itertools


@dataclasses.dataclass
class World:
    """Effects per provider reference, requests still in flight, fenced references.

    A request in flight has reached the provider but not committed; it may
    commit later unless its reference is fenced (made terminal).
    """

    effects: dict[str, list[str]] = dataclasses.field(default_factory=dict)
    in_flight: dict[str, list[str]] = dataclasses.field(default_factory=dict)
    fenced: set[str] = dataclasses.field(default_factory=set)
    _ids: itertools.count[int] = dataclasses.field(default_factory=lambda: itertools.count(1))

    def commit(self, reference: str) -> str:
        """An effect happens now; returns its provider request id."""
        effect = f"eff_{next(self._ids)}"
        self.effects.setdefault(reference, []).append(effect)
        return effect

    def send_in_flight(self, reference: str) -> str:
        """A request reaches the provider without committing yet."""
        request = f"req_{next(self._ids)}"
        if reference in self.fenced:
            return request  # a fenced reference accepts nothing new
        self.in_flight.setdefault(reference, []).append(request)
        return request

    def commit_in_flight(self, reference: str) -> int:
        """Every in-flight request for the reference commits (a slow provider)."""
        pending = self.in_flight.pop(reference, [])
        for request in pending:
            self.effects.setdefault(reference, []).append(request)
        return len(pending)

    def fence(self, reference: str) -> int:
        """In-flight requests for the reference become terminal: they never commit."""
        dropped = len(self.in_flight.pop(reference, []))
        self.fenced.add(reference)
        return dropped

    def holds(self, reference: str) -> bool:
        """Whether at least one effect exists for the reference."""
        return bool(self.effects.get(reference))

    def count(self, reference: str) -> int:
        """How many effects exist for the reference."""
        return len(self.effects.get(reference, ()))

    def may_appear_later(self, reference: str) -> bool:
        """Whether an effect for the reference can still commit."""
        return bool(self.in_flight.get(reference))
