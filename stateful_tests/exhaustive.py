"""``python -m stateful_tests.exhaustive``: the real runner, explored exhaustively.

The scenarios of ``models.bounds`` run on the real ActionRunner with
InMemoryLedger. This drives the runner state machine step by step instead
of letting Hypothesis sample: the same deterministic scheduler parks every
ledger, provider and verifier call of every contender at a gate, and the
explorer tries every decision at every gate. The properties checked are the
machine's own (``stateful_tests.invariants``). Exit 0 when nothing is
violated, 1 with the trace otherwise.

    python -m stateful_tests.exhaustive                 # the default bound
    python -m stateful_tests.exhaustive --bound large   # more scenarios
    python -m stateful_tests.exhaustive --planted all   # each planted bug must be found
"""

from __future__ import annotations

import argparse
import contextlib
import sys
import time
from collections.abc import Callable, Hashable, Iterator, Sequence
from typing import Any, cast

import stateful_tests.runner_machine as machine_module
from models.bounds import BOUNDS, LIFECYCLE_BOUNDS
from models.explore import (
    ContenderPlan,
    ExplorationResult,
    Violation,
    explore,
    report,
    report_total,
)
from stateful_tests import invariants as inv
from stateful_tests.harness import WRITE_FAULTS, LedgerFault, ProviderFault, VerifierAnswer
from stateful_tests.violations import InvariantViolation

__all__ = ["OUT_OF_REACH", "RealRunnerRun", "main", "quiet_hypothesis", "run_real", "scenarios"]


@contextlib.contextmanager
def quiet_hypothesis() -> Iterator[None]:
    """The machine reports to Hypothesis with note() and event(); outside a test, do nothing."""
    # The machine's module namespace, where it looks the two names up.
    namespace = vars(machine_module)
    saved = namespace["note"], namespace["event"]
    namespace["note"] = namespace["event"] = lambda *a, **k: None
    try:
        yield
    finally:
        namespace["note"], namespace["event"] = saved


def _choices(gate: str, faults: str) -> list[Any]:
    """Every distinct decision at a gate (the machine's weighted lists, deduplicated)."""
    if gate == "provider.charge":
        options: list[Any] = list(ProviderFault)
    elif gate == "verifier.verify":
        options = list(VerifierAnswer)
    elif gate in ("ledger.get", "ledger.find"):
        options = [LedgerFault.NONE, LedgerFault.FAIL_BEFORE_WRITE]
    elif gate == "ledger.take_over":
        # This explorer never moves the ledger's clock, so every takeover is
        # refused: faults there only multiply schedules (they doubled its
        # time). The runner machine faults takeovers of expired claims.
        options = [LedgerFault.NONE]
    else:
        options = list(WRITE_FAULTS)  # in memory: no writer lock to be stuck on
    if faults == "none":
        return options[:1]
    if faults == "few":
        return options[:3]
    return options


_MACHINES: dict[tuple[tuple[str, int], ...], type[Any]] = {}


def _machine_class(overrides: dict[str, Any]) -> type[Any]:
    """One machine class per set of overrides: Hypothesis collects a class's rules once."""
    key = tuple(sorted((name, id(value)) for name, value in overrides.items()))
    if key not in _MACHINES:
        _MACHINES[key] = machine_module.machine_for("memory", **overrides)
    return _MACHINES[key]


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
        cls = _machine_class(overrides or {})
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
            if plan.kind in ("execute", "expire"):
                m.start_execute(
                    key=plan.key,
                    amount=100,
                    alternate_reference=False,
                    policy=plan.policy,
                    with_verifier=plan.with_verifier,
                    wait=plan.wait,
                    form=plan.form,
                    expires=plan.kind == "expire",
                )
            else:
                m.operate(plan.key, plan.kind)
        elif kind == "release":
            _, name, decision_name = cast("tuple[str, str, str]", action)
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
            except InvariantViolation as violation:
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


def _build(
    plans: Sequence[ContenderPlan], faults: int, crashes: int, overrides: dict[str, Any]
) -> Callable[[], Any]:
    return lambda: RealRunnerRun(plans, fault_budget=faults, crashes=crashes, overrides=overrides)


def scenarios(bound: str) -> list[tuple[str, list[ContenderPlan], int, int]]:
    """Every scenario of ``bound`` the real runner explores: the protocol's, then the lifecycle's."""
    return [*BOUNDS[bound], *LIFECYCLE_BOUNDS.get(bound, [])]


