"""``dataoad receipts list``: the newest receipts first, a bounded page, and a hint when more match."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from dataoad._cli_common import EXIT_OK, UsageError
from dataoad._cli_lifecycle import check_cli_namespace
from dataoad._cli_render import receipt_dict, render_table
from dataoad._ledger import InspectableLedger
from dataoad._status import ActionStatus

__all__ = ["DEFAULT_LIST_LIMIT", "add_list_command", "list_receipts"]

#: How many receipts ``receipts list`` shows unless told otherwise (newest first).
DEFAULT_LIST_LIMIT = 50


def add_list_command(sub: Any, ledger_option: Callable[[argparse.ArgumentParser], None]) -> None:
    """Register ``receipts list`` under ``sub``."""
    listing = sub.add_parser(
        "list", help=f"list receipts, newest first ({DEFAULT_LIST_LIMIT} unless --limit or --all)"
    )
    ledger_option(listing)
    listing.add_argument(
        "--status",
        type=_status_arg,
        metavar="STATUS",
        help="final status: confirmed, failed or unknown (any case)",
    )
    listing.add_argument("--pending", action="store_true", help="only PENDING (stranded?) claims")
    listing.add_argument(
        "--stale",
        action="store_true",
        help="only PENDING claims whose lease ran out (what recover --stale would settle)",
    )
    listing.add_argument("--action", metavar="NAME", help="only this action name")
    listing.add_argument("--since", metavar="ISO-TIME", help="created at or after this time")
    how_many = listing.add_mutually_exclusive_group()
    how_many.add_argument(
        "--limit",
        type=_positive_int,
        default=DEFAULT_LIST_LIMIT,
        help=f"the newest this many (default {DEFAULT_LIST_LIMIT})",
    )
    how_many.add_argument("--all", action="store_true", help="every matching receipt")
    listing.add_argument("--json", action="store_true", help="machine-readable output")


async def list_receipts(ledger: InspectableLedger, args: argparse.Namespace) -> int:
    """Print the newest matching receipts (a table, or ``--json``); a hint on stderr if more."""
    limit = None if args.all else args.limit
    receipts = await ledger.receipts(
        final_status=args.status,
        pending=True if args.pending else None,
        stale=True if args.stale else None,
        action_name=args.action,
        namespace=check_cli_namespace(args.namespace),
        since=_since(args.since),
        # One more than shown tells whether there are more.
        limit=None if limit is None else limit + 1,
        newest_first=True,
    )
    more = limit is not None and len(receipts) > limit
    receipts = receipts[:limit] if more else receipts
    if args.json:
        print(json.dumps([receipt_dict(r) for r in receipts], indent=2))
    else:
        print(render_table(receipts))
    if more:
        # On stderr, so --json stays one JSON document.
        print(
            f"(the newest {limit} shown; more match: --limit N or --all)",
            file=sys.stderr,
        )
    return EXIT_OK


def _status_arg(text: str) -> ActionStatus:
    try:
        return ActionStatus(text.upper())
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a status; use confirmed, failed or unknown"
        ) from None


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be a whole number of at least 1, not {text!r}")
    return value


def _since(text: str | None) -> datetime | None:
    if not text:
        return None
    try:
        since = datetime.fromisoformat(text)
    except ValueError:
        raise UsageError(f"--since must be an ISO 8601 time, not {text!r}") from None
    return since if since.tzinfo is not None else since.replace(tzinfo=UTC)
