"""The real ActionRunner on InMemoryLedger, explored exhaustively through the gates.

This drives the state machine of ``stateful_tests`` step by step instead of
letting Hypothesis sample: the same deterministic scheduler parks every
ledger, provider and verifier call of every contender at a gate, and the
explorer tries every decision at every gate. The properties checked are the
machine's own (``stateful_tests.invariants``).
"""

from __future__ import annotations

import contextlib
from collections.abc import Hashable, Iterator, Sequence
from typing import Any

import stateful_tests.test_runner_machine as machine_module
from models.explore import ContenderPlan, Violation
from stateful_tests import invariants as inv
from stateful_tests.harness import WRITE_FAULTS, LedgerFault, ProviderFault, VerifierAnswer

__all__ = ["RealRunnerRun", "quiet_hypothesis"]


@contextlib.contextmanager
def quiet_hypothesis() -> Iterator[None]:
    """The machine reports to Hypothesis with note() and event(); outside a test, do nothing."""
    saved = machine_module.note, machine_module.event
    machine_module.note = lambda *a, **k: None  # type: ignore[assignment]
    machine_module.event = lambda *a, **k: None  # type: ignore[assignment]
    try:
        yield
    finally:
        machine_module.note, machine_module.event = saved


def _choices(gate: str, faults: str) -> list[Any]:
    """Every distinct decision at a gate (the machine's weighted lists, deduplicated)."""
    if gate == "provider.charge":
        options: list[Any] = list(ProviderFault)
    elif gate == "verifier.verify":
        options = list(VerifierAnswer)
    elif gate in ("ledger.get", "ledger.find"):
        options = [LedgerFault.NONE, LedgerFault.FAIL_BEFORE_WRITE]
    else:
        options = list(WRITE_FAULTS)  # in memory: no writer lock to be stuck on
    if faults == "none":
        return options[:1]
    if faults == "few":
        return options[:3]
    return options


class RealRunnerRun:
    """One run of the runner machine, driven action by action."""

    def __init__(
        self,
        plans: Sequence[ContenderPlan],
        *,
        faults: str = "all",
        crashes: int = 1,
        fault_budget: int = 1,
        overrides: dict[str, Any] | None = None,
    ) -> None:
        cls = machine_module.machine_for("memory", **(overrides or {}))
        self.machine = cls()
        self.machine.the_keys()
        self.plans = list(plans)
        self.started: list[int] = []
        self.faults = faults
        self.crash_budget = crashes
        self.fault_budget = fault_budget
        self.faults_used = 0

    # -- Explorable ---------------------------------------------------------------

    def actions(self) -> list[Hashable]:
        m = self.machine
        found: list[Hashable] = []
        for name in sorted(c.name for c in m._parked()):
            c = next(c for c in m.contenders_list if c.name == name)
            assert c.parked_at is not None
            choices = _choices(c.parked_at, self.faults)
            if self.faults_used >= self.fault_budget:
                choices = choices[:1]  # the fault-free decision only
            for decision in choices:
                found.append(("release", name, decision.name))
            if m.crashes < self.crash_budget:
                found.append(("crash", name))
        for index in range(len(self.plans)):
            if index not in self.started:
                found.append(("start", index))
                break  # contenders start in plan order; who moves first is the interleaving
        for key in sorted({plan.key for plan in self.plans}):
            ref = f"ref-{key}"
            if m.world.may_appear_later(ref):
                found.extend([("late commit", key), ("give up", key)])
        return found

    def apply(self, action: Hashable) -> None:
        m = self.machine
        kind = action[0]  # type: ignore[index]
        if kind == "start":
            index = action[1]  # type: ignore[index]
            plan = self.plans[index]
            self.started.append(index)
            if plan.kind == "execute":
                m.start_execute(
                    key=plan.key,
                    amount=100,
                    alternate_reference=False,
                    policy=plan.policy,
                    with_verifier=plan.with_verifier,
                    wait=plan.wait,
                    form=plan.form,
                )
            else:
                m.operate(plan.key, plan.kind)
        elif kind == "release":
            _, name, decision_name = action  # type: ignore[misc]
            c = next(c for c in m.contenders_list if c.name == name)
            gate = c.parked_at
            assert gate is not None
            options = _choices(gate, "all")
            decision = next(d for d in options if d.name == decision_name)
            if decision is not options[0]:
                self.faults_used += 1
            if gate.startswith("ledger.") and decision is not LedgerFault.NONE:
                m.history.add(f"contender {c.name}", f"{gate}: {decision.value}")
            m.history.step += 1
            m.scheduler.release(c, decision)
            m._after(c)
        elif kind == "crash":
            c = next(c for c in m.contenders_list if c.name == action[1])  # type: ignore[index]
            m.history.add(f"contender {c.name}", f"crashes while parked at {c.parked_at}")
            m.crashes += 1
            m.history.step += 1
            m.scheduler.crash(c)
            m._after(c)
        else:
            m.provider_acts(action[1], kind)  # type: ignore[index]

    def check(self) -> None:
        m = self.machine
        for check in (*inv.SAFETY, *inv.PROGRESS):
            try:
                check(m)
            except inv.InvariantViolation as violation:
                raise Violation(violation.name, violation.detail) from None

    def signature(self) -> Hashable:
        m = self.machine
        world = (
            tuple(sorted((ref, len(effects)) for ref, effects in m.world.effects.items())),
            tuple(sorted((ref, len(reqs)) for ref, reqs in m.world.in_flight.items())),
            tuple(sorted(m.world.fenced_upto.items())),
        )
        ledger = tuple(
            sorted(
                (
                    r.idempotency_key,
                    r.claim_state.value,
                    r.attempts,
                    r.version,
                    str(r.execution_status),
                    str(r.verification_status),
                    str(r.final_status),
                )
                for r in m.observed.values()
            )
        )
        contenders = tuple(
            (
                c.name,
                c.kind,
                c.key,
                c.parked_at,
                c.finished,
                c.crashed,
                _outcome(c.outcome),
                tuple(f.name for f in c.provider_calls),
                tuple(label for _, label in c.verifier_answers),
                tuple((gate, fault.name) for gate, fault in c.ledger_faults),
                c.cleared_since_last_call,
            )
            for c in m.contenders_list
        )
        cleared = tuple(sorted(m.provider.cleared.items()))
        return (
            world,
            ledger,
            contenders,
            tuple(self.started),
            m.crashes,
            self.faults_used,
            cleared,
        )

    def trace(self) -> str:
        return str(self.machine.history.narrative())

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.machine.teardown()


def _outcome(outcome: Any) -> str:
    if outcome is None:
        return "-"
    status = getattr(outcome, "status", None)
    if status is not None:
        return f"{status.value}{'/replayed' if getattr(outcome, 'replayed', False) else ''}"
    return type(outcome).__name__
