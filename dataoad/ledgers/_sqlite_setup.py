"""Opening a SQLite ledger file: created, inspected and migrated under the writer lock.

A new file is created and given its schema while its creator holds the
writer lock, so no other process ever meets it empty but mid-creation; a
file that looks wrong is looked at again under that lock before it is
called anything; schema steps run under it too.
"""

from __future__ import annotations

import asyncio
import contextlib
import sqlite3
from pathlib import Path

from dataoad.ledgers._sqlite_file import (
    APPLICATION_ID,
    SCHEMA_VERSION,
    LedgerFileError,
    create_private_file,
    inspect_file,
    refuse_empty_file,
)
from dataoad.ledgers._sqlite_schema import MIGRATIONS
from dataoad.ledgers._writer_lock import WriterLock

__all__ = ["initialise", "open_file"]


async def open_file(path: Path, writer: WriterLock, busy_timeout: float) -> int | None:
    """The schema version of the ledger file at ``path``, creating it if it is missing."""
    # One stat of a local file, as every open has always done on the loop.
    if not path.exists():  # noqa: ASYNC240
        await asyncio.to_thread(_create, path, writer, busy_timeout)
    # Quick and read-only: a current ledger opens without ever waiting on
    # the writer lock, so inspecting one works while a writer is stuck.
    try:
        return inspect_file(path)
    except LedgerFileError as refused:
        # Perhaps caught mid-creation by another process (its switch to WAL,
        # its first schema step): creators hold the writer lock, so look
        # again under it before calling the file anything. With no lock
        # file, no Dataoad process ever wrote there: nothing to wait for,
        # and no lock file is left beside a foreign file.
        if not writer.path.exists():
            raise
        try:
            return await asyncio.to_thread(_inspect_locked, path, writer, busy_timeout)
        except OSError:
            raise refused from None


def _inspect_locked(path: Path, writer: WriterLock, busy_timeout: float) -> int | None:
    with writer.hold(busy_timeout):
        return inspect_file(path)


def _create(path: Path, writer: WriterLock, busy_timeout: float) -> None:
    """Create a new ledger file and its schema, all under the writer lock."""
    with writer.hold(busy_timeout):
        if not create_private_file(path):
            return  # another process created it (and initialised it, under this lock)
        try:
            with contextlib.closing(sqlite3.connect(path, isolation_level=None)) as db:
                _migrate(db, None)
        except BaseException:
            # Ours, and nothing of a ledger in it: leave no empty file behind.
            with contextlib.suppress(OSError):
                path.unlink()
            raise


def initialise(db: sqlite3.Connection, path: Path, writer: WriterLock, busy_timeout: float) -> None:
    """Migrate the schema of the file ``db`` is open on (run on the connection's thread)."""
    with writer.hold(busy_timeout):
        # Re-check under the writer lock: another process may have just
        # migrated the file.
        version = inspect_file(path)
        if version == SCHEMA_VERSION:
            return
        if version is None:
            # Empty under the writer lock: no Dataoad process is creating it.
            refuse_empty_file(path)
        _migrate(db, version)


def _migrate(db: sqlite3.Connection, version: int | None) -> None:
    """Apply every schema step after ``version``; the writer lock is held."""
    if version is None:
        db.execute("PRAGMA journal_mode = WAL")
    db.execute("BEGIN IMMEDIATE")
    try:
        for step in range((version or 0) + 1, SCHEMA_VERSION + 1):
            for statement in MIGRATIONS[step]:
                db.execute(statement)
        db.execute(f"PRAGMA application_id = {APPLICATION_ID}")
        db.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
        db.execute("COMMIT")
    except BaseException:
        db.execute("ROLLBACK")
        raise
