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
import re
import sys
from typing import Any

from dataoad._cli_audit import (
    add_audit_command,
    operator_options,
    render_records,
    show_audit,
)
from dataoad._cli_common import (
    EXIT_ERROR,
    EXIT_INTERRUPTED,
    EXIT_OK,
    EXIT_PIPE_CLOSED,
    EXIT_STILL_UNKNOWN,
    EXIT_USAGE,
    CommandError,
    UsageError,
)
from dataoad._cli_common import confirm as _confirm
from dataoad._cli_doctor import add_doctor_command, doctor
from dataoad._cli_lifecycle import add_lifecycle_commands, check_cli_namespace, prune, reopen
from dataoad._cli_listing import add_list_command, list_receipts
from dataoad._cli_open import (
    DEFAULT_TABLE,
    is_postgres,
    ledger_url,
    open_ledger,
    postgres_ledger,
    sqlite_path,
    table_name,
)
from dataoad._cli_recover import NoAnswer, load_verifier, recover, recover_stale
from dataoad._cli_render import receipt_dict, render_receipt
from dataoad._cli_serve import add_serve_command
from dataoad._errors import ActionNotFoundError, DataoadError
from dataoad._ledger import InspectableLedger
from dataoad._receipt import ActionReceipt

__all__ = ["add_commands", "run_ledger_command"]

_ID_PREFIX = re.compile(r"^[0-9a-f]{1,32}$")
#: The shortest id prefix a verb that writes accepts: one character would act on
#: whichever receipt happens to be alone with it today.
WRITE_PREFIX = 8


def add_commands(commands: Any, parser_class: type[argparse.ArgumentParser]) -> None:
    """Register ``receipts``, ``recover`` and ``release-unstarted``."""

    def table_option(p: argparse.ArgumentParser) -> None:
        p.add_argument(
            "--table",
            metavar="[SCHEMA.]TABLE",
            default=None,
            help="PostgreSQL only: the ledger's table (default: $DATAOAD_LEDGER_TABLE or "
            f"{DEFAULT_TABLE})",
        )

    def url_option(p: argparse.ArgumentParser) -> None:
        p.add_argument(
            "--ledger",
            metavar="URL",
            default=os.environ.get("DATAOAD_LEDGER"),
            help="sqlite:///path/to/file (or a plain path) or postgresql://...; "
            "default: $DATAOAD_LEDGER",
        )
        table_option(p)

    def ledger_option(p: argparse.ArgumentParser) -> None:
        url_option(p)
        p.add_argument(
            "--namespace",
            metavar="NS",
            default=None,
            help='only receipts of this namespace ("" is the default one); default: every '
            "namespace (a command on one receipt then acts in that receipt's own)",
        )

    ledger = commands.add_parser(
        "ledger", help="create or upgrade a ledger's schema, or check that it is durable"
    )
    ledger_sub = ledger.add_subparsers(
        dest="ledger_command", metavar="COMMAND", parser_class=parser_class
    )
    migrate = ledger_sub.add_parser(
        "migrate",
        help="create the ledger schema, or upgrade it; safe to run from several hosts at once",
    )
    migrate.add_argument(
        "url",
        metavar="URL",
        nargs="?",
        default=os.environ.get("DATAOAD_LEDGER"),
        help="postgresql://... or a SQLite file path; default: $DATAOAD_LEDGER",
    )
    table_option(migrate)
    add_doctor_command(ledger_sub, url_option)

    receipts = commands.add_parser("receipts", help="inspect stored receipts")
    sub = receipts.add_subparsers(
        dest="receipts_command", metavar="COMMAND", parser_class=parser_class
    )
    add_list_command(sub, ledger_option)
    show = sub.add_parser(
        "show", help="every field of one receipt, by action id (or a unique prefix) or by key"
    )
    ledger_option(show)
    show.add_argument("action_id", metavar="ACTION_ID", nargs="?", help="the id or a unique prefix")
    show.add_argument("--key", metavar="KEY", help="find the receipt by its idempotency key")
    show.add_argument("--action", metavar="NAME", help="with --key: the action name")
    show.add_argument("--json", action="store_true", help="machine-readable output")

    recover = commands.add_parser(
        "recover",
        help="settle an UNKNOWN receipt, or a stranded PENDING one, with a read-only verifier",
        epilog=f"exit status: 0 settled (CONFIRMED or FAILED), {EXIT_STILL_UNKNOWN} still "
        "UNKNOWN after read-back, 1 error, 2 usage",
    )
    ledger_option(recover)
    recover.add_argument(
        "action_id", metavar="ACTION_ID", nargs="?", help=f"the id or a {WRITE_PREFIX}+ prefix"
    )
    recover.add_argument("--key", metavar="KEY", help="find the receipt by its idempotency key")
    recover.add_argument("--action", metavar="NAME", help="with --key: the action name")
    recover.add_argument("--json", action="store_true", help="machine-readable output")
    recover.add_argument(
        "--stale",
        action="store_true",
        help="instead of one ACTION_ID: every claim whose lease ran out (released if it never "
        "started; else verified, or UNKNOWN without --verifier)",
    )
    recover.add_argument("--verifier", metavar="MODULE:ATTRIBUTE")
    recover.add_argument("--yes", action="store_true", help="do not ask for confirmation")
    operator_options(recover)
    release = commands.add_parser(
        "release-unstarted", help="remove a PENDING claim that never started an attempt"
    )
    ledger_option(release)
    release.add_argument(
        "action_id", metavar="ACTION_ID", nargs="?", help=f"the id or a {WRITE_PREFIX}+ prefix"
    )
    release.add_argument("--key", metavar="KEY", help="find the receipt by its idempotency key")
    release.add_argument("--action", metavar="NAME", help="with --key: the action name")
    release.add_argument("--yes", action="store_true", help="do not ask for confirmation")
    operator_options(release)
    add_lifecycle_commands(commands, sub, ledger_option)
    add_audit_command(commands, ledger_option)
    add_serve_command(commands, url_option)


