"""The ``recover`` verb: settle an UNKNOWN receipt or a stranded claim read-only.

A verifier that gives no answer proves nothing: the operator is shown what
it said, and a completed receipt is left exactly as it was.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from dataoad._cli_common import EXIT_OK, EXIT_STILL_UNKNOWN, CommandError, UsageError
from dataoad._cli_common import confirm as _confirm
from dataoad._cli_lifecycle import check_cli_namespace
from dataoad._cli_loading import import_attribute
from dataoad._cli_render import printable, receipt_dict, render_receipt, render_table, status_text
from dataoad._events import EventKind, RunnerEvent
from dataoad._receipt import ActionReceipt
from dataoad._status import ActionStatus, ClaimState

__all__ = ["NoAnswer", "load_verifier", "recover", "recover_stale"]


def load_verifier(spec: str, option: str = "--verifier") -> Any:
    """The verifier ``module:attribute`` names; a class is made with no arguments.

    Every failure is one line: UsageError for a malformed ``spec``,
    CommandError for one that cannot be imported or made.
    """
    try:
        verifier = import_attribute(spec)
    except ValueError as problem:
        raise UsageError(f"{option} {problem}") from None
    except LookupError as problem:
        raise CommandError(str(problem)) from None
    if isinstance(verifier, type):
        try:
            verifier = verifier()  # a verifier class with no arguments
        except Exception as problem:
            raise CommandError(
                f"{option} {spec}: a class is made with no arguments, and this one "
                f"refused: {type(problem).__name__}: {problem}"
            ) from None
    return verifier


class NoAnswer:
    """Keeps what a verifier that gave no usable answer said (the ledger keeps only its type)."""

    def __init__(self) -> None:
        self.said: str | None = None

    def on_event(self, event: RunnerEvent) -> None:
        if event.kind is EventKind.VERIFICATION_FAILED:
            self.said = str(event.fields.get("said"))


async def recover(
    runner: Any,
    receipt: ActionReceipt,
    verifier: Any,
    args: argparse.Namespace,
    no_answer: NoAnswer,
) -> int:
    if receipt.claim_state is ClaimState.PENDING and receipt.attempts == 0:
        raise CommandError(
            f"action {receipt.action_id} never started an attempt, so nothing ran and there "
            f"is nothing to verify; free its key with: dataoad release-unstarted {receipt.action_id}"
        )
    question = (
        f"Verify action {receipt.action_id} ({receipt.action_name}, key "
        f"{receipt.idempotency_key}, now {status_text(receipt.final_status)}/"
        f"{receipt.claim_state.value}) read-only and record the result?"
    )
    if receipt.claim_state is ClaimState.PENDING:
        question = (
            f"Action {receipt.action_id} is PENDING: make sure the worker that claimed it has "
            "stopped (a live worker may still be calling the provider). " + question
        )
    _confirm(question, args.yes)
    result = await runner.recover_pending(
        receipt.action_id, verifier, operator=args.operator, reason=args.reason
    )
    observations = result.receipt.observations
    last = observations[-1] if observations else None
    said = None if last is None else (last.reason or last.error)
    counted = None if last is None else last.status.value
    recorded = True
    if result.replayed:
        # Settled before: recover_pending asked no verifier and changed nothing.
        said = counted = None
    elif no_answer.said is not None:
        # No answer is no evidence: a completed receipt was left as it was.
        said, counted = no_answer.said, ActionStatus.UNKNOWN.value
        recorded = receipt.claim_state is ClaimState.PENDING
    if args.json:
        print(
            json.dumps(
                {
                    "status": result.status.value,
                    "verifier": None
                    if counted is None
                    else {"counted_as": counted, "said": said, "recorded": recorded},
                    "receipt": receipt_dict(result.receipt),
                },
                indent=2,
            )
        )
    else:
        print(render_receipt(result.receipt))
        if result.replayed:
            print(f"Already {result.status.value}: the verifier was not asked; nothing changed")
        if counted is not None:
            print(f"Verifier: counted as {counted}" + (f" ({printable(said)})" if said else ""))
        if not recorded:
            print("The verifier gave no answer, so nothing was recorded: the receipt is unchanged")
    if result.status is ActionStatus.UNKNOWN:
        print(
            f"Still UNKNOWN: the read-back proved nothing either way (exit status "
            f"{EXIT_STILL_UNKNOWN}); try again later with dataoad recover {receipt.action_id}",
            file=sys.stderr,
        )
        return EXIT_STILL_UNKNOWN
    return EXIT_OK


async def recover_stale(ledger: Any, verifier: Any, args: argparse.Namespace) -> int:
    from dataoad._runner import ActionRunner

    stale = await ledger.receipts(stale=True, namespace=check_cli_namespace(args.namespace))
    if not stale:
        print("no stale claims: every PENDING claim's lease still holds")
        return EXIT_OK
    print(render_table(stale))
    how = "with the verifier" if verifier is not None else "as UNKNOWN (no --verifier)"
    _confirm(
        f"Take over these {len(stale)} expired claim(s): release the unstarted ones and "
        f"settle the others read-only {how}?",
        args.yes,
    )
    results = []
    # A runner sweeps its own namespace only: one per namespace found.
    for namespace in sorted({r.namespace for r in stale}):
        runner = ActionRunner(ledger, namespace=namespace)
        results += await runner.recover_stale(
            verifier, limit=max(len(stale), 1), operator=args.operator, reason=args.reason
        )
    settled = {r.receipt.action_id for r in results}
    for result in results:
        print(f"{result.receipt.action_id}: {result.status.value}")
    released = [r.action_id for r in stale if r.attempts == 0 and r.action_id not in settled]
    for action_id in released:
        if await ledger.get(action_id) is None:
            print(f"{action_id}: released (never started)")
    unknown = any(r.status is ActionStatus.UNKNOWN for r in results)
    return EXIT_STILL_UNKNOWN if unknown else EXIT_OK
