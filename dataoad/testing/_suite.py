"""Building blocks for deterministic safety suites (``run_safety_suite`` files)."""

from __future__ import annotations

import asyncio
import atexit
import inspect
import itertools
import shutil
import tempfile
from collections.abc import Awaitable, Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, TypeAlias

from dataoad._ledger import Ledger
from dataoad._receipt import bounded_error
from dataoad.ledgers.memory import InMemoryLedger
from dataoad.ledgers.sqlite import SQLiteLedger
from dataoad.testing._report import SafetyCheck, SafetyReport

__all__ = [
    "CheckFn",
    "LedgerFactory",
    "default_ledgers",
    "expect",
    "in_memory_ledgers",
    "run_checks",
    "run_suite",
    "sqlite_ledgers",
]

#: Makes a fresh, empty ledger for one check; the suite closes it afterwards.
LedgerFactory: TypeAlias = Callable[[], Ledger]
#: One named check: given a fresh ledger, returns its SafetyCheck.
CheckFn: TypeAlias = Callable[[Ledger], Awaitable[SafetyCheck]]

_ABSENT = object()


def in_memory_ledgers() -> Ledger:
    """A LedgerFactory that makes a fresh InMemoryLedger."""
    return InMemoryLedger()


def default_ledgers() -> LedgerFactory:
    """The factory suites use when none is given: the embedded default ledger.

    Each call of the returned factory makes a SQLiteLedger on a new file in
    a private temporary folder, removed when the process exits.
    """
    folder = Path(tempfile.mkdtemp(prefix="dataoad-suite-"))
    atexit.register(shutil.rmtree, folder, ignore_errors=True)
    counter = itertools.count(1)

    def make() -> Ledger:
        return SQLiteLedger(folder / f"ledger-{next(counter)}.sqlite3")

    return make


def sqlite_ledgers(folder: Path) -> LedgerFactory:
    """A LedgerFactory making SQLiteLedgers on new files in ``folder``."""
    counter = itertools.count(1)

    def make() -> Ledger:
        return SQLiteLedger(folder / f"ledger-{next(counter)}.sqlite3")

    return make


def expect(name: str, expected: Mapping[str, Any], observed: Mapping[str, Any]) -> SafetyCheck:
    """A check that passes when every expected value was observed exactly.

    The detail lists each mismatch, or the observed values when all matched,
    so a report always shows what was measured rather than a bare verdict.
    """
    mismatches = [
        f"{key}: expected {value!r}, observed {observed.get(key, _ABSENT)!r}"
        for key, value in expected.items()
        if observed.get(key, _ABSENT) != value
    ]
    if mismatches:
        return SafetyCheck(name, False, "; ".join(mismatches))
    return SafetyCheck(name, True, ", ".join(f"{k}={observed[k]}" for k in expected))


async def run_checks(
    action_name: str,
    checks: Sequence[tuple[str, CheckFn]],
    *,
    ledger_factory: LedgerFactory,
    comparison: str | None = None,
) -> SafetyReport:
    """Run each check on its own fresh ledger; an unexpected exception is a FAIL."""
    results: list[SafetyCheck] = []
    for name, check in checks:
        ledger = ledger_factory()
        try:
            results.append(await check(ledger))
        except Exception as exc:
            results.append(SafetyCheck(name, False, f"raised {bounded_error(exc)}"))
        finally:
            await ledger.close()
    return SafetyReport(action_name, results, comparison=comparison)


def run_suite(suite: Callable[[], Any]) -> SafetyReport:
    """Call a zero-argument suite, sync or async, and return its report."""
    outcome = suite()
    if inspect.isawaitable(outcome):

        async def wait() -> Any:
            return await outcome

        outcome = asyncio.run(wait())
    if type(outcome) is not SafetyReport:
        raise TypeError(
            f"run_safety_suite() returned {type(outcome).__qualname__}, not a SafetyReport"
        )
    return outcome