#: Receipts of one key read to find its holder; a key with more must be named
#: by action and namespace, whose holder the ledger finds directly.
_KEY_HISTORY = 1000


async def _find_one(ledger: InspectableLedger, args: argparse.Namespace) -> ActionReceipt:
    """The receipt named by an id, a unique id prefix, or --key (and --action)."""
    namespace = check_cli_namespace(args.namespace)
    key = getattr(args, "key", None)
    if key is not None:
        if args.action_id is not None:
            raise UsageError("give an action id or --key, not both")
        # Newest first: a key reopened or expired many times keeps its whole
        # history, and the one receipt holding it is the newest of its action.
        found = await ledger.receipts(
            idempotency_key=key,
            action_name=args.action,
            namespace=namespace,
            limit=_KEY_HISTORY,
            newest_first=True,
        )
        if not found:
            where = f" of action {args.action!r}" if args.action else ""
            raise CommandError(f"no receipt with key {key!r}{where}")
        if len(found) == _KEY_HISTORY:
            if args.action is None or namespace is None:
                # A listing cut short may leave out another action's holder.
                raise CommandError(
                    f"key {key!r} has more than {_KEY_HISTORY - 1} receipts; add --action "
                    "and --namespace to name the one holding it"
                )
            holder = await ledger.find(args.action, key, namespace)
            return holder if holder is not None else found[0]
        # A key's receipts that gave it up (expired, reopened) are only history.
        holding = [r for r in found if r.holds_key] or found
        if len({(r.namespace, r.action_name) for r in holding}) > 1:
            names = ", ".join(
                sorted(
                    {
                        f"{r.namespace}/{r.action_name}" if r.namespace else r.action_name
                        for r in holding
                    }
                )
            )
            hint = (
                "add --action or --namespace"
                if any(r.namespace for r in holding)
                else ("add --action")
            )
            raise CommandError(f"key {key!r} is used by several actions ({names}); {hint}")
        return holding[0]
    if args.action_id is None:
        raise UsageError("name the receipt: ACTION_ID (or a unique prefix), or --key KEY")
    wanted = args.action_id.lower()
    writes = args.command != "receipts"
    if writes and _ID_PREFIX.match(wanted) and len(wanted) < WRITE_PREFIX:
        raise UsageError(
            f"give at least {WRITE_PREFIX} characters of the id (or --key) to a command that "
            f"changes the ledger, not {args.action_id!r}"
        )
    if not _ID_PREFIX.match(wanted):
        # Not a runner's id or a prefix of one: only an exact id can match.
        exact = await ledger.get(args.action_id)
        if exact is None or (namespace is not None and exact.namespace != namespace):
            raise ActionNotFoundError(f"no action with id {args.action_id!r}")
        return exact
    found = await ledger.receipts(action_id_prefix=wanted, namespace=namespace, limit=2)
    if not found:
        raise CommandError(
            f"no action with id {args.action_id!r}"
            + ("" if len(wanted) == 32 else " (or starting so)")
        )
    if len(found) > 1:
        raise CommandError(f"{args.action_id!r} matches several actions; give more of the id")
    return found[0]


