"""Runner calls in flight, counted so that nothing closes a ledger under one.

Every public verb of a runner counts itself here while it runs (``_Verb``).
The interpreter's exit hook for SQLite connections and
``SyncActionRunner.close()`` wait (bounded) until the calls they would cut
off are over: an operation that completed always gets to record its outcome.
"""

from __future__ import annotations

import threading
import time
from typing import Final

__all__ = ["EXIT_WAIT", "InFlight", "calls_in_flight", "wait_for_calls"]

#: How long exit waits for calls in flight before closing ledgers, in seconds.
EXIT_WAIT: Final = 60.0


class InFlight:
    """A count of calls running, and a way to wait until none is."""

    __slots__ = ("_count", "_idle", "_lock", "_threads")

    def __init__(self) -> None:
        # Every call enters and leaves: the raw lock's C-level ``with`` where no
        # one waits (the condition shares it).
        self._lock = threading.Lock()
        self._idle = threading.Condition(self._lock)
        self._count = 0
        #: Threads with a blocking call in flight (a sync caller waits on its own).
        self._threads: dict[int, int] = {}

    def enter(self) -> None:
        """One more call is running."""
        with self._lock:
            self._count += 1

    def leave(self) -> None:
        """One call ended."""
        with self._lock:
            self._count -= 1
            if self._count == 0:
                self._idle.notify_all()

    def enter_thread(self) -> None:
        """The calling thread waits on a call (see ``holds_call``)."""
        ident = threading.get_ident()
        with self._idle:
            self._threads[ident] = self._threads.get(ident, 0) + 1

    def leave_thread(self) -> None:
        """The calling thread's call ended."""
        ident = threading.get_ident()
        with self._idle:
            left = self._threads[ident] - 1
            if left:
                self._threads[ident] = left
            else:
                del self._threads[ident]

    def holds_call(self) -> bool:
        """Whether the calling thread itself waits on a call (it must not wait for it)."""
        with self._idle:
            return threading.get_ident() in self._threads

    @property
    def count(self) -> int:
        """How many calls are running now."""
        return self._count

    def wait_idle(self, timeout: float) -> bool:
        """Wait up to ``timeout`` seconds until no call runs; whether none does."""
        deadline = time.monotonic() + timeout
        with self._idle:
            while self._count:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return False
                self._idle.wait(remaining)
            return True


#: Every runner call of this process.
calls_in_flight: Final = InFlight()


def wait_for_calls(timeout: float = EXIT_WAIT) -> bool:
    """Wait until no runner call of this process is in flight (bounded); whether none is."""
    return calls_in_flight.wait_idle(timeout)
