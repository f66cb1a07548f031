"""Every ``execute`` option with a value that is not its default, and a runner that records them.

Shared by the test that every front end takes each option
(``tests/front_ends/test_execute_options.py``) and the test that each engine's
decorator hands them on (``tests/engines/test_engine_options.py``).
"""

from __future__ import annotations

from typing import Any

from dataoad import ActionReceipt, ActionRunner, InMemoryLedger, RetryPolicy, VerificationResult
from dataoad._arguments import EXECUTE_OPTIONS

__all__ = ["ENGINE_EXPECTED", "VALUES", "RecordingRunner", "recording_runner"]


def _verifier(receipt: ActionReceipt) -> VerificationResult:
    return VerificationResult.unknown(reason="not looked")


#: A value for each option that differs from its default.
VALUES: dict[str, Any] = {
    "provider_reference": "ref-1",
    "verifier": _verifier,
    "risk": "money",
    "metadata": {"ticket": 7},
    "policy": RetryPolicy(max_attempts=2, retry_on_failed=True),
    "wait_in_progress": 1.5,
    "expires_after": 3600.0,
}

#: What ``execute`` must see from an engine's step given ``VALUES``: all of them
#: but ``expires_after``, which no engine step offers (a re-run always replays).
ENGINE_EXPECTED: dict[str, Any] = {**VALUES, "expires_after": None}


class RecordingRunner(ActionRunner):
    """Records the options each ``execute`` call was given (then runs it)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.seen: list[dict[str, Any]] = []

    async def execute(self, *args: Any, **kwargs: Any) -> Any:
        self.seen.append({k: kwargs.get(k) for k in EXECUTE_OPTIONS})
        return await super().execute(*args, **kwargs)


def recording_runner() -> RecordingRunner:
    """A RecordingRunner on a fresh in-memory ledger."""
    return RecordingRunner(InMemoryLedger())