async def _migrate(args: argparse.Namespace) -> int:
    from dataoad.ledgers._sqlite_file import inspect_file
    from dataoad.ledgers.postgres import SCHEMA_VERSION as PG_SCHEMA_VERSION
    from dataoad.ledgers.sqlite import SCHEMA_VERSION as SQLITE_SCHEMA_VERSION
    from dataoad.ledgers.sqlite import SQLiteLedger

    url = ledger_url(args.url, args.table)
    if is_postgres(url):
        ledger = postgres_ledger(url, table_name(args.table))
        try:
            found = await ledger.migrate()
        finally:
            await ledger.close()
        where, target = f"{ledger.schema}.{ledger.table}", PG_SCHEMA_VERSION
    else:
        path = sqlite_path(url)
        if path.is_dir():
            raise CommandError(f"{path} is a folder, not a ledger file")
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


async def _run(args: argparse.Namespace) -> int:
    from dataoad._runner import ActionRunner

    if args.command == "ledger":
        if args.ledger_command == "doctor":
            url = ledger_url(args.ledger, args.table)
            file = None if is_postgres(url) else sqlite_path(url)
            return await doctor(
                args, url, lambda: postgres_ledger(url, table_name(args.table)), file
            )
        if args.ledger_command != "migrate":
            raise UsageError("name a subcommand: ledger migrate URL, or ledger doctor")
        return await _migrate(args)
    inspecting = args.command == "receipts"
    # A prune's dry run only counts: like list and show it never opens a
    # SQLite file for writing (no writer lock, no schema, no journal).
    read_only = args.command == "audit" or (
        inspecting
        and (
            args.receipts_command in ("list", "show")
            or (args.receipts_command == "prune" and args.dry_run)
        )
    )
    ledger = open_ledger(args.ledger, args.table, read_only=read_only)
    try:
        if args.command == "audit":
            return await show_audit(ledger, args, check_cli_namespace(args.namespace))
        if args.command == "receipts" and args.receipts_command == "list":
            return await list_receipts(ledger, args)
        if args.command == "receipts" and args.receipts_command == "show":
            receipt = await _find_one(ledger, args)
            records = list(reversed(receipt.operator_records))
            if args.json:
                shown = {
                    **receipt_dict(receipt),
                    "operator_records": [r.to_json() for r in records],
                }
                print(json.dumps(shown, indent=2))
            else:
                print(render_receipt(receipt))
                if records:
                    print(f"operator records (newest first):\n{render_records(records)}")
            return EXIT_OK
        if args.command == "receipts" and args.receipts_command == "prune":
            return await prune(ledger, args, _confirm)
        if inspecting:
            raise UsageError(
                "name a subcommand: receipts list | receipts show ACTION_ID | receipts prune"
            )
        if args.command == "recover":
            named = args.action_id is not None or args.key is not None
            if args.stale == named:
                raise UsageError(
                    "name one ACTION_ID (or --key), or --stale for every expired claim"
                )
            if named and args.verifier is None:
                raise UsageError("recover ACTION_ID needs --verifier MODULE:ATTRIBUTE")
        verifier = (
            load_verifier(args.verifier)
            if args.command == "recover" and args.verifier is not None
            else None
        )
        if args.command == "recover" and args.stale:
            return await recover_stale(ledger, verifier, args)
        receipt = await _find_one(ledger, args)
        no_answer = NoAnswer()
        # Verbs act in the receipt's own namespace (a runner sees only its own).
        runner = ActionRunner(ledger, namespace=receipt.namespace, observers=[no_answer])
        if args.command == "reopen":
            return await reopen(runner, receipt, args, _confirm)
        if args.command == "recover":
            return await recover(runner, receipt, verifier, args, no_answer)
        if args.command == "release-unstarted":
            _confirm(
                f"Release claim {receipt.action_id} ({receipt.action_name}, key "
                f"{receipt.idempotency_key}) so the key can be claimed again?",
                args.yes,
            )
            await runner.release_unstarted(
                receipt.action_id, operator=args.operator, reason=args.reason
            )
            print(f"released {receipt.action_id}; key {receipt.idempotency_key!r} is free again")
            return EXIT_OK
        raise UsageError(f"unknown command {args.command!r}")
    finally:
        await ledger.close()


def run_ledger_command(args: argparse.Namespace) -> int:
    """Run an operator command; every failure is one line on stderr."""
    try:
        return asyncio.run(_run(args))
    except BrokenPipeError:
        # The reader stopped reading (``| head``): no error, and nothing more
        # to flush into the closed pipe at exit.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return EXIT_PIPE_CLOSED
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
    except KeyboardInterrupt:
        # asyncio.run cancelled the command first, so a verb cut short has
        # already appended its "cancelled" record to the audit.
        print(f"dataoad {args.command}: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
