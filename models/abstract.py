"""The protocol design itself, as an abstract program, explored exhaustively.

Each contender is a generator that restates the seed's protocol step by
step over the abstract ledger and world of this package, using only the
evidence rules of ``models.protocol``: it yields at every point where the
real runner would touch the ledger, the provider or a verifier, and the
explorer sends in what happens there. Nothing here imports the library, so
a flaw found here is a flaw in the protocol, not in its implementation.
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Generator, Hashable, Sequence
from typing import Any, cast

from models.explore import ContenderPlan, Violation
from models.ledger import AbstractLedger, ModelReceipt
from models.protocol import (
    CONFIRMED,
    FAILED,
    UNKNOWN,
    Evidence,
    aggregate,
    classify_execution,
    classify_verification,
    permitted_outcomes,
    retry_allowed,
)
from models.world import World

__all__ = ["AbstractRun"]

ACTION = "charge"
WRITE_DECISIONS = ("none", "write fails", "acknowledgement lost")
READ_DECISIONS = ("none", "read fails")
PROVIDER_DECISIONS = (
    "commits and answers",
    "raises before sending",
    "declines",
    "rejects retryably",
    "commits, then times out",
    "times out while in flight",
)
VERIFIER_DECISIONS = (
    "truthful",
    "stale absence",
    "unknown",
    "raises",
    "wrong reference",
    "degraded opposite",
)
POLICIES = {  # name -> (max attempts, retry FAILED, retry UNKNOWN)
    "default": (1, False, False),
    "retry-failed": (3, True, False),
    "retry-unknown (escape hatch)": (3, False, True),
}

Program = Generator[tuple[str, ...], str, str]

#: Every claim's lease, on the abstract ledger's clock; "lease runs out" moves
#: the clock by one lease, so every claim not renewed since has expired.
LEASE = 1.0


@dataclasses.dataclass
class State:
    """Everything the contenders share: the world, the ledger, and the record of what happened."""

    world: World = dataclasses.field(default_factory=World)
    ledger: AbstractLedger = dataclasses.field(default_factory=AbstractLedger)
    invocations: dict[str, int] = dataclasses.field(default_factory=dict)
    retry_licences: dict[str, int] = dataclasses.field(default_factory=dict)
    escape_hatch: set[str] = dataclasses.field(default_factory=set)
    ever_started: dict[str, int] = dataclasses.field(default_factory=dict)
    ids: itertools.count[int] = dataclasses.field(default_factory=lambda: itertools.count(1))


def _evidence(answer: str, world: World, ref: str, attempt: int) -> Evidence | None:
    if answer == "truthful":
        world.fence(ref, attempt)  # a truthful read first makes the judged attempts terminal
        if world.holds(ref):
            return Evidence(CONFIRMED)
        return Evidence(FAILED, retry_safe=True)
    if answer == "stale absence":
        return Evidence(FAILED, retry_safe=False)
    if answer == "unknown":
        return Evidence(UNKNOWN)
    if answer == "wrong reference":
        return Evidence(CONFIRMED, bound=False)
    if answer == "degraded opposite":
        return Evidence(FAILED if world.holds(ref) else CONFIRMED, healthy=False)
    return None  # the verifier raised


def _settle(state: State, receipt: ModelReceipt, ref: str, plan: ContenderPlan) -> Program:
    """Read-only verification of a completed UNKNOWN receipt, then its record."""
    answer = yield ("verifier", ref)
    seen = classify_verification(_evidence(answer, state.world, ref, receipt.attempts))
    if seen == UNKNOWN:
        return "UNKNOWN (replayed)"
    decision = yield ("ledger.record",)
    if decision == "write fails":
        return "persistence error after verification"
    state.ledger.record(dataclasses.replace(receipt, final=seen, version=receipt.version + 1))
    return f"{seen} (reconciled)"


def execute(state: State, plan: ContenderPlan, me: str = "?") -> Program:
    """The runner's execute, as the seed describes it, with leases."""
    ref = f"ref-{plan.key}"
    if plan.policy == "retry-unknown (escape hatch)":
        state.escape_hatch.add(ref)
    # The fused claim: one conditional write that looks the key up, claims
    # it if free and counts attempt 1 before anything is invoked.
    proposed = ModelReceipt(f"a{next(state.ids)}", ACTION, plan.key, "h", True, 1, 1, owner=me)
    decision = yield ("ledger.claim",)
    if decision == "write fails":
        return "persistence error, nothing invoked"
    existing, created = state.ledger.claim(proposed, LEASE)  # stored, answered or not
    if created:
        return (yield from _attempts(state, plan, existing, ref, started=True))
    if existing.pending and state.ledger.expired(existing):
        return (yield from _take_over(state, plan, existing, ref, me))
    if existing.pending:
        return "in progress"
    if existing.final == UNKNOWN and plan.with_verifier:
        return (yield from _settle(state, existing, ref, plan))
    return f"{existing.final} (replayed)"


