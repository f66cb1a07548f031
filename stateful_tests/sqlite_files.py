"""The runner machine's SQLite ledger files: a fresh one, and reads of it.

Every example starts on a new ledger file. Creating one (the writer lock,
the switch to WAL, the schema, each step synced) took about 5 ms of an
example's 70, so each is a copy of one empty ledger this process created
with SQLiteLedger itself. Opening a copy runs the same checks as opening
any existing file; creation has tests of its own (tests/ledgers).

The runner machine reads every receipt after every step (``_observe``).
Through the observer's ledger each read is a hop to its connection's thread
and back through the event loop, and those hops were about a quarter of a
SQLite example's time. A read-only connection of the machine's own reads the
same committed rows, with the ledger's own statements and decoding, without
a hop. It reads storage, not a connection's view of it: no uncommitted write
of any client can show through.

Not ``SQLiteReader``, the operators' read-only reader: it sends each read
to a worker thread (the hop this module saves), has no ``find``, and opens
a file without a write-ahead log as immutable, so on a fresh copy it would
never see a later commit.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import os
import sqlite3
import tempfile
from pathlib import Path
from typing import Final

from dataoad import ActionReceipt, SQLiteLedger
from dataoad.ledgers._sqlite_holders import stored_receipt as _receipt_of
from dataoad.ledgers.sqlite import _SQL

__all__ = ["SQLiteStorageReads", "new_ledger_file"]

_EMPTY: list[bytes] = []


def new_ledger_file(path: Path) -> None:
    """Write an empty, current ledger at ``path`` (owner-only, as SQLiteLedger creates one)."""
    if not _EMPTY:
        with tempfile.TemporaryDirectory(prefix="dataoad-empty-ledger-") as folder:
            template = Path(folder) / "ledger.sqlite3"

            async def create() -> None:
                ledger = SQLiteLedger(template)
                try:
                    await ledger.find("", "", "")  # opens, so creates, the file
                finally:
                    await ledger.close()

            # On a thread of its own: the caller's thread keeps its event loop as it was.
            with concurrent.futures.ThreadPoolExecutor(1) as pool:
                pool.submit(asyncio.run, create()).result()
            # Closed by its last connection: checkpointed, the whole ledger is in the file.
            assert not template.with_name(template.name + "-wal").exists()
            _EMPTY.append(template.read_bytes())
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as file:
        file.write(_EMPTY[0])


#: Never met in practice (WAL readers take no lock); bounded all the same.
_BUSY_SECONDS: Final = 5.0


class SQLiteStorageReads:
    """``find`` and ``get`` of a SQLite ledger file, synchronous and read-only."""

    def __init__(self, path: Path) -> None:
        self._path = path
        self._conn: sqlite3.Connection | None = None
        # Most rows are unchanged from one step to the next: each distinct
        # row is decoded once (receipts are immutable, so sharing is safe).
        self._decoded: dict[tuple[object, ...], ActionReceipt] = {}

    @staticmethod
    def reads_like_the_ledger(ledger: object) -> bool:
        """Whether ``ledger`` reads as SQLiteLedger does (a planted bug may change its reads)."""
        if not isinstance(ledger, SQLiteLedger):
            return False
        cls = type(ledger)
        return cls.find is SQLiteLedger.find and cls.get is SQLiteLedger.get

    def ready(self) -> bool:
        """Whether the file can be read (it exists from the machine's start)."""
        if self._conn is None and self._path.exists():
            self._conn = sqlite3.connect(
                f"{self._path.as_uri()}?mode=ro",
                uri=True,
                timeout=_BUSY_SECONDS,
                isolation_level=None,  # each SELECT sees the newest commit
            )
        return self._conn is not None

    def find(self, action_name: str, idempotency_key: str, namespace: str) -> ActionReceipt | None:
        """The receipt holding the key, or None (SQLiteLedger.find's statement)."""
        find = _SQL["find"]
        values = {
            "namespace": namespace,
            "action_name": action_name,
            "idempotency_key": idempotency_key,
        }
        return self._one(find.sql, tuple(find.bind(values)))

    def get(self, action_id: str) -> ActionReceipt | None:
        """The receipt with this id, or None (SQLiteLedger.get's statement)."""
        get = _SQL["get"]
        return self._one(get.sql, tuple(get.bind({"action_id": action_id})))

    def close(self) -> None:
        """Close the connection, if one was opened."""
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    def _one(self, sql: str, args: tuple[object, ...]) -> ActionReceipt | None:
        assert self._conn is not None, "ready() first"
        rows = self._conn.execute(sql, args).fetchall()
        if not rows:
            return None
        row = tuple(rows[0])
        receipt = self._decoded.get(row)
        if receipt is None:
            receipt = self._decoded[row] = _receipt_of(row)
        return receipt
