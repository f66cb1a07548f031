"""``dataoad ledger doctor``: would this ledger keep every claim it acknowledged?

Exit 0 when it would (through a crash, a power loss or a failover), 1 when
it might not (each reason printed with what to set) or it could not be
checked, 2 on a usage error. It writes nothing: a SQLite file is read in
place (never created), a PostgreSQL server is only asked for its settings.
"""

from __future__ import annotations

import argparse
import json
import sqlite3
from collections.abc import Callable
from pathlib import Path
from typing import Any

from dataoad._cli_common import EXIT_ERROR, EXIT_OK, CommandError, UsageError
from dataoad.ledgers._durability import DurabilityReport, file_system_of, judge_sqlite

__all__ = ["add_doctor_command", "doctor"]

#: What SQLiteLedger sets on every connection it opens (``synchronous``).
LEDGER_SYNCHRONOUS = "FULL"


def add_doctor_command(
    ledger_sub: Any, url_option: Callable[[argparse.ArgumentParser], None]
) -> None:
    """Register ``ledger doctor --ledger URL [--table T] [--json]``."""
    doctor = ledger_sub.add_parser(
        "doctor",
        help="say whether the ledger keeps every acknowledged claim through a crash or a "
        "failover, and what to set if not (exit 0 safe, 1 not)",
    )
    url_option(doctor)
    doctor.add_argument("--json", action="store_true", help="print the report as JSON")


def _sqlite_report(path: Path, synchronous: str) -> DurabilityReport:
    """The report of a ledger file as SQLiteLedger would open it, read without writing."""
    if path.is_dir():
        raise CommandError(f"{path} is a folder, not a ledger file")
    if not path.is_file():
        raise CommandError(f"no ledger file at {path}")
    try:
        db = sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=5)
        try:
            journal = str(db.execute("PRAGMA journal_mode").fetchone()[0]).lower()
        finally:
            db.close()
    except sqlite3.DatabaseError as problem:
        raise CommandError(f"{path} cannot be read as a SQLite file: {problem}") from None
    return judge_sqlite(
        {
            "journal_mode": journal,
            "synchronous": synchronous,
            "file_system": file_system_of(path),
            "path": str(path),
        }
    )


def _print(report: DurabilityReport, where: str, as_json: bool) -> None:
    if as_json:
        print(json.dumps({"ledger": where, **report.to_json()}, indent=2, default=str))
        return
    if report.safe:
        print(f"{where}: durable: every acknowledged claim survives a crash and a failover")
    else:
        print(f"{where}: NOT durable: an acknowledged claim could be lost")
        for reason in report.reasons:
            print(f"  - {reason}")
    shown = {k: v for k, v in report.settings.items() if k not in ("path", "standbys_unreadable")}
    print("  read: " + ", ".join(f"{k}={v}" for k, v in shown.items()))


async def doctor(
    args: argparse.Namespace, url: str, postgres: Callable[[], Any], sqlite_path: Path | None
) -> int:
    """Run the doctor on ``url``: a PostgreSQL ledger from ``postgres()``, else the file."""
    if sqlite_path is not None:
        report = _sqlite_report(sqlite_path, LEDGER_SYNCHRONOUS)
        where = str(sqlite_path)
    else:
        ledger = postgres()
        try:
            report = await ledger.durability()
        except ValueError as problem:  # asyncpg's word for a DSN it cannot parse
            raise UsageError(f"not a usable PostgreSQL URL: {problem}") from None
        finally:
            await ledger.close()
        where = f"{ledger.schema}.{ledger.table}"
    _print(report, where, args.json)
    return EXIT_OK if report.safe else EXIT_ERROR