def _take_over(
    state: State, plan: ContenderPlan, existing: ModelReceipt, ref: str, me: str
) -> Program:
    """An expired claim: taken over under the next token, then invoked only if never started."""
    proposed = dataclasses.replace(
        existing, owner=me, token=existing.token + 1, version=existing.version + 1
    )
    decision = yield ("ledger.take_over",)
    if decision == "write fails":
        return "persistence error, nothing invoked"
    if not state.ledger.take_over(proposed, LEASE):
        return "in progress"  # renewed, settled or taken by another meanwhile
    if decision == "acknowledgement lost":
        return "persistence error, nothing invoked"
    taken = state.ledger.by_id[existing.action_id]
    if taken.attempts == 0:
        return (yield from _attempts(state, plan, taken, ref))
    max_attempts, retry_failed, _ = POLICIES[plan.policy]
    seen = UNKNOWN
    if plan.with_verifier:
        answer = yield ("verifier", ref)
        seen = classify_verification(_evidence(answer, state.world, ref, taken.attempts))
    if seen == FAILED and retry_failed and taken.attempts < max_attempts:
        # Retry-safe absence of the stranded attempt: a licence, as after any attempt.
        state.retry_licences[ref] = state.retry_licences.get(ref, 0) + 1
        return (yield from _attempts(state, plan, taken, ref, earlier=[FAILED]))
    if (yield ("ledger.record",)) == "write fails":
        return "persistence error, nothing invoked"
    done = dataclasses.replace(taken, pending=False, final=seen, version=taken.version + 1)
    if not state.ledger.record(done):
        return "fenced, nothing invoked"
    return f"{seen} (taken over)"


def _attempts(
    state: State,
    plan: ContenderPlan,
    receipt: ModelReceipt,
    ref: str,
    earlier: Sequence[str] = (),
    *,
    started: bool = False,
) -> Program:
    """Attempts until the policy stops; ``started``: attempt 1 was counted by the claim."""
    max_attempts, retry_failed, retry_unknown = POLICIES[plan.policy]
    outcomes: list[Any] = list(earlier)
    while True:
        if started:
            started = False
        else:
            following = dataclasses.replace(
                receipt, attempts=receipt.attempts + 1, version=receipt.version + 1
            )
            if (yield ("ledger.start_attempt",)) == "write fails":
                return "persistence error, not invoked"
            if not state.ledger.start_attempt(following, LEASE):
                return "persistence error, not invoked"
            receipt = following
        state.ever_started[ref] = max(state.ever_started.get(ref, 0), receipt.attempts)
        happened = yield ("provider", ref)
        state.invocations[ref] = state.invocations.get(ref, 0) + 1
        if happened in ("commits and answers", "commits, then times out"):
            state.world.commit(ref, receipt.attempts)
        elif happened == "times out while in flight":
            state.world.send_in_flight(ref, receipt.attempts)
        kind = {
            "commits and answers": "returned",
            "declines": "definitive",
            "rejects retryably": "definitive",
        }.get(happened, "raised")
        status = classify_execution(kind, has_verifier=plan.with_verifier)
        verified = None
        if status == UNKNOWN and plan.with_verifier:
            answer = yield ("verifier", ref)
            verified = classify_verification(_evidence(answer, state.world, ref, receipt.attempts))
        outcomes.append(verified if verified in (CONFIRMED, FAILED) else status)
        overall = aggregate(outcomes)
        assert overall is not None
        retryable = happened == "rejects retryably" if status == FAILED else verified == FAILED
        if retryable:
            state.retry_licences[ref] = state.retry_licences.get(ref, 0) + 1
        if retry_allowed(
            overall,
            attempts=receipt.attempts,
            max_attempts=max_attempts,
            retry_on_failed=retry_failed,
            retry_on_unknown=retry_unknown,
            retryable=retryable,
        ):
            continue
        if (yield ("ledger.record",)) == "write fails":
            return "persistence error, invoked"
        done = dataclasses.replace(
            receipt, pending=False, final=overall, version=receipt.version + 1
        )
        if not state.ledger.record(done):
            return "fenced, invoked"  # a zombie: its claim was taken over
        return str(overall)


