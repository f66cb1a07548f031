"""A watch over ``dataoad check``'s adapter calls: one that never returns ends the check.

The checker bounds each ``perform`` and ``verify`` with a timer on its
event loop. Two calls that timer cannot end: one that blocks the loop for
good (``time.sleep`` or a blocking client inside ``async def``), where the
timer never gets to fire, and one that swallows the timer's cancellation
and waits on. Without a watch the check would hang until CI's own limit,
with no report. The command line runs the check under a ``CallWatch``: a
thread beside the loop that, once a call has run for ``limit`` seconds
(longer than the call timeout, so the loop's own timer comes first when it
can), hands that call to ``on_overdue``, which writes the reports and ends
the process. ``check_adapter`` called as a library gets no watch: ending a
caller's process is the command's decision, not the library's.
"""

from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Callable
from typing import Any

__all__ = ["CallWatch", "OverdueCall"]


@dataclasses.dataclass(frozen=True)
class OverdueCall:
    """The adapter call that did not return: which, for whom, for how long, and the steps so far."""

    call: str
    reference: str | None
    seconds: float
    steps: list[dict[str, Any]]
    examples: int


class CallWatch:
    """Notes each adapter call as it starts and ends; its thread reports one that runs on."""

    def __init__(
        self,
        limit: float,
        on_overdue: Callable[[OverdueCall], None],
        *,
        poll: float = 0.05,
    ) -> None:
        self.limit = limit
        self._on_overdue = on_overdue
        self._poll = poll
        self._lock = threading.Lock()
        self._call: tuple[str, str | None, float, list[dict[str, Any]]] | None = None
        self._stopped = threading.Event()
        self._thread: threading.Thread | None = None
        #: Examples tried so far (the machine counts them as they start).
        self.examples = 0

    def started(self, call: str, reference: str | None, steps: list[dict[str, Any]]) -> None:
        """A call begins now; ``steps`` is the running example's trace (read, never changed)."""
        with self._lock:
            self._call = (call, reference, time.monotonic(), steps)

    def ended(self) -> None:
        """The call begun last has returned (or raised)."""
        with self._lock:
            self._call = None

    def overdue(self) -> OverdueCall | None:
        """The call running for ``limit`` seconds or more, if one is."""
        with self._lock:
            if self._call is None:
                return None
            call, reference, began, steps = self._call
            seconds = time.monotonic() - began
            if seconds < self.limit:
                return None
            # A copy: the loop's thread may still append to the live list.
            return OverdueCall(call, reference, seconds, list(steps), self.examples)

    def __enter__(self) -> CallWatch:
        self._thread = threading.Thread(target=self._watch, name="dataoad-check-watch", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._stopped.set()
        if self._thread is not None:
            self._thread.join()

    def _watch(self) -> None:
        while not self._stopped.wait(self._poll):
            late = self.overdue()
            if late is not None:
                self._on_overdue(late)
                return
