"""The guard every example test runs under: each injected ledger fault builds its scenario.

A fault a test injects into a ``FaultyLedger`` that never strikes leaves the
test's scenario unbuilt, and the test then passes for another reason (an
audit found such tests). So does a lost acknowledgement of a write its
condition refused: nothing was stored, as after a write that failed before
it, so the test checks the wrong fault.
"""

from __future__ import annotations

import contextlib
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

import pytest

from dataoad.testing import FaultyLedger, LedgerFaultError

__all__ = ["guarding_injected_faults"]


@contextlib.contextmanager
def guarding_injected_faults(
    monkeypatch: pytest.MonkeyPatch, *, unstruck_allowed: bool, refused_allowed: bool
) -> Iterator[None]:
    """Fail on leaving if an injected fault never struck, or an acknowledgement was
    lost of a write that stored nothing (unless the test allows it on purpose)."""
    made: list[FaultyLedger] = []
    build = FaultyLedger.__init__
    write = FaultyLedger._write
    refused: list[str] = []

    def register(self: FaultyLedger, *args: Any, **kwargs: Any) -> None:
        build(self, *args, **kwargs)
        made.append(self)

    async def noting_write(
        self: FaultyLedger, method: str, call: Callable[[], Awaitable[Any]]
    ) -> Any:
        outcome: list[Any] = []

        async def answered() -> Any:
            outcome.append(await call())
            return outcome[0]

        try:
            return await write(self, method, answered)
        except LedgerFaultError as lost:
            if outcome and "acknowledgement lost" in str(lost) and not stored(outcome[0]):
                refused.append(f"{method} -> {_answer(outcome[0])}")
            raise

    monkeypatch.setattr(FaultyLedger, "__init__", register)
    monkeypatch.setattr(FaultyLedger, "_write", noting_write)
    yield
    if not unstruck_allowed:
        left = {id(f): f._faults for f in made if f.pending_faults()}
        assert not left, f"injected faults never struck: {list(left.values())}"
    if not refused_allowed:
        assert not refused, f"acknowledgements lost of writes that stored nothing: {refused}"


def stored(outcome: Any) -> bool:
    """Whether a ledger write's answer says it stored something."""
    if isinstance(outcome, tuple):  # a claim: (receipt, created)
        return bool(outcome[1])
    return bool(outcome)  # True, or how many receipts were pruned


def _answer(outcome: Any) -> str:
    if isinstance(outcome, tuple):  # a claim answered by the key's holder
        return f"not created (held by {outcome[0].action_id})"
    return repr(outcome)
