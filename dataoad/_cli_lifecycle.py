"""Operator commands of the receipt lifecycle: ``reopen`` and ``receipts prune``.

Both change what the ledger holds, so both ask first (``--yes`` for cron
and deploy jobs, which have no terminal). Pruning deletes only what the
retention rule allows (``_lifecycle``), in small batches, and ``--export``
writes each batch to an owner-only JSON-lines file, synced to disk, before
any of it is deleted.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
from collections.abc import Callable, Sequence
from datetime import timedelta
from pathlib import Path
from typing import Any, Final

from dataoad._cli_audit import operator_options, stamp_of
from dataoad._cli_common import EXIT_OK, CommandError, UsageError
from dataoad._cli_render import receipt_dict, render_receipt, status_text
from dataoad._errors import InvalidArgumentError
from dataoad._identity import check_namespace
from dataoad._lifecycle import DEFAULT_PRUNE_STATUSES
from dataoad._receipt import ActionReceipt
from dataoad._status import ActionStatus

__all__ = ["add_lifecycle_commands", "check_cli_namespace", "parse_age", "prune", "reopen"]

_AGE: Final = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([smhdw])\s*$", re.IGNORECASE)
_UNIT_SECONDS: Final = {"s": 1, "m": 60, "h": 3600, "d": 86_400, "w": 604_800}

Confirm = Callable[[str, bool], None]


def parse_age(text: str) -> timedelta:
    """``30d``, ``12h``, ``90m``, ``3600s`` or ``2w`` as a duration (argparse type)."""
    match = _AGE.match(text)
    if match is None:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not an age; use a number and a unit: 30d, 12h, 90m, 3600s, 2w"
        )
    seconds = float(match.group(1)) * _UNIT_SECONDS[match.group(2).lower()]
    if not 0 < seconds <= 100 * 365 * 86_400:
        raise argparse.ArgumentTypeError(f"{text!r} must be more than 0 and at most 100 years")
    return timedelta(seconds=seconds)


def _statuses(text: str) -> list[ActionStatus]:
    chosen = []
    for part in text.split(","):
        try:
            chosen.append(ActionStatus(part.strip().upper()))
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"{part.strip()!r} is not a status to prune; use confirmed, failed or unknown "
                "(PENDING claims are never pruned)"
            ) from None
    return chosen


def check_cli_namespace(namespace: str | None) -> str | None:
    """``--namespace`` checked like the runner's, or None (every namespace)."""
    try:
        return check_namespace(namespace, optional=True)
    except InvalidArgumentError as problem:
        raise UsageError(f"--namespace: {problem}") from None


def add_lifecycle_commands(commands: Any, receipts: Any, ledger_option: Any) -> None:
    """Register ``reopen`` and ``receipts prune``."""
    reopening = commands.add_parser(
        "reopen",
        help="free the key of a definitive FAILED receipt so it can be claimed afresh",
        epilog="the old receipt stays readable by its id; CONFIRMED, UNKNOWN and PENDING "
        "receipts are refused",
    )
    ledger_option(reopening)
    reopening.add_argument("action_id", metavar="ACTION_ID")
    reopening.add_argument("--yes", action="store_true", help="do not ask for confirmation")
    operator_options(reopening)

    pruning = receipts.add_parser(
        "prune",
        help="delete completed receipts older than an age (retention)",
        epilog="only completed receipts in the named statuses (default confirmed,failed); "
        "UNKNOWN only when named, PENDING never. Age is measured from a receipt's last "
        "change. Run it from cron or a deploy job with --yes.",
    )
    ledger_option(pruning)
    operator_options(pruning)
    pruning.add_argument(
        "--older-than",
        type=parse_age,
        required=True,
        metavar="AGE",
        help="last changed at least this long ago: 30d, 12h, 90m, 3600s, 2w",
    )
    pruning.add_argument(
        "--status",
        type=_statuses,
        action="append",
        metavar="STATUS[,STATUS]",
        help="final statuses to delete (repeatable): confirmed, failed, unknown; "
        "default confirmed,failed",
    )
    pruning.add_argument(
        "--dry-run", action="store_true", help="count what would be deleted; delete nothing"
    )
    pruning.add_argument(
        "--export",
        metavar="FILE.jsonl",
        type=Path,
        help="append every receipt to this file (one JSON object per line, owner-only, "
        "synced) before it is deleted",
    )
    pruning.add_argument(
        "--batch-size", type=int, default=500, metavar="N", help="receipts per batch (500)"
    )
    pruning.add_argument("--yes", action="store_true", help="do not ask for confirmation")
    pruning.add_argument("--json", action="store_true", help="machine-readable output")