def operator(state: State, plan: ContenderPlan, live_worker: bool) -> Program:
    """An operator's recovery or release of whatever the key's claim is now."""
    ref = f"ref-{plan.key}"
    receipt = state.ledger.find(ACTION, plan.key)
    if receipt is None:
        return "no claim"
    if plan.kind == "release":
        if (yield ("ledger.release",)) == "write fails":
            return "persistence error"
        released = state.ledger.release(receipt.action_id, receipt.version)
        return "released" if released else "refused"
    if receipt.pending and (receipt.attempts == 0 or live_worker):
        return "refused"
    if not receipt.pending and receipt.final != UNKNOWN:
        return f"{receipt.final} (already settled)"
    answer = yield ("verifier", ref)
    seen = classify_verification(_evidence(answer, state.world, ref, receipt.attempts))
    if seen == UNKNOWN:
        return "UNKNOWN"
    if (yield ("ledger.record",)) == "write fails":
        return "persistence error"
    state.ledger.record(
        dataclasses.replace(receipt, pending=False, final=seen, version=receipt.version + 1)
    )
    return str(seen)


def _choices(gate: str) -> tuple[str, ...]:
    if gate == "ledger.find":
        return READ_DECISIONS
    if gate.startswith("ledger."):
        return WRITE_DECISIONS
    if gate == "provider":
        return PROVIDER_DECISIONS
    return VERIFIER_DECISIONS


