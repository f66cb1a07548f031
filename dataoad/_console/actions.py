"""The console's three actions, each the runner's own verb with its audit record.

Verify now runs the verifier registered for the receipt's action through
``recover_pending`` (read-only, as ``dataoad recover`` does); reopen frees the
key of a definitive failure; release removes a claim a v0.1 worker left
unstarted. Each names its operator and asks for a reason, and each is
refused by the runner exactly as from the command line.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from typing import Any, Final

from dataoad._errors import DataoadError
from dataoad._runner import ActionRunner

__all__ = ["ACTIONS", "ActionRefused", "run_action", "verifier_for"]

#: The actions a console may run, by the path segment that names them.
ACTIONS: Final = ("verify", "reopen", "release")


class ActionRefused(Exception):
    """An action the console will not run as asked; the message says why."""


def verifier_for(verifiers: Any, action_name: str) -> Any:
    """The verifier registered for ``action_name`` (a mapping's entry, or the one verifier)."""
    if verifiers is None:
        return None
    if isinstance(verifiers, Mapping):
        return verifiers.get(action_name)
    return verifiers


async def run_action(
    open_writer: Callable[[], Awaitable[Any]],
    action: str,
    receipt: Any,
    *,
    operator: str,
    reason: str,
    verifiers: Any,
) -> str:
    """Run ``action`` on ``receipt``; the outcome in words, or ActionRefused."""
    if action not in ACTIONS:
        raise ActionRefused(f"unknown action {action!r}")
    if not reason.strip():
        raise ActionRefused("say why: a reason is required, and recorded in the audit")
    if not operator.strip():
        raise ActionRefused("say who you are: an operator name is required")
    verifier = verifier_for(verifiers, receipt.action_name) if action == "verify" else None
    if action == "verify" and verifier is None:
        raise ActionRefused(
            f"no verifier is registered for {receipt.action_name!r} (dataoad serve --verifiers)"
        )
    ledger = await open_writer()
    try:
        runner = ActionRunner(ledger, namespace=receipt.namespace)
        who = {"operator": operator, "reason": reason}
        if action == "verify":
            assert verifier is not None
            result = await runner.recover_pending(receipt.action_id, verifier, **who)
            return f"verified: now {result.status.value}"
        if action == "reopen":
            await runner.reopen(receipt.action_id, **who)
            return "reopened: the key is free again"
        await runner.release_unstarted(receipt.action_id, **who)
        return "released: the key is free again"
    except DataoadError as problem:
        text = str(problem).splitlines()[0] if str(problem) else type(problem).__name__
        raise ActionRefused(text) from problem
    finally:
        close = getattr(ledger, "close", None)
        if close is not None:
            await close()
