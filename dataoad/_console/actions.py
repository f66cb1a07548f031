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

from dataoad._console.data import held_by_a_live_lease
from dataoad._errors import DataoadError
from dataoad._runner import ActionRunner

__all__ = ["ACTIONS", "LIVE_LEASE", "ActionRefused", "run_action", "verifier_for"]

#: The actions a console may run, by the path segment that names them.
ACTIONS: Final = ("verify", "reopen", "release")


#: Why a claim whose worker still renews its lease is not verified from here.
LIVE_LEASE: Final = (
    "its worker ({owner}) still holds the claim's lease, so it may be running the operation "
    "and could commit after the verifier looked; wait until the lease runs out (the claim then "
    "shows in the queue), or stop the worker and run dataoad recover"
)


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
            current = await ledger.get(receipt.action_id)
            if current is not None and await held_by_a_live_lease(ledger, current):
                raise ActionRefused(LIVE_LEASE.format(owner=current.owner))
            result = await runner.recover_pending(receipt.action_id, verifier, **who)
            if result.replayed:
                return f"already {result.status.value}: the verifier was not asked"
            return f"verified: now {result.status.value}"
        if action == "reopen":
            await runner.reopen(receipt.action_id, **who)
            if receipt.retired_at is not None:
                return "already reopened: nothing changed"
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
