"""Bounded exhaustive exploration, for the abstract protocol and for the real runner.

The search is a depth-first walk over every choice a scenario allows: which
contender starts next, which parked contender passes its next gate and
what happens there (every provider fault, ledger fault and verifier
answer), which contender crashes, and when an in-flight request lands or
is given up. After every step the same safety and progress properties as
the state machines are checked. A state already explored with at least as
many steps left is not explored again.

Systems under exploration implement a small interface (``Explorable``):
``actions()``, ``apply(action)``, ``check()``, ``signature()``, ``trace()``
and ``close()``. They cannot be copied (the real one holds live asyncio
tasks), so the walker rebuilds a path by replaying its actions from a fresh
system; the first child of each state continues on the live one.
"""

from __future__ import annotations

import contextlib
import dataclasses
import time
from collections.abc import Callable, Hashable, Sequence
from typing import Protocol

__all__ = [
    "ContenderPlan",
    "ExplorationResult",
    "Explorable",
    "Violation",
    "explore",
    "report",
    "report_total",
]


@dataclasses.dataclass(frozen=True)
class ContenderPlan:
    """One contender of a scenario: an execute, or an operator's recovery."""

    key: str
    kind: str = "execute"  # execute | reconcile | recover | release | expire | reopen
    policy: str = "default"  # default | retry-failed | retry-unknown (escape hatch)
    with_verifier: bool = True
    wait: str = "no wait"  # how long a duplicate waits for the claim holder (virtual time)
    form: str = "as built"  # how the request is written: as built, keys reversed, amount as float

    def __str__(self) -> str:
        if self.kind != "execute":
            return f"{self.kind} {self.key}"
        verifier = "verifier" if self.with_verifier else "no verifier"
        return f"execute {self.key} ({self.policy}, {verifier})"


class Explorable(Protocol):
    """One run of a system under exploration."""

    def actions(self) -> Sequence[Hashable]:
        """Every action enabled in the current state, in a stable order."""
        ...

    def apply(self, action: Hashable) -> None:
        """Take one action."""
        ...

    def check(self) -> None:
        """Raise Violation if a property does not hold in the current state."""
        ...

    def signature(self) -> Hashable:
        """Everything the future of this run depends on, and nothing else."""
        ...

    def trace(self) -> str:
        """The run so far, numbered, in words."""
        ...

    def close(self) -> None:
        """Release the run's resources."""
        ...


class Violation(AssertionError):
    """A property failed; ``trace`` tells the run that broke it."""

    def __init__(self, name: str, detail: str, trace: str = "") -> None:
        super().__init__(f"{name}: {detail}")
        self.name = name
        self.detail = detail
        self.trace = trace


@dataclasses.dataclass
class ExplorationResult:
    """What one exploration covered, and the first violation if any."""

    label: str
    states: int = 0
    schedules: int = 0
    steps: int = 0
    seconds: float = 0.0
    violation: Violation | None = None
    actions: tuple[Hashable, ...] = ()


def explore(
    label: str,
    build: Callable[[], Explorable],
    *,
    depth: int,
    time_limit: float | None = None,
) -> ExplorationResult:
    """Explore every run of ``build()`` up to ``depth`` actions."""
    result = ExplorationResult(label)
    seen: dict[Hashable, int] = {}
    started = time.monotonic()

    def replay(path: tuple[Hashable, ...]) -> Explorable:
        system = build()
        for action in path:
            system.apply(action)
            result.steps += 1
        return system

    def walk(system: Explorable, path: tuple[Hashable, ...]) -> None:
        if time_limit is not None and time.monotonic() - started > time_limit:
            raise TimeoutError(f"{label}: exploration exceeded {time_limit} s")
        try:
            system.check()
        except Violation as violation:
            violation.trace = system.trace()
            result.violation = violation
            result.actions = path
            system.close()
            raise
        remaining = depth - len(path)
        signature = system.signature()
        if seen.get(signature, -1) >= remaining:
            system.close()
            result.schedules += 1
            return
        seen[signature] = remaining
        actions = list(system.actions()) if remaining > 0 else []
        if not actions:
            system.close()
            result.schedules += 1
            return
        for index, action in enumerate(actions):
            # The first child continues on the live run; the others replay.
            child = system if index == 0 else replay(path)
            child.apply(action)
            result.steps += 1
            walk(child, (*path, action))

    # A violation stops the whole search; it is kept in the result.
    with contextlib.suppress(Violation):
        walk(build(), ())
    result.states = len(seen)
    result.seconds = time.monotonic() - started
    return result


def report(results: Sequence[ExplorationResult]) -> bool:
    """Print each exploration; True when none found a violation."""
    for r in results:
        rate = r.steps / r.seconds if r.seconds else 0.0
        print(
            f"{r.label}: {r.states} distinct states, {r.schedules} schedules, "
            f"{r.steps} steps in {r.seconds:.1f} s ({rate:.0f} steps/s)"
        )
        if r.violation is not None:
            print(f"\nVIOLATION of {r.violation.name}: {r.violation.detail}")
            print(f"Run ({len(r.actions)} actions):\n{r.violation.trace}")
            return False
    return True


def report_total(results: Sequence[ExplorationResult], seconds: float) -> None:
    """Print what all the explorations covered together."""
    print(
        f"\ntotal: {sum(r.states for r in results)} distinct states, "
        f"{sum(r.schedules for r in results)} schedules, {sum(r.steps for r in results)} steps "
        f"in {seconds:.1f} s"
    )
