"""Turning ``--ledger URL`` (and ``--table``) into a ledger, for every operator command.

A SQLite URL or path opens the file (read-only through the reader when the
command only reads); a PostgreSQL URL opens a table. Every problem is a
one-line usage or command error.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

from dataoad._cli_common import CommandError, UsageError
from dataoad._ledger import InspectableLedger
from dataoad.ledgers.postgres import PostgresLedger

__all__ = [
    "DEFAULT_TABLE",
    "is_postgres",
    "ledger_url",
    "open_ledger",
    "postgres_ledger",
    "sqlite_path",
    "table_name",
    "open_ledger_pair",
]

DEFAULT_TABLE = "public.dataoad_receipts"
_URL_SCHEME = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*)://")


def is_postgres(url: str) -> bool:
    return url.startswith(("postgresql://", "postgres://"))


def sqlite_path(url: str) -> Path:
    # sqlite:///abs/path and sqlite:////abs/path both mean /abs/path.
    rest = url.removeprefix("sqlite://")
    return Path("/" + rest.lstrip("/")) if rest.startswith("/") else Path(rest)


def postgres_ledger(url: str, table: str) -> PostgresLedger:
    schema, _, name = table.rpartition(".")
    return PostgresLedger(url, schema=schema or "public", table=name, min_size=1, max_size=2)


def ledger_url(url: str | None, table: str | None) -> str:
    """The URL, checked: a known scheme, and --table only where it means something."""
    if not url:
        raise UsageError(
            "no ledger given: pass --ledger sqlite:///path or postgresql://..., "
            "or set DATAOAD_LEDGER"
        )
    scheme = _URL_SCHEME.match(url)
    if scheme and not is_postgres(url) and scheme.group(1).lower() != "sqlite":
        raise UsageError(
            f"unsupported ledger URL scheme {scheme.group(1)!r}: use sqlite:///path/to/file, "
            "a file path, or postgresql://..."
        )
    if table is not None and not is_postgres(url):
        raise UsageError("--table applies to PostgreSQL ledgers only; a SQLite ledger has one")
    return url


def table_name(table: str | None) -> str:
    return table or os.environ.get("DATAOAD_LEDGER_TABLE") or DEFAULT_TABLE


def open_ledger(url: str | None, table: str | None, *, read_only: bool) -> InspectableLedger:
    from dataoad.ledgers.sqlite import SQLiteLedger
    from dataoad.ledgers.sqlite_reader import SQLiteReader

    url = ledger_url(url, table)
    if is_postgres(url):
        return postgres_ledger(url, table_name(table))
    path = sqlite_path(url)
    if path.is_dir():
        raise CommandError(f"{path} is a folder, not a ledger file")
    if read_only:
        return SQLiteReader(path)  # type: ignore[return-value]
    if not path.is_file():
        # Inspection must never create an empty ledger where none was.
        raise CommandError(f"no ledger file at {path}")
    return SQLiteLedger(path)


def open_ledger_pair(url: str | None, table: str | None) -> tuple[Any, Any, bool]:
    """For the console: a maker of read-only ledgers, an async maker of a writing one,
    and whether the ledger is PostgreSQL.

    Checked now (a bad URL or a missing file is refused before serving).
    """
    open_ledger(url, table, read_only=False)  # checks the URL and that the file exists

    async def writer() -> Any:
        return open_ledger(url, table, read_only=False)

    checked = ledger_url(url, table)
    return (lambda: open_ledger(url, table, read_only=True)), writer, is_postgres(checked)
