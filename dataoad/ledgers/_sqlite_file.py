"""A SQLite ledger file: how it is recognised, created and checked before it is opened."""

from __future__ import annotations

import atexit
import os
import sqlite3
import threading
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Final, NoReturn

from dataoad._errors import LedgerUnusableError

__all__ = [
    "APPLICATION_ID",
    "ClockTexts",
    "SCHEMA_VERSION",
    "LedgerFileError",
    "clock_text",
    "create_private_file",
    "inspect_file",
    "refuse_empty_file",
    "sqlite_clock",
]

#: ``PRAGMA application_id`` of a Dataoad ledger file ("DAOD").
APPLICATION_ID: Final = 0x44414F44
#: The schema version this code writes; older files are migrated on open.
SCHEMA_VERSION: Final = 7


class LedgerFileError(LedgerUnusableError):
    """The file is not a usable Dataoad ledger; it was left unchanged."""


def create_private_file(path: Path) -> bool:
    """Create ``path`` readable and writable by its owner only, if it is missing.

    Returns whether this call created it (an empty file, to be initialised
    while the caller still holds the writer lock).
    """
    try:
        fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)
    except FileExistsError:
        return False
    os.close(fd)
    return True


def refuse_empty_file(path: Path) -> NoReturn:
    """A file that is empty under the writer lock is not a ledger.

    A Dataoad process creates and initialises a new file under the writer
    lock, so one seen empty under that lock was written by something else,
    or left by a process that died before initialising it: either way
    nothing of a ledger is in it, and it is not silently taken over.
    """
    raise LedgerFileError(
        f"{path} holds no Dataoad ledger (an empty file, or an empty SQLite database); a "
        "new ledger is created only where no file exists. If a Dataoad process died "
        "while creating it, delete the file and open the ledger again"
    )


def sqlite_clock() -> Callable[[], datetime]:
    """The clock SQLite itself reads for ``'now'``: the host's, as its C library gives it.

    A WAL ledger is shared only by processes on one host (SQLite's shared
    memory index cannot span hosts), and every process there reads the one
    kernel clock, so every writer of the file reads the same clock. It is
    read inside SQLite, not through Python's ``time`` or ``datetime``, so a
    process whose clock is patched (``freezegun``, ``time-machine``, a
    monkeypatched ``datetime``) cannot take over a live lease or expire a
    fresh receipt. Resolution: one millisecond.

    It replaces reading the file's modification time after ``utime``: that
    gave the same clock at a coarser step, but dirtied the file's inode on
    every write, and each commit's fsync then wrote it to the file system's
    journal too (about a tenth of a lone FULL call, measured).
    """
    return _SQLITE_NOW


class _SQLiteNow:
    """SQLite's ``'now'``, read on one private in-memory connection per process.

    Private, so reading the clock never touches a ledger file, its
    connection or its writer lock. One per process, opened on first use and
    closed at exit, so no ledger leaves a connection of its own behind
    (Python warns about a collected connection left open). Any thread may
    read it.
    """

    def __init__(self) -> None:
        self._start()

    def _start(self) -> None:
        self._lock = threading.Lock()
        self._db: sqlite3.Connection | None = None

    def __call__(self) -> datetime:
        with self._lock:
            if self._db is None:
                self._db = sqlite3.connect(":memory:", check_same_thread=False)
            (text,) = self._db.execute(_NOW_SQL).fetchone()
        return datetime.fromisoformat(text).replace(tzinfo=UTC)

    def close(self) -> None:
        """Close the connection (a later reading opens a new one)."""
        with self._lock:
            db, self._db = self._db, None
        if db is not None:
            db.close()

    def start_after_fork(self) -> None:
        """In a forked child: a connection and a lock of its own.

        The parent's connection must not be used across the fork, and its
        lock may have been held by a parent thread at the fork. The
        parent's connection is kept, never used nor collected.
        """
        _INHERITED.append(self._db)
        self._start()


#: SQLite's ``'now'`` as ISO 8601 text (UTC, milliseconds).
_NOW_SQL: Final = "SELECT strftime('%Y-%m-%dT%H:%M:%f', 'now')"
_INHERITED: list[sqlite3.Connection | None] = []
_SQLITE_NOW: Final = _SQLiteNow()
atexit.register(_SQLITE_NOW.close)
if hasattr(os, "register_at_fork"):  # not on Windows
    os.register_at_fork(after_in_child=_SQLITE_NOW.start_after_fork)


def inspect_file(path: Path) -> int | None:
    """The schema version of an existing ledger file, or None for an empty file.

    Opens the file read-only, so a file that is rejected is left untouched.
    Raises LedgerFileError for a file that is not a Dataoad ledger, is
    corrupt, or was written by a newer Dataoad.
    """
    if path.stat().st_size == 0:
        return None
    try:
        probe = sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro", uri=True)
    except sqlite3.Error as exc:
        raise LedgerFileError(f"{path}: cannot be opened as SQLite: {exc}") from exc
    try:
        application_id = probe.execute("PRAGMA application_id").fetchone()[0]
        user_version = probe.execute("PRAGMA user_version").fetchone()[0]
        tables = {
            name for (name,) in probe.execute("SELECT name FROM sqlite_master WHERE type = 'table'")
        }
    except sqlite3.OperationalError as exc:
        # Not corruption: SQLite could not get at a file it needs.
        raise LedgerFileError(f"{path}: cannot be opened: {exc}{_access_hint(path)}") from exc
    except sqlite3.DatabaseError as exc:
        raise LedgerFileError(f"{path}: not a SQLite database, or corrupt: {exc}") from exc
    finally:
        probe.close()
    if application_id == 0 and user_version == 0 and not tables:
        return None  # an empty SQLite database: ours to initialise
    if application_id != APPLICATION_ID:
        raise LedgerFileError(f"{path}: not a Dataoad ledger (application_id {application_id:#x})")
    if user_version > SCHEMA_VERSION:
        raise LedgerFileError(
            f"{path}: written with ledger schema {user_version}, newer than the {SCHEMA_VERSION} "
            "this Dataoad understands; upgrade Dataoad to open it"
        )
    if "receipts" not in tables or user_version < 1:
        raise LedgerFileError(f"{path}: Dataoad ledger without its receipts table (corrupt?)")
    return int(user_version)


def _access_hint(path: Path) -> str:
    """What this user may not do that a ledger needs (write the file and its folder)."""
    missing = [
        what
        for what, where in (("the file", path), ("its folder", path.parent))
        if not os.access(where, os.R_OK | os.W_OK)
    ]
    if not missing:
        return ""
    return f" (no read and write permission on {' or '.join(missing)}; SQLiteReader needs only read access)"


def clock_text(moment: datetime) -> str:
    """A time as the file stores it: UTC, always with microseconds, so text sorts like time."""
    return moment.astimezone(UTC).isoformat(timespec="microseconds")


class ClockTexts:
    """One reading of the ledger's clock as stored text, and the lease ends from it.

    A group's writes share one reading: its text, and that of the end of
    each lease granted at it, are written once per group, not per write.
    """

    __slots__ = ("_ends", "now", "text")

    def __init__(self, now: datetime | None) -> None:
        self.now = now
        self.text = None if now is None else clock_text(now)
        self._ends: dict[float, str] = {}

    def after(self, lease: float) -> str:
        """The stored text of ``now`` plus ``lease`` seconds."""
        end = self._ends.get(lease)
        if end is None:
            assert self.now is not None
            end = self._ends[lease] = clock_text(self.now + timedelta(seconds=lease))
        return end
