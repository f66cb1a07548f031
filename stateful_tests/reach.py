"""What a machine's runs reached: each rule run, each decision at each gate.

A rule that never runs (a precondition never true) hides a whole kind of
interference, and a fault the machine never reaches is a fault the suite
never tested, however green it is. The machines' own tests count both from
the runs that search for violations (``reach_checked``), so no second search
is run just to count.

``rule`` is Hypothesis's public ``@rule`` with a count of each call: the
machines' rule modules import it from here.
"""

from __future__ import annotations

import functools
import inspect
import unittest
from collections import Counter
from collections.abc import Callable
from typing import Any

from hypothesis import settings
from hypothesis.stateful import RuleBasedStateMachine, run_state_machine_as_test
from hypothesis.stateful import rule as hypothesis_rule

from stateful_tests.harness import REACHED, WRITE_FAULTS, LedgerFault, ProviderFault

__all__ = [
    "MAX_RUNS_PER_EXAMPLE",
    "ReachCheckedCase",
    "RULES_RUN",
    "reach_checked",
    "rule",
    "rule_names",
    "runner_pairs",
]

#: Calls of each rule (by method name) in this process since it was cleared.
RULES_RUN: Counter[str] = Counter()

#: Runs per counted example. Measured 1.08 to 1.7 over seeds 7 to 9 on
#: Hypothesis 6.155 and 6.170 for both machines (swarm testing throws a run
#: away when every rule it could take is left out).
MAX_RUNS_PER_EXAMPLE = 2.0


def rule(**kwargs: Any) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """``hypothesis.stateful.rule``, counting each call of the rule in ``RULES_RUN``."""
    hypothesis_decorator: Callable[[Callable[..., Any]], Callable[..., Any]] = hypothesis_rule(
        **kwargs
    )

    def decorate(function: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(function)
        def counted(*args: Any, **kw: Any) -> Any:
            RULES_RUN[function.__name__] += 1
            return function(*args, **kw)

        return hypothesis_decorator(counted)

    return decorate


def rule_names(machine: type[RuleBasedStateMachine]) -> set[str]:
    """The name of every rule of ``machine`` (a method whose source starts with ``@rule``)."""
    found: set[str] = set()
    for name, member in inspect.getmembers(machine, inspect.isfunction):
        try:
            source = inspect.getsource(inspect.unwrap(member))
        except OSError:
            continue
        if "@rule(" in source.split("def ", 1)[0]:
            found.add(name)
    return found


class ReachCheckedCase(unittest.TestCase):
    """A machine's test case whose search is also its reach check (``reach_checked``)."""

    def runTest(self) -> None:
        """The search, then the reach check."""
        raise NotImplementedError


def reach_checked(
    machine: type[RuleBasedStateMachine],
    search: settings,
    *,
    pairs: Callable[[], set[tuple[str, str]]] | None,
    round_: settings,
    more_rounds: int,
) -> type[ReachCheckedCase]:
    """``machine``'s test case: its search, then what the search's own runs reached.

    It fails naming every rule that never ran, every (gate, decision) pair
    of ``pairs`` never reached, or too many runs thrown away per example.
    Rules and pairs still missing after the search are given up to
    ``more_rounds`` searches of ``round_`` (each checked like the first)
    before they count as unreachable.
    """
    runs: Counter[str] = Counter()

    class Counted(machine):  # type: ignore[misc, valid-type]
        def __init__(self) -> None:
            super().__init__()
            runs["runs"] += 1

    Counted.__name__ = machine.__name__
    Counted.__qualname__ = machine.__qualname__
    rules = rule_names(machine)
    assert len(rules) >= 8, f"rules found: {sorted(rules)}"

    def missing() -> list[str]:
        left = [f"rule {name}" for name in sorted(rules - set(RULES_RUN))]
        if pairs is not None:
            left += [f"{gate}: {decision}" for gate, decision in sorted(pairs() - set(REACHED))]
        return left

    class ReachChecked(ReachCheckedCase):
        def runTest(self) -> None:
            runs.clear()
            RULES_RUN.clear()
            REACHED.clear()
            run_state_machine_as_test(Counted, settings=search)
            examples = search.max_examples
            for _ in range(more_rounds):
                if not missing():
                    break
                run_state_machine_as_test(Counted, settings=round_)
                examples += round_.max_examples
            left = missing()
            assert not left, f"never reached in {examples} examples: {left}"
            assert runs["runs"] <= MAX_RUNS_PER_EXAMPLE * examples, (
                f"{runs['runs']} runs for {examples} examples: swarm testing threw too many away"
            )

        runTest.is_hypothesis_test = True  # type: ignore[attr-defined]

    ReachChecked.__name__ = ReachChecked.__qualname__ = f"{machine.__name__}.TestCase"
    return ReachChecked


WRITES = ("claim", "start_attempt", "record", "release")
READS = ("get", "find")
VERIFIER_ANSWERS = (
    "confirmed",
    "absent",
    "absent retry-safe",
    "unknown",
    "raises",
    "wrong reference",
    "unhealthy",
    "not a result",
)


def runner_pairs() -> set[tuple[str, str]]:
    """Every (gate, decision) pair the runner machine must reach."""
    pairs = {(f"ledger.{m}", f.name) for m in WRITES for f in WRITE_FAULTS}
    pairs |= {
        (f"ledger.{m}", f.name)
        for m in READS
        for f in (LedgerFault.NONE, LedgerFault.FAIL_BEFORE_WRITE)
    }
    pairs |= {("provider", f.name) for f in ProviderFault}
    # Sync operations run on a worker thread: every provider fault, and a
    # crash while the thread is blocked in the provider call.
    pairs |= {("provider from a worker thread", f.name) for f in ProviderFault}
    pairs |= {("crash", "operation on a worker thread, at provider.charge")}
    # A caller that gives up in its provider call (its process lives on),
    # and its thread answering later. After a takeover of its claim too, but
    # that is not required: a quarter of searches miss it, and a round more
    # cost each 20 s (tests/attempts/test_cancellation.py covers it).
    pairs |= {
        ("give up", f"operation on {where}, at provider.charge")
        for where in ("its worker thread", "the event loop")
    }
    pairs |= {("a given-up caller's thread", "answered")}
    pairs |= {("verifier", label) for label in VERIFIER_ANSWERS}
    # A duplicate that waited for the claim holder ended each possible way.
    pairs |= {("wait", "replayed"), ("wait", "ActionInProgressError")}
    # Keys freed by expiry and reopen, refused where the outcome is not
    # definitive, and a second tenant sharing an idempotency key.
    pairs |= {("ledger.retire", f.name) for f in WRITE_FAULTS}
    pairs |= {
        ("lifecycle", "reopened"),
        ("lifecycle", "RecoveryRefusedError"),
        ("lifecycle", "a freed key claimed afresh"),
        ("lifecycle", "expiry asked, UNKNOWN kept its key"),
        ("lifecycle", "pruned"),
        ("namespace", "another tenant's call of a shared key finished"),
    }
    return pairs
