"""The abstract world: which external effects exist, and which may still appear."""

from __future__ import annotations

import dataclasses
import itertools


@dataclasses.dataclass
class World:
    """Effects per provider reference, requests in flight, and fences.

    A request carries its reference and the attempt number that sent it.
    A request in flight has reached the provider without committing; it may
    commit later. Fencing a reference up to attempt ``n`` makes every request
    of attempts ``<= n`` terminal: in flight or not yet sent, it can never
    commit. That is what a verifier must establish before it may call an
    absence retry-safe.
    """

    effects: dict[str, list[str]] = dataclasses.field(default_factory=dict)
    in_flight: dict[str, list[tuple[str, int]]] = dataclasses.field(default_factory=dict)
    fenced_upto: dict[str, int] = dataclasses.field(default_factory=dict)
    #: A provider that ignores fencing tokens: ``fence`` changes nothing, so
    #: no request is ever refused and no truthful absence is retry-safe.
    honours_fencing: bool = True
    _ids: itertools.count[int] = dataclasses.field(default_factory=lambda: itertools.count(1))

    def is_fenced(self, reference: str, attempt: int) -> bool:
        """Whether requests of this attempt for the reference are refused."""
        return attempt <= self.fenced_upto.get(reference, 0)

    def commit(self, reference: str, attempt: int) -> str | None:
        """The request commits now; None if the provider refuses it as fenced."""
        if self.is_fenced(reference, attempt):
            return None
        effect = f"eff_{next(self._ids)}"
        self.effects.setdefault(reference, []).append(effect)
        return effect

    def send_in_flight(self, reference: str, attempt: int) -> bool:
        """The request reaches the provider without committing yet (False if fenced)."""
        if self.is_fenced(reference, attempt):
            return False
        self.in_flight.setdefault(reference, []).append((f"req_{next(self._ids)}", attempt))
        return True

    def commit_in_flight(self, reference: str) -> int:
        """Every in-flight request for the reference commits (a slow provider)."""
        pending = self.in_flight.pop(reference, [])
        for request, _ in pending:
            self.effects.setdefault(reference, []).append(request)
        return len(pending)

    def drop_in_flight(self, reference: str) -> int:
        """The provider gives up on in-flight requests: they never commit."""
        return len(self.in_flight.pop(reference, []))

    def fence(self, reference: str, upto_attempt: int) -> int:
        """Refuse, now and forever, every request of attempts up to ``upto_attempt``."""
        if not self.honours_fencing:
            return 0
        self.fenced_upto[reference] = max(self.fenced_upto.get(reference, 0), upto_attempt)
        before = self.in_flight.get(reference, [])
        kept = [(r, a) for r, a in before if a > upto_attempt]
        if kept:
            self.in_flight[reference] = kept
        else:
            self.in_flight.pop(reference, None)
        return len(before) - len(kept)

    def holds(self, reference: str) -> bool:
        """Whether at least one effect exists for the reference."""
        return bool(self.effects.get(reference))

    def count(self, reference: str) -> int:
        """How many effects exist for the reference."""
        return len(self.effects.get(reference, ()))

    def may_appear_later(self, reference: str) -> bool:
        """Whether an effect for the reference can still commit from a request in flight."""
        return bool(self.in_flight.get(reference))
