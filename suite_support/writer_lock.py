"""Another process's hold on a SQLite ledger's writer lock, for tests and machines.

The ledger queues its writers on ``flock`` of ``<file>.lock``. A hold here
opens its own descriptor, as another process would, so the ledger's own
lock calls meet it exactly as they would meet a stopped or slow process.
"""

from __future__ import annotations

import asyncio
import fcntl
import os
from pathlib import Path
from types import TracebackType

__all__ = ["HeldWriterLock"]


class HeldWriterLock:
    """``flock`` held on ``<ledger path>.lock`` until ``release()`` (idempotent) or the block ends."""

    def __init__(self, ledger_path: str | os.PathLike[str]) -> None:
        self.path = Path(f"{os.fspath(ledger_path)}.lock")
        self._fd: int | None = os.open(self.path, os.O_CREAT | os.O_RDWR, 0o600)
        fcntl.flock(self._fd, fcntl.LOCK_EX)

    @property
    def held(self) -> bool:
        """Whether this hold still has the lock."""
        return self._fd is not None

    def release(self) -> None:
        """Let go (closing the descriptor drops the lock); later calls do nothing."""
        if self._fd is not None:
            fd, self._fd = self._fd, None
            os.close(fd)

    def release_after(self, seconds: float) -> None:
        """Let go after ``seconds`` on the running loop: a hung wait then ends, late, and fails."""
        asyncio.get_running_loop().call_later(seconds, self.release)

    def __enter__(self) -> HeldWriterLock:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        value: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.release()