def run_real(
    bound: str, overrides: dict[str, Any] | None = None, depth: int = 40
) -> list[ExplorationResult]:
    """Explore every scenario of ``bound`` on the real runner; stops at the first violation."""
    results = []
    with quiet_hypothesis():
        for name, plans, faults, crashes in scenarios(bound):
            result = explore(
                f"real runner: {name}, {faults} fault(s), {crashes} crash(es)",
                _build(plans, faults, crashes, overrides or {}),
                depth=depth,
            )
            results.append(result)
            if result.violation is not None:
                break
    return results


#: Planted bugs of the ledger and merge machines that the runner explorer
#: cannot reach, and why; their own machines find them.
_NO_LEASE_CLOCK = "leases need the ledger clock, which only the runner machine moves so far"
_NO_WAIT = "no caller here waits for a claim holder; the runner machine's waiters do"
_NO_SIZE_BOUND = "its runners keep the default request bound; the runner machine meets the bound"
_FEW_OBSERVATIONS = (
    "its receipts get at most two observations, far below the bound of 16; the runner machine "
    "lowers the bound to 2 and replays UNKNOWN receipts past it"
)
_NO_PRUNE = "this explorer's lifecycle scenarios free keys by expiry and reopen; prune is the ledger and runner machines'"
_NO_TOO_EARLY = (
    "it shows only to a caller asking for just more than a receipt's age: the runner machine's"
)
OUT_OF_REACH = {
    "non-atomic-claim": "the race is inside one ledger call; the scheduler gates between calls",
    "first-writer-wins-merge": "losing an observation is judged by the merge machine's model",
    "latest-observation-wins": "losing an observation is judged by the merge machine's model",
    "no-answer-written-as-an-observation": "it needs a reconcile of a completed receipt: the "
    "merge machine's",
    "memory-record-ignores-version": "a ledger-level bug: the ledger machine compares with the model",
    "memory-starts-attempts-on-completed-claims": "a ledger-level bug (the ledger machine)",
    "memory-claim-always-created": "a ledger-level bug (the ledger machine)",
    "fused-claim-overwrites-a-held-key": "a ledger-level bug (the ledger machine)",
    "sqlite-record-reopens-completed-claims": "a SQLite bug; this explorer runs InMemoryLedger",
    "sqlite-releases-started-claims": "a SQLite bug; this explorer runs InMemoryLedger",
    "sqlite-lock-wait-unbounded": "a SQLite bug; this explorer runs InMemoryLedger",
    "group-answers-writes-a-rollback-took-back": "a SQLite grouped-writer bug (the group machine)",
    "group-commits-each-write-alone": "a SQLite grouped-writer bug (the group machine)",
    "group-serves-after-a-failed-rollback": "a SQLite grouped-writer bug (the group machine)",
    "group-fails-whole-on-a-refused-statement": "a SQLite grouped-writer bug (the group machine)",
    "group-fails-whole-on-an-unbindable-value": "a SQLite grouped-writer bug (the group machine)",
    "group-fails-whole-on-a-failed-look-up": "a SQLite grouped-writer bug (the group machine)",
    "group-runs-a-claim-its-look-up-answered": "a SQLite grouped-writer bug (the group machine)",
    "group-looks-up-on-a-broken-connection": "a SQLite grouped-writer bug (the group machine)",
    "group-answers-a-claim-with-another-keys-holder": (
        "a SQLite grouped-writer bug (the group machine)"
    ),
    "group-fails-claims-whose-read-together-failed": (
        "a SQLite grouped-writer bug (the group machine)"
    ),
    "runner-trusts-a-rolled-back-group": (
        "a SQLite grouped-writer bug (the runner machine on one connection)"
    ),
    "observations-truncated-oldest-first": "losing an observation is judged by the merge machine",
    "newest-observation-dropped": "losing an observation is judged by the merge machine",
    "sync-operation-on-the-loop": "this explorer's operations are async; the runner machine has sync ones",
    "cancelled-call-settled-while-its-thread-acts": (
        "this explorer's operations are async and a crash ends all of a contender; the runner "
        "machine's callers give up while their worker threads live on"
    ),
    "cancelled-async-call-settled-while-its-thread-acts": (
        "this explorer's operations hand nothing to a thread; the runner machine's do"
    ),
    "trusts-return-when-verifier-fails": (
        "judged by the evidence oracle, which only the runner machine checks so far"
    ),
    "renewal-after-takeover": _NO_LEASE_CLOCK,
    "takeover-without-fencing": _NO_LEASE_CLOCK,
    "takeover-reinvokes-started-attempt": _NO_LEASE_CLOCK,
    "expiry-judged-by-worker-clock": _NO_LEASE_CLOCK,
    "zombie-overwrites-new-owner": _NO_LEASE_CLOCK,
    "taker-retries-without-retry-safe-evidence": _NO_LEASE_CLOCK,
    "zombie-evidence-dropped": _NO_LEASE_CLOCK,
    "memory-renews-for-any-token": _NO_LEASE_CLOCK,
    "sqlite-takes-over-live-claims": _NO_LEASE_CLOCK,
    "sweep-releases-started-claims": _NO_LEASE_CLOCK,
    "sweep-leaves-started-claims": _NO_LEASE_CLOCK,
    "owner-outcome-lost-to-zombie-merge": _NO_LEASE_CLOCK,
    "lease-expiry-exclusive": _NO_LEASE_CLOCK,
    "renewal-from-the-old-expiry": _NO_LEASE_CLOCK,
    "lease-by-the-writer-clock": _NO_LEASE_CLOCK,
    "late-attempt-invokes-without-renewing": _NO_LEASE_CLOCK,
    "lease-judged-young-until-it-ends": _NO_LEASE_CLOCK,
    "late-attempt-ignores-a-refused-renewal": _NO_LEASE_CLOCK,
    "namespace-left-out-of-the-key": "its scenarios use one namespace; the runner and ledger machines use two",
    "prune-without-version-check": _NO_PRUNE,
    "retire-without-version-check": "it needs a change landing between a retire's read and its write, which no scenario here makes; the ledger machine races them",
    "expiry-from-the-claim": _NO_TOO_EARLY,
    "prune-at-the-cutoff": _NO_PRUNE,
    "waiter-gives-up-a-pause-early": _NO_WAIT,
    "waiter-sleeps-past-its-deadline": _NO_WAIT,
    "wait-without-back-off": _NO_WAIT,
    "request-bound-exclusive": _NO_SIZE_BOUND,
    "request-bound-of-the-default": _NO_SIZE_BOUND,
    "busy-timeout-in-milliseconds": "a SQLite bug; this explorer runs InMemoryLedger",
    "observations-dropped-at-the-bound": _FEW_OBSERVATIONS,
    "observations-kept-past-the-bound": _FEW_OBSERVATIONS,
    "settle-hears-a-stale-observation": (
        "it needs a verifier's answer about one attempt and then another attempt of the same "
        "claim; no scenario here retries after a reconcile (checked: not found in 13 s)"
    ),
}