async def reopen(
    runner: Any, receipt: ActionReceipt, args: argparse.Namespace, confirm: Confirm
) -> int:
    """``dataoad reopen ACTION_ID``."""
    if receipt.retired_at is not None:
        # Nothing to do, and saying "reopened" again would not be true.
        print(
            f"action {receipt.action_id} already gave up its key "
            f"{receipt.idempotency_key!r} at {receipt.retired_at.isoformat()}; nothing changed"
        )
        return EXIT_OK
    confirm(
        f"Reopen action {receipt.action_id} ({receipt.action_name}, key "
        f"{receipt.idempotency_key}, now {status_text(receipt.final_status)}) so the key "
        "can be claimed afresh?",
        args.yes,
    )
    await runner.reopen(receipt.action_id, operator=args.operator, reason=args.reason)
    print(
        f"reopened {receipt.action_id}; key {receipt.idempotency_key!r} is free again "
        "(the old receipt stays readable)"
    )
    print(render_receipt(await runner.receipt(receipt.action_id)))
    return EXIT_OK


class _Export:
    """An owner-only JSON-lines file each batch is appended to and synced before deletion."""

    def __init__(self, path: Path) -> None:
        if path.is_dir():
            raise CommandError(f"--export {path} is a folder")
        if not path.parent.is_dir():
            raise CommandError(f"--export: folder {path.parent} does not exist")
        # Not through a link someone else placed; and a file that was there
        # already is made owner-only too, as the receipts it will hold need.
        try:
            fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW, 0o600)
        except OSError as problem:
            raise CommandError(f"--export {path}: {problem.strerror or problem}") from None
        if os.fstat(fd).st_uid != os.geteuid():
            os.close(fd)
            raise CommandError(f"--export {path} belongs to another user; name a new file")
        os.fchmod(fd, 0o600)
        self.path = path
        self.file = os.fdopen(fd, "a", encoding="utf-8")
        self.written = 0

    def __call__(self, batch: Sequence[ActionReceipt]) -> None:
        try:
            for receipt in batch:
                self.file.write(json.dumps(receipt_dict(receipt), ensure_ascii=False) + "\n")
            self.file.flush()
            os.fsync(self.file.fileno())  # on disk before a single one is deleted
        except OSError as problem:
            # The export failed, not the ledger: nothing of this batch was deleted.
            raise CommandError(
                f"--export {self.path}: {problem.strerror or problem}; this batch was not deleted"
            ) from None
        self.written += len(batch)

    def close(self) -> None:
        with contextlib.suppress(OSError):  # what was written was synced batch by batch
            self.file.close()


def _age_text(age: timedelta) -> str:
    """``30d`` as "30 days", ``90m`` as "90 minutes": the age as the operator gave it."""
    seconds = int(age.total_seconds())
    for unit, size in (("day", 86_400), ("hour", 3_600), ("minute", 60)):
        if seconds >= size and seconds % size == 0:
            count = seconds // size
            return f"{count} {unit}{'' if count == 1 else 's'}"
    return f"{seconds} second{'' if seconds == 1 else 's'}"


async def prune(ledger: Any, args: argparse.Namespace, confirm: Confirm) -> int:
    """``dataoad receipts prune``."""
    statuses = tuple(s for group in (args.status or [DEFAULT_PRUNE_STATUSES]) for s in group)
    if not 1 <= args.batch_size <= 10_000:
        raise UsageError("--batch-size must be between 1 and 10000")
    namespace = check_cli_namespace(args.namespace)
    # The age is the ledger's to judge, by its own clock (the server's, the
    # file's): this host's clock never sets the cut-off.
    older_than = args.older_than.total_seconds()
    named = ",".join(s.value.lower() for s in ActionStatus if s in statuses)
    where = "" if namespace is None else f" in namespace {namespace!r}"
    age = f"stored more than {_age_text(args.older_than)} ago by the ledger's clock"
    count = await ledger.prune(
        older_than=older_than, statuses=statuses, namespace=namespace, dry_run=True
    )
    summary: dict[str, Any] = {
        "statuses": [s.value for s in ActionStatus if s in statuses],
        "namespace": namespace,
        "older_than_seconds": older_than,
        "dry_run": bool(args.dry_run),
        "matching": count,
        "deleted": 0,
    }
    if args.dry_run or count == 0:
        if args.json:
            print(json.dumps(summary, indent=2))
        elif args.dry_run:
            print(
                f"would delete {count} {named} receipt(s){where} {age} (dry run: nothing deleted)"
            )
        else:
            print(f"nothing to prune: no {named} receipt{where} {age}")
        return EXIT_OK
    stamp_of("prune", args, namespace)  # a bad name refused before the question is asked
    confirm(f"Delete {count} {named} receipt(s){where} {age}?", args.yes)
    export = None if args.export is None else _Export(args.export)
    try:
        deleted = await ledger.prune(
            older_than=older_than,
            statuses=statuses,
            namespace=namespace,
            batch_size=args.batch_size,
            before_delete=export,
            operator=args.operator,
            reason=args.reason,
        )
    finally:
        if export is not None:
            export.close()
    if args.json:
        summary["deleted"] = deleted
        if export is not None:
            summary["exported"] = export.written
            summary["export"] = str(args.export)
        print(json.dumps(summary, indent=2))
        return EXIT_OK
    print(f"deleted {deleted} receipt(s){where}")
    if export is not None:
        print(
            f"exported {export.written} to {args.export}"
            + (
                f" ({export.written - deleted} changed while pruning and were kept)"
                if export.written > deleted
                else ""
            )
        )
    return EXIT_OK
