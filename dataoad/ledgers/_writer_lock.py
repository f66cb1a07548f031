"""The SQLite ledger's cross-process writer queue: ``flock`` on a sidecar file.

Why a queue of our own: SQLite's busy handler polls with growing sleeps, and
across processes a waiting writer can starve. The kernel queues ``flock``
waiters fairly, so writers take this lock first.

Why it is held on the statement's own thread: the lock must be held only
around the one write statement. Taken and released on the event loop, it
stayed held for as long as anything else kept the loop busy (a blocking
call, a slow task), and every other process waited. Here it is taken, the
statement runs and the lock is released in one function on the connection's
thread, whatever the loop is doing.

Why every hold opens its own descriptor: ``flock`` locks belong to an open
file description. A wait that timed out leaves its helper thread blocked in
the kernel; when that thread finally gets the lock it must be able to drop
it without touching a lock some later write holds, so each wait owns its
descriptor and closes it.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import threading
from collections.abc import Iterator
from pathlib import Path

from dataoad._errors import DataoadError

__all__ = ["LedgerBusyError", "WriterLock"]


class LedgerBusyError(DataoadError):
    """Another writer held the ledger's writer lock for longer than ``busy_timeout``.

    Nothing was written by the statement that waited. The runner turns it
    into an ActionPersistenceError (and invokes nothing when the write it
    needed is unproven).
    """


class _Wait:
    """One blocking ``flock`` on a helper thread, which its caller may abandon."""

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self.done = threading.Event()
        self.error: BaseException | None = None
        self._state = threading.Lock()
        self._abandoned = False

    def run(self) -> None:
        try:
            fcntl.flock(self.fd, fcntl.LOCK_EX)
        except BaseException as exc:
            self.error = exc
        with self._state:
            if self._abandoned:
                # The caller gave up: hand the lock straight back (closing
                # the descriptor releases it) so no writer waits on a ghost.
                os.close(self.fd)
                return
            self.done.set()

    def outcome(self, timeout: float) -> bool:
        """True once the lock is held; False, and the wait abandoned, after ``timeout``."""
        self.done.wait(timeout)
        with self._state:
            if self.done.is_set():
                return True
            self._abandoned = True
            return False


class WriterLock:
    """Exclusive, fair, bounded: ``with lock.hold(timeout): <one statement>``.

    ``hold`` blocks its thread, so call it only on a thread that may block
    (the connection's own), never on an event loop.
    """

    def __init__(self, path: Path) -> None:
        self.path = path

    @contextlib.contextmanager
    def hold(self, timeout: float) -> Iterator[None]:
        """Hold the lock for the block; LedgerBusyError if not had within ``timeout`` s."""
        fd = os.open(self.path, os.O_CREAT | os.O_RDWR, 0o600)
        owned = True
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                # Contended: queue in the kernel on a helper thread, so the
                # wait stays fair and still ends at the timeout.
                wait = _Wait(fd)
                threading.Thread(target=wait.run, name="dataoad-sqlite-lock", daemon=True).start()
                if not wait.outcome(timeout):
                    owned = False  # the helper thread closes it
                    raise LedgerBusyError(
                        f"{self.path}: another writer held the ledger's writer lock for more "
                        f"than {timeout:g} s (busy_timeout); nothing was written"
                    ) from None
                if wait.error is not None:
                    raise wait.error from None
            yield
        finally:
            if owned:
                os.close(fd)  # releases the lock