def planted(names: list[str]) -> int:
    """Run the default bound against each planted bug; each must be found."""
    from stateful_tests.planted_bugs import PLANTED_BUGS
    from stateful_tests.planted_bugs import planted as plant

    chosen = [b for b in PLANTED_BUGS if "all" in names or b.name in names]
    if not chosen:
        print(f"no planted bug named {', '.join(names)}", file=sys.stderr)
        return 2
    missed = 0
    for bug in chosen:
        if bug.name in OUT_OF_REACH:
            print(f"{bug.name:<40} out of this explorer's reach: {OUT_OF_REACH[bug.name]}")
            continue
        started = time.monotonic()
        with plant(bug) as overrides:
            results = run_real("default", overrides)
        found = next((r.violation for r in results if r.violation is not None), None)
        seconds = time.monotonic() - started
        verdict = "NOT FOUND"
        if found is not None:
            verdict = f"found as {found.name}"
            if found.name not in bug.expected:
                verdict += f" (expected {', '.join(sorted(bug.expected))})"
                missed += 1
        print(f"{bug.name:<40} {verdict} in {seconds:.1f} s")
        missed += found is None
    return 1 if missed else 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m stateful_tests.exhaustive", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--bound", choices=sorted(BOUNDS), default="default")
    parser.add_argument("--planted", nargs="+", metavar="NAME", help="planted bug names, or all")
    args = parser.parse_args(argv)
    if args.planted:
        return planted(args.planted)
    started = time.monotonic()
    results = run_real(args.bound)
    ok = report(results)
    report_total(results, time.monotonic() - started)
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
