"""Operator commands on a ledger: list and show receipts, recover, release.

A person finding an UNKNOWN charge at 3 a.m. must be able to see what is
known and settle it read-only without writing Python. Every problem is a
one-line error; nothing here ever invokes an operation.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from dataoad._canonical import RESERVED_METADATA_KEYS
from dataoad._cli_loading import import_attribute
from dataoad._errors import DataoadError
from dataoad._frozen import thaw
from dataoad._ledger import InspectableLedger
from dataoad._receipt import ActionReceipt
from dataoad._status import ActionStatus
from dataoad.ledgers.postgres import PostgresLedger

__all__ = ["add_commands", "run_ledger_command"]

EXIT_OK, EXIT_ERROR, EXIT_USAGE = 0, 1, 2


class CommandError(Exception):
    """A one-line reason the command failed (exit status 1)."""


class UsageError(Exception):
    """A one-line reason the command was used wrongly (exit status 2)."""


def add_commands(commands: Any, parser_class: type[argparse.ArgumentParser]) -> None:
    """Register ``receipts``, ``recover`` and ``release-unstarted``."""

    def table_option(p: argparse.ArgumentParser) -> None:
        p.add_argument(
            "--table",
            metavar="[SCHEMA.]TABLE",
            default=os.environ.get("DATAOAD_LEDGER_TABLE", "public.dataoad_receipts"),
            help="PostgreSQL only: the ledger's table (default: $DATAOAD_LEDGER_TABLE or "
            "public.dataoad_receipts)",
        )

    def ledger_option(p: argparse.ArgumentParser) -> None:
        p.add_argument(
            "--ledger",
            metavar="URL",
            default=os.environ.get("DATAOAD_LEDGER"),
            help="sqlite:///path/to/file (or a plain path) or postgresql://...; "
            "default: $DATAOAD_LEDGER",
        )
        table_option(p)

    ledger = commands.add_parser("ledger", help="create or upgrade a ledger's schema")
    ledger_sub = ledger.add_subparsers(
        dest="ledger_command", metavar="COMMAND", parser_class=parser_class
    )
    migrate = ledger_sub.add_parser(
        "migrate",
        help="create the ledger schema, or upgrade it; safe to run from several hosts at once",
    )
    migrate.add_argument("url", metavar="URL", help="postgresql://... or a SQLite file path")
    table_option(migrate)

    receipts = commands.add_parser("receipts", help="inspect stored receipts")
    sub = receipts.add_subparsers(
        dest="receipts_command", metavar="COMMAND", parser_class=parser_class
    )
    listing = sub.add_parser("list", help="list receipts, oldest first")
    ledger_option(listing)
    listing.add_argument("--status", choices=[s.value for s in ActionStatus], help="final status")
    listing.add_argument("--pending", action="store_true", help="only PENDING (stranded?) claims")
    listing.add_argument("--action", metavar="NAME", help="only this action name")
    listing.add_argument("--since", metavar="ISO-TIME", help="created at or after this time")
    listing.add_argument("--limit", type=int, default=None, help="at most this many")
    listing.add_argument("--json", action="store_true", help="machine-readable output")
    show = sub.add_parser("show", help="every field of one receipt")
    ledger_option(show)
    show.add_argument("action_id", metavar="ACTION_ID")
    show.add_argument("--json", action="store_true", help="machine-readable output")

    recover = commands.add_parser(
        "recover",
        help="settle an UNKNOWN receipt, or a stranded PENDING one, with a read-only verifier",
    )
    ledger_option(recover)
    recover.add_argument("action_id", metavar="ACTION_ID")
    recover.add_argument("--verifier", metavar="MODULE:ATTRIBUTE", required=True)
    recover.add_argument("--yes", action="store_true", help="do not ask for confirmation")
    release = commands.add_parser(
        "release-unstarted", help="remove a PENDING claim that never started an attempt"
    )
    ledger_option(release)
    release.add_argument("action_id", metavar="ACTION_ID")
    release.add_argument("--yes", action="store_true", help="do not ask for confirmation")


def _is_postgres(url: str) -> bool:
    return url.startswith(("postgresql://", "postgres://"))


def _sqlite_path(url: str) -> Path:
    # sqlite:///abs/path and sqlite:////abs/path both mean /abs/path.
    rest = url.removeprefix("sqlite://")
    return Path("/" + rest.lstrip("/")) if rest.startswith("/") else Path(rest)


def _postgres_ledger(url: str, table: str) -> PostgresLedger:
    schema, _, name = table.rpartition(".")
    return PostgresLedger(url, schema=schema or "public", table=name, min_size=1, max_size=2)


def _open_ledger(url: str | None, table: str) -> InspectableLedger:
    from dataoad.ledgers.sqlite import SQLiteLedger

    if not url:
        raise UsageError(
            "no ledger given: pass --ledger sqlite:///path or postgresql://..., "
            "or set DATAOAD_LEDGER"
        )
    if _is_postgres(url):
        return _postgres_ledger(url, table)
    path = _sqlite_path(url)
    if not path.is_file():
        # Inspection must never create an empty ledger where none was.
        raise CommandError(f"no ledger file at {path}")
    return SQLiteLedger(path)


async def _migrate(args: argparse.Namespace) -> int:
    from dataoad.ledgers.postgres import SCHEMA_VERSION as PG_SCHEMA_VERSION
    from dataoad.ledgers.sqlite import SCHEMA_VERSION as SQLITE_SCHEMA_VERSION
    from dataoad.ledgers.sqlite import SQLiteLedger, inspect_file

    if _is_postgres(args.url):
        ledger = _postgres_ledger(args.url, args.table)
        try:
            found = await ledger.migrate()
        finally:
            await ledger.close()
        where, target = f"{ledger.schema}.{ledger.table}", PG_SCHEMA_VERSION
    else:
        path = _sqlite_path(args.url)
        if not path.parent.is_dir():
            raise CommandError(f"folder {path.parent} does not exist")
        found = (inspect_file(path) or 0) if path.is_file() else 0
        async with SQLiteLedger(path):  # opening creates or upgrades the file
            pass
        where, target = str(path), SQLITE_SCHEMA_VERSION
    if found == target:
        print(f"{where}: ledger schema {target}, up to date")
    else:
        print(f"{where}: ledger schema {found} -> {target}")
    return EXIT_OK


def _status(value: Any) -> str:
    return "-" if value is None else str(value.value)


def receipt_dict(receipt: ActionReceipt) -> dict[str, Any]:
    """A JSON-ready form of a receipt, every field included."""
    return {
        "action_id": receipt.action_id,
        "action_name": receipt.action_name,
        "idempotency_key": receipt.idempotency_key,
        "request_hash": receipt.request_hash,
        "provider_reference": receipt.provider_reference,
        "risk": receipt.risk,
        "claim_state": receipt.claim_state.value,
        "attempts": receipt.attempts,
        "execution_status": None
        if receipt.execution_status is None
        else receipt.execution_status.value,
        "verification_status": None
        if receipt.verification_status is None
        else receipt.verification_status.value,
        "final_status": None if receipt.final_status is None else receipt.final_status.value,
        "provider_request_id": receipt.provider_request_id,
        "error": receipt.error,
        "metadata": thaw(receipt.metadata),
        "attempt_records": [
            {
                "number": a.number,
                "started_at": a.started_at.isoformat(),
                "finished_at": None if a.finished_at is None else a.finished_at.isoformat(),
                "execution_status": None
                if a.execution_status is None
                else a.execution_status.value,
                "verification_status": None
                if a.verification_status is None
                else a.verification_status.value,
                "error": a.error,
                "provider_request_id": a.provider_request_id,
                "retry_decision": a.retry_decision,
            }
            for a in receipt.attempt_records
        ],
        "version": receipt.version,
        "created_at": receipt.created_at.isoformat(),
        "updated_at": receipt.updated_at.isoformat(),
    }


def render_table(receipts: Sequence[ActionReceipt]) -> str:
    """One aligned line per receipt."""
    header = ("ACTION ID", "ACTION", "KEY", "CLAIM", "FINAL", "ATTEMPTS", "UPDATED")
    rows = [
        (
            r.action_id,
            r.action_name,
            r.idempotency_key,
            r.claim_state.value,
            _status(r.final_status),
            str(r.attempts),
            r.updated_at.strftime("%Y-%m-%d %H:%M:%S"),
        )
        for r in receipts
    ]
    widths = [max(len(row[i]) for row in [header, *rows]) for i in range(len(header))]
    lines = [
        "  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip()
        for row in [header, *rows]
    ]
    lines.append(f"({len(rows)} receipt{'s' if len(rows) != 1 else ''})")
    return "\n".join(lines)


def render_receipt(receipt: ActionReceipt) -> str:
    """Every field, the attempt history and the verification observations."""
    data = receipt_dict(receipt)
    lines = [f"Receipt {receipt.action_id}"]
    for key in (
        "action_name",
        "idempotency_key",
        "provider_reference",
        "risk",
        "claim_state",
        "final_status",
        "execution_status",
        "verification_status",
        "attempts",
        "provider_request_id",
        "error",
        "request_hash",
        "version",
        "created_at",
        "updated_at",
    ):
        lines.append(f"  {key:<20} {data[key] if data[key] is not None else '-'}")
    lines.append("Attempts:")
    for attempt in data["attempt_records"] or []:
        lines.append(
            f"  #{attempt['number']} started {attempt['started_at']}, "
            f"finished {attempt['finished_at'] or '(never recorded)'}: "
            f"execution={attempt['execution_status'] or '-'}, "
            f"verification={attempt['verification_status'] or '-'}, "
            f"next={attempt['retry_decision'] or '-'}"
            + (f", error={attempt['error']}" if attempt["error"] else "")
        )
    if not data["attempt_records"]:
        lines.append("  (none: the operation was never invoked)")
    observations = data["metadata"].get("verification_observations", [])
    lines.append("Verification observations:")
    for o in observations:
        lines.append(
            f"  {o.get('observed_at', '?')} {o.get('source')} after attempt {o.get('attempt')}: "
            f"claimed {o.get('claimed', '-')}, counted as {o.get('status')}"
            + (
                f" (reference {o['verified_provider_reference']})"
                if o.get("verified_provider_reference")
                else ""
            )
            + (f" [{o['error']}]" if o.get("error") else "")
        )
    if not observations:
        lines.append("  (none)")
    meta = data["metadata"]
    if meta.get("provider_request_ids"):
        lines.append(
            f"Provider request ids: {', '.join(meta['provider_request_ids'])}"
            + (
                " (CONFLICT: possibly duplicate effects)"
                if meta.get("provider_request_id_conflict")
                else ""
            )
        )
    if meta.get("verification_conflict"):
        lines.append(
            "Verification conflict: observations contradict each other; a person must look"
        )
    if meta.get("recovery"):
        lines.append(f"Recovery: {json.dumps(meta['recovery'], sort_keys=True)}")
    caller = {k: v for k, v in meta.items() if k not in RESERVED_METADATA_KEYS}
    if caller:
        lines.append(f"Metadata: {json.dumps(caller, sort_keys=True)}")
    return "\n".join(lines)


def _load_verifier(spec: str) -> Any:
    try:
        verifier = import_attribute(spec)
    except ValueError as problem:
        raise UsageError(f"--verifier {problem}") from None
    except LookupError as problem:
        raise CommandError(str(problem)) from None
    if isinstance(verifier, type):
        verifier = verifier()  # a verifier class with no arguments
    return verifier


def _confirm(question: str, assume_yes: bool) -> None:
    if assume_yes:
        return
    if not sys.stdin or not sys.stdin.isatty():
        raise UsageError(f"{question} Refusing without --yes (no terminal to ask on)")
    answer = input(f"{question} [y/N] ").strip().lower()
    if answer not in ("y", "yes"):
        raise CommandError("cancelled; nothing was changed")


async def _run(args: argparse.Namespace) -> int:
    from dataoad._runner import ActionRunner

    if args.command == "ledger":
        if args.ledger_command != "migrate":
            raise UsageError("name a subcommand: ledger migrate URL")
        return await _migrate(args)
    ledger = _open_ledger(args.ledger, args.table)
    try:
        runner = ActionRunner(ledger)
        if args.command == "receipts" and args.receipts_command == "list":
            since = None
            if args.since:
                try:
                    since = datetime.fromisoformat(args.since)
                except ValueError:
                    raise UsageError(
                        f"--since must be an ISO 8601 time, not {args.since!r}"
                    ) from None
                if since.tzinfo is None:
                    since = since.replace(tzinfo=UTC)
            receipts = await ledger.receipts(
                final_status=ActionStatus(args.status) if args.status else None,
                pending=True if args.pending else None,
                action_name=args.action,
                since=since,
                limit=args.limit,
            )
            if args.json:
                print(json.dumps([receipt_dict(r) for r in receipts], indent=2))
            else:
                print(render_table(receipts))
            return EXIT_OK
        if args.command == "receipts" and args.receipts_command == "show":
            receipt = await runner.receipt(args.action_id)
            print(
                json.dumps(receipt_dict(receipt), indent=2)
                if args.json
                else render_receipt(receipt)
            )
            return EXIT_OK
        if args.command == "recover":
            verifier = _load_verifier(args.verifier)
            receipt = await runner.receipt(args.action_id)
            _confirm(
                f"Verify action {receipt.action_id} ({receipt.action_name}, key "
                f"{receipt.idempotency_key}, now {_status(receipt.final_status)}/"
                f"{receipt.claim_state.value}) read-only and record the result?",
                args.yes,
            )
            result = await runner.recover_pending(receipt.action_id, verifier)
            print(render_receipt(result.receipt))
            return EXIT_OK
        if args.command == "release-unstarted":
            receipt = await runner.receipt(args.action_id)
            _confirm(
                f"Release claim {receipt.action_id} ({receipt.action_name}, key "
                f"{receipt.idempotency_key}) so the key can be claimed again?",
                args.yes,
            )
            await runner.release_unstarted(receipt.action_id)
            print(f"released {receipt.action_id}; key {receipt.idempotency_key!r} is free again")
            return EXIT_OK
        raise UsageError("name a subcommand: receipts list | receipts show ACTION_ID")
    finally:
        await ledger.close()


def run_ledger_command(args: argparse.Namespace) -> int:
    """Run an operator command; every failure is one line on stderr."""
    try:
        return asyncio.run(_run(args))
    except UsageError as problem:
        print(f"dataoad {args.command}: error: {problem}", file=sys.stderr)
        return EXIT_USAGE
    except (CommandError, DataoadError) as problem:
        first_line = str(problem).splitlines()[0] if str(problem) else type(problem).__name__
        print(f"dataoad {args.command}: error: {first_line}", file=sys.stderr)
        return EXIT_ERROR
    except OSError as problem:
        print(
            f"dataoad {args.command}: error: cannot reach the ledger: "
            f"{type(problem).__name__}: {problem}",
            file=sys.stderr,
        )
        return EXIT_ERROR
    except Exception as problem:  # an operator gets one line, never a traceback
        print(
            f"dataoad {args.command}: error: {type(problem).__name__}: {problem}", file=sys.stderr
        )
        return EXIT_ERROR
