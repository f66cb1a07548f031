"""Read a crash test's ledger file afterwards: the receipts the recovery left."""

from __future__ import annotations

import asyncio
from pathlib import Path

from dataoad import ActionReceipt
from dataoad.ledgers.sqlite_reader import SQLiteReader

__all__ = ["stored_receipts"]


def stored_receipts(path: str | Path) -> list[ActionReceipt]:
    """Every receipt in the SQLite ledger at ``path`` (read-only)."""

    async def read() -> list[ActionReceipt]:
        reader = SQLiteReader(path)
        try:
            return list(await reader.receipts())
        finally:
            await reader.close()

    return asyncio.run(read())
