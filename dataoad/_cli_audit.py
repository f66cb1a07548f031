"""The operator audit on the command line: who settled what, and the flags that name them.

``--operator`` and ``--reason`` go on every verb that changes the ledger;
``dataoad audit`` lists the records newest first; ``receipts show`` prints a
receipt's own records below it. Reading never writes.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from datetime import datetime
from typing import Any

from dataoad._auditing import OperatorStamp
from dataoad._cli_common import EXIT_OK, CommandError, UsageError
from dataoad._cli_render import printable
from dataoad._errors import InvalidArgumentError
from dataoad._operator import OperatorRecord

__all__ = [
    "add_audit_command",
    "operator_options",
    "records_of",
    "render_records",
    "show_audit",
    "stamp_of",
]

#: How many records ``dataoad audit`` shows unless told otherwise.
DEFAULT_AUDIT_LIMIT = 50


def operator_options(parser: argparse.ArgumentParser) -> None:
    """``--operator`` and ``--reason`` for a verb that changes the ledger."""
    parser.add_argument(
        "--operator",
        metavar="NAME",
        default=None,
        help="who runs this, for the audit (default: the OS user)",
    )
    parser.add_argument(
        "--reason", metavar="TEXT", default=None, help="why, for the audit (dataoad audit)"
    )


def stamp_of(verb: str, args: argparse.Namespace, namespace: str | None) -> OperatorStamp:
    """The audit stamp of ``args``, checked before the verb touches the ledger."""
    try:
        return OperatorStamp.of(verb, args.operator, args.reason, namespace)
    except InvalidArgumentError as problem:
        raise UsageError(f"--operator/--reason: {problem}") from None


def add_audit_command(commands: Any, ledger_option: Any) -> None:
    """Register ``dataoad audit``."""
    audit = commands.add_parser(
        "audit",
        help="who ran which operator verb on what, and why (newest first)",
        epilog="records outlive the receipts they name: pruning keeps them",
    )
    ledger_option(audit)
    audit.add_argument("--since", metavar="ISO-TIME", help="only records at or after this time")
    audit.add_argument("--operator", metavar="NAME", help="only this operator's records")
    audit.add_argument("--action-id", metavar="ACTION_ID", help="only records of this action")
    audit.add_argument(
        "--limit",
        type=int,
        default=DEFAULT_AUDIT_LIMIT,
        metavar="N",
        help=f"at most N records (default {DEFAULT_AUDIT_LIMIT})",
    )
    audit.add_argument("--json", action="store_true", help="machine-readable output")


def _since(text: str | None) -> datetime | None:
    if text is None:
        return None
    try:
        moment = datetime.fromisoformat(text)
    except ValueError:
        raise UsageError(
            f"--since {text!r} is not an ISO time (2026-12-01T09:00:00+00:00)"
        ) from None
    if moment.tzinfo is None:
        raise UsageError(f"--since {text!r} needs a time zone (+00:00 or Z)")
    return moment


async def records_of(ledger: Any, **filters: Any) -> list[OperatorRecord]:
    """The ledger's audit records (none from a ledger that keeps no audit)."""
    audit = getattr(ledger, "audit", None)
    if audit is None:
        return []
    return list(await audit(**filters))


def render_records(records: Sequence[OperatorRecord]) -> str:
    """One line per record, newest first: when, who from where, what, outcome, why."""
    lines = []
    for r in records:
        at = "?" if r.at is None else r.at.isoformat(timespec="seconds")
        target = r.action_id or "(many)"
        why = f' reason="{printable(r.reason)}"' if r.reason else ""
        lines.append(
            f"{at}  {printable(r.operator)}@{printable(r.host)}  {r.verb} {target}: "
            f"{printable(r.outcome)}{why}"
        )
    return "\n".join(lines)


async def show_audit(ledger: Any, args: argparse.Namespace, namespace: str | None) -> int:
    """``dataoad audit``."""
    if not 1 <= args.limit <= 100_000:
        raise UsageError("--limit must be between 1 and 100000")
    if getattr(ledger, "audit", None) is None:
        raise CommandError("this ledger keeps no operator audit")
    records = await records_of(
        ledger,
        since=_since(args.since),
        operator=args.operator,
        namespace=namespace,
        action_id=args.action_id,
        limit=args.limit,
    )
    if args.json:
        print(json.dumps([dict(r.to_json()) for r in records], indent=2, ensure_ascii=False))
    elif records:
        print(render_records(records))
    else:
        print("no operator records match")
    return EXIT_OK
