"""The SQLite ledger's look-ups of claims' keys: one, or many in one statement per 64 keys.

The grouped writer (``_sqlite_group``) answers a group's claims of held
keys from this read; a statement per look-up cost the connection's thread a
hand-over of the interpreter lock each.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence
from datetime import datetime
from typing import Any, Final

from dataoad._receipt import ActionReceipt
from dataoad.ledgers._codec import receipt_of
from dataoad.ledgers._statements import Statements

__all__ = ["KEYS_READ_TOGETHER", "holder", "holders", "stored_receipt"]

#: How many keys one read of held keys asks for: a group's look-ups are
#: padded to the next of these (the last key again), so a handful of
#: statements serve every group size from the connection's statement cache.
KEYS_READ_TOGETHER: Final = (4, 16, 64)


def stored_receipt(row: Sequence[Any]) -> ActionReceipt:
    """The receipt a SQLite row holds (times stored as ISO 8601 text)."""
    return receipt_of(row, datetime.fromisoformat)


def holder(sql: str, args: tuple[Any, ...], db: sqlite3.Connection) -> ActionReceipt | None:
    """On the connection's thread: the receipt holding a claim's key, or None."""
    rows = db.execute(sql, args).fetchall()
    return stored_receipt(rows[0]) if rows else None


def holders(
    statements: Statements, db: sqlite3.Connection, keys: list[tuple[str, str, str]]
) -> list[Any]:
    """On the connection's thread: the receipt holding each key (None if free), in order."""
    found: list[Any] = [None] * len(keys)
    widest = KEYS_READ_TOGETHER[-1]
    for start in range(0, len(keys), widest):
        chunk = keys[start : start + widest]
        size = next(n for n in KEYS_READ_TOGETHER if n >= len(chunk))
        args: list[Any] = []
        for n in range(size):
            place = min(n, len(chunk) - 1)  # padded with the last key
            args.extend(chunk[place])
            args.append(start + place)
        for place, *row in db.execute(statements.holders(size).sql, args).fetchall():
            found[place] = stored_receipt(row)
    return found
