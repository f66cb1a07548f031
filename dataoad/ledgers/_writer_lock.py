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

Why a timed-out wait is taken up again: while another process holds the
lock for long, every write that timed out would leave one more helper
thread and descriptor queued in the kernel, without bound. The next
contended hold adopts the wait still queued instead (it is also further
ahead in the kernel's queue), so at most one is left behind per lock.
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
        self._closed = False
        self._pid = os.getpid()

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
                self._closed = True
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

    def adopt(self) -> bool:
        """Take up this abandoned wait again: once, before its thread closed it, and
        only in the process whose thread waits (a forked child has no such thread)."""
        if self._pid != os.getpid():
            return False
        with self._state:
            if self._closed or not self._abandoned:
                return False  # closed, or taken up by another hold already
            self._abandoned = False
            return True


class WriterLock:
    """Exclusive, fair, bounded: ``with lock.hold(timeout): <one statement>``.

    ``hold`` blocks its thread, so call it only on a thread that may block
    (the connection's own), never on an event loop.
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        #: A wait that timed out and may still be queued in the kernel (see above).
        self._left: _Wait | None = None

    def _queued_wait(self, fd: int) -> tuple[_Wait, int]:
        """The wait left queued, taken up again (``fd`` closed), or a new one on ``fd``."""
        # No lock of our own (one held at a fork would stay held in the
        # child): two holds that read the same wait cannot both adopt it.
        left, self._left = self._left, None
        if left is not None and left.adopt():
            os.close(fd)
            return left, left.fd
        wait = _Wait(fd)
        threading.Thread(target=wait.run, name="dataoad-sqlite-lock", daemon=True).start()
        return wait, fd

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
                wait, fd = self._queued_wait(fd)
                if not wait.outcome(timeout):
                    owned = False  # the helper thread closes it, unless taken up again
                    self._left = wait
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