class AbstractRun:
    """One run of the abstract protocol, for ``models.explore``."""

    def __init__(
        self,
        plans: Sequence[ContenderPlan],
        fault_budget: int,
        crashes: int,
        expiries: int = 0,
    ) -> None:
        self.plans = list(plans)
        #: How often the ledger's clock may pass one lease in a run (at any point).
        self.expiry_budget = expiries
        self.expiries = 0
        self.state = State()
        self.programs: dict[str, Program] = {}
        self.parked: dict[str, tuple[str, ...]] = {}
        self.outcomes: dict[str, str] = {}
        self.histories: dict[str, list[str]] = {}
        self.fault_budget = fault_budget
        self.faults_used = 0
        self.crash_budget = crashes
        self.crashes = 0
        self.log: list[str] = []

    def _name(self, index: int) -> str:
        return "ABCDEFGH"[index]

    def _advance(self, name: str, value: str | None) -> None:
        program = self.programs[name]
        try:
            gate = program.send(value) if value is not None else next(program)
        except StopIteration as stop:
            self.parked.pop(name, None)
            self.outcomes[name] = str(stop.value)
            self.log.append(f"contender {name}: -> {stop.value}")
        else:
            self.parked[name] = gate

    def actions(self) -> list[Hashable]:
        found: list[Hashable] = []
        for name in sorted(self.parked):
            choices = _choices(self.parked[name][0])
            if self.faults_used >= self.fault_budget:
                choices = choices[:1]
            found.extend(("release", name, c) for c in choices)
            if self.crashes < self.crash_budget:
                found.append(("crash", name))
        started = len(self.programs)
        if started < len(self.plans):
            found.append(("start", started))
        if self.expiries < self.expiry_budget:
            found.append(("lease runs out",))
        for key in sorted({p.key for p in self.plans}):
            if self.state.world.may_appear_later(f"ref-{key}"):
                found.extend([("late commit", key), ("give up", key)])
        return found

    def apply(self, action: Hashable) -> None:
        kind = action[0]  # type: ignore[index]
        if kind == "start":
            index = action[1]  # type: ignore[index]
            plan, name = self.plans[index], self._name(index)
            self.histories[name] = []
            self.log.append(f"contender {name}: {plan}")
            if plan.kind == "execute":
                self.programs[name] = execute(self.state, plan, name)
            else:
                live = any(
                    p.kind == "execute" and p.key == plan.key and self._name(i) in self.parked
                    for i, p in enumerate(self.plans[: len(self.programs)])
                )
                self.programs[name] = operator(self.state, plan, live)
            self._advance(name, None)
        elif kind == "release":
            _, name, decision = cast("tuple[str, str, str]", action)
            gate = self.parked[name][0]
            if decision != _choices(gate)[0]:
                self.faults_used += 1
            self.histories[name].append(f"{gate}:{decision}")
            self.log.append(f"contender {name}: {gate}: {decision}")
            self._advance(name, decision)
        elif kind == "lease runs out":
            self.expiries += 1
            self.state.ledger.now += LEASE
            self.log.append("ledger clock: one lease passes; every lease held until now ran out")
        elif kind == "crash":
            name = action[1]  # type: ignore[index]
            self.crashes += 1
            self.programs[name].close()
            self.parked.pop(name, None)
            self.outcomes[name] = "crashed"
            self.log.append(f"contender {name}: crashes")
        else:
            ref = f"ref-{action[1]}"  # type: ignore[index]
            if kind == "late commit":
                self.state.world.commit_in_flight(ref)
            else:
                self.state.world.drop_in_flight(ref)
            self.log.append(f"provider: {kind} for {ref}")

    def check(self) -> None:
        s = self.state
        for ref, count in s.invocations.items():
            if ref not in s.escape_hatch and count > 1 + s.retry_licences.get(ref, 0):
                raise Violation(
                    "no-second-mutation-after-unknown",
                    f"{ref} was invoked {count} times with "
                    f"{s.retry_licences.get(ref, 0)} retry-safe licence(s)",
                )
        for receipt in s.ledger.by_id.values():
            ref = f"ref-{receipt.key}"
            if receipt.final is not None and receipt.final not in permitted_outcomes(
                effect_exists=s.world.holds(ref), may_appear_later=s.world.may_appear_later(ref)
            ):
                raise Violation(
                    "receipts-state-only-permitted-outcomes",
                    f"{receipt.key} says {receipt.final} while the world holds "
                    f"{s.world.count(ref)} effect(s) and "
                    f"{'may' if s.world.may_appear_later(ref) else 'cannot'} gain one",
                )
        for key_ref, attempts in s.ever_started.items():
            key = key_ref.removeprefix("ref-")
            if attempts and s.ledger.find(ACTION, key) is None:
                raise Violation(
                    "receipts-never-lost", f"the claim of {key} vanished after an attempt"
                )
        if self.faults_used == 0 and self.crashes == 0:
            for name, outcome in self.outcomes.items():
                plan = self.plans["ABCDEFGH".index(name)]
                if plan.kind == "execute" and outcome == UNKNOWN and plan.with_verifier:
                    raise Violation(
                        "clean-success-is-confirmed",
                        f"contender {name} ended UNKNOWN with no fault",
                    )

    def signature(self) -> Hashable:
        s = self.state
        world = (
            tuple(sorted((r, len(e)) for r, e in s.world.effects.items())),
            tuple(sorted((r, len(q)) for r, q in s.world.in_flight.items())),
            tuple(sorted(s.world.fenced_upto.items())),
        )
        ledger = tuple(
            sorted(
                (
                    r.key,
                    r.pending,
                    r.attempts,
                    r.version,
                    str(r.final),
                    r.owner or "",
                    r.token,
                    -1.0 if r.lease_until is None else r.lease_until - s.ledger.now,
                )
                for r in s.ledger.by_id.values()
            )
        )
        contenders = tuple(
            (name, tuple(self.histories[name]), self.parked.get(name), self.outcomes.get(name))
            for name in sorted(self.programs)
        )
        return (
            world,
            ledger,
            contenders,
            tuple(sorted(s.invocations.items())),
            tuple(sorted(s.retry_licences.items())),
            self.faults_used,
            self.crashes,
            self.expiries,
        )

    def trace(self) -> str:
        return "\n".join(f"{n:3d}. {line}" for n, line in enumerate(self.log, 1))

    def close(self) -> None:
        for program in self.programs.values():
            program.close()
