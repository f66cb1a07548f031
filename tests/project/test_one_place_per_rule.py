"""Each protocol rule has one home (#40): read from the source, not from behaviour.

A second place that builds a COMPLETED receipt, merges into the ledger or
decides which value a caller may see is how two copies of a rule drift
apart; the behaviour tests would only notice once they had. So these walk
the library's syntax trees and hold each rule to its one function.
"""

from __future__ import annotations

import ast
import inspect
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

import dataoad._leases as leases_module
import dataoad._recovery as recovery_module

ROOT = Path(__file__).resolve().parents[2]


_FUNCTIONS = (ast.FunctionDef, ast.AsyncFunctionDef)


def _own_calls(function: ast.FunctionDef | ast.AsyncFunctionDef) -> Iterator[ast.Call]:
    """The calls in ``function``'s own body: a nested function's are its own (a lambda's
    are its enclosing function's)."""
    stack: list[ast.AST] = list(function.body)
    while stack:
        node = stack.pop()
        if isinstance(node, _FUNCTIONS):
            continue
        if isinstance(node, ast.Call):
            yield node
        stack.extend(ast.iter_child_nodes(node))


def _sites(match: Callable[[ast.Call], bool]) -> set[str]:
    """``module.function`` of every call in the library (``dataoad.testing`` aside) that ``match``es."""
    found: set[str] = set()
    for path in sorted((ROOT / "dataoad").rglob("*.py")):
        relative = path.relative_to(ROOT)
        if relative.parts[1] == "testing":
            continue  # the contract suites build receipts of every kind on purpose
        module = ".".join(relative.with_suffix("").parts)
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for function in ast.walk(tree):
            if isinstance(function, _FUNCTIONS) and any(map(match, _own_calls(function))):
                found.add(f"{module}.{function.name}")
    return found


def _completes(call: ast.Call) -> bool:
    return any(
        k.arg == "claim_state" and ast.unparse(k.value).endswith("ClaimState.COMPLETED")
        for k in call.keywords
    )


def _named(name: str) -> Callable[[ast.Call], bool]:
    def match(call: ast.Call) -> bool:
        func = call.func
        return (isinstance(func, ast.Attribute) and func.attr == name) or (
            isinstance(func, ast.Name) and func.id == name
        )

    return match


def test_one_function_builds_every_settled_receipt() -> None:
    """Completion, an observation merged, a takeover settled, a zombie's evidence on a
    completed claim: all are ``_settled.completed``'s work."""
    assert _sites(_completes) == {"dataoad._settled.completed"}


def test_one_loop_merges_into_the_ledger() -> None:
    """Every read-only merge (a verifier's observation, a fenced worker's evidence) is
    written by one loop, which re-reads and re-merges after a lost race."""
    assert _sites(_named("merge")) == {"dataoad._recovery._merge_until_written"}


def test_one_rule_decides_the_value_a_caller_sees() -> None:
    assert _sites(_named("recovered_value_correlated")) == {"dataoad._settled.exposed_value"}
    assert _sites(_named("exposed_value")) == {
        "dataoad._completing.complete",
        "dataoad._recovery.merge_observation",
    }


def test_recovery_lives_in_one_module_and_leases_only_hold_and_take_over() -> None:
    verbs = (
        "reconcile",
        "recover_pending",
        "release",
        "recover_stale",
        "settle_started",
        "merge_observation",
        "merge_zombie_evidence",
    )
    for verb in verbs:
        assert getattr(recovery_module, verb).__module__ == "dataoad._recovery", verb
    defined = {
        name
        for name, value in vars(leases_module).items()
        if (inspect.isfunction(value) or inspect.isclass(value))
        and value.__module__ == "dataoad._leases"
        and not name.startswith("_")
    }
    # Holding (the tenure, the renewals, a late attempt's renewal before its
    # call) and taking over; its private helpers serve keep_lease.
    assert defined == {
        "Tenure",
        "default_owner",
        "keep_lease",
        "refused_if_late",
        "renewed_for_the_call",
        "take_over",
        "young_enough",
    }


def test_the_checks_see_a_second_builder_and_a_second_merge(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "dataoad" / "testing").mkdir(parents=True)
    (tmp_path / "dataoad" / "_a.py").write_text(
        "def done(r):\n    return r.evolve(claim_state=ClaimState.COMPLETED)\n"
        "async def again(store, p, c):\n    await store.merge(p, c)\n"
    )
    (tmp_path / "dataoad" / "testing" / "_c.py").write_text(
        "def fine(r):\n    return r.evolve(claim_state=ClaimState.COMPLETED)\n"
    )
    monkeypatch.setattr(sys.modules[__name__], "ROOT", tmp_path)
    assert _sites(_completes) == {"dataoad._a.done"}
    assert _sites(_named("merge")) == {"dataoad._a.again"}
