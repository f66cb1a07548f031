"""Waiting on a close or an exit hook that waits on a count of calls in flight.

Shared by the close machine and the close-and-exit tests: whether a close
returned before its calls were let go must not depend on how fast a loaded
machine runs the closing thread.
"""

from __future__ import annotations

import collections
import threading
import time

from dataoad._in_flight import InFlight

__all__ = ["blocks_in_wait_idle", "until_returned_or_blocked"]

# CPython's threading.Condition keeps its blocked waiters in ``_waiters``;
# without it blocks_in_wait_idle could never say yes, and every long close
# would be waited on until its bound: fail here instead.
assert isinstance(getattr(threading.Condition(), "_waiters", None), collections.deque), (
    "threading.Condition no longer keeps _waiters: blocks_in_wait_idle needs another way"
)


def blocks_in_wait_idle(counter: InFlight) -> bool:
    """Whether some thread is blocked in ``counter.wait_idle`` (waiting for calls to end).

    Read from the condition's waiters: a close that only *entered* its wait
    and was told at once that no call runs never blocks, so an event set on
    entry would not tell the two apart.
    """
    return bool(counter._idle._waiters)  # type: ignore[attr-defined]


def until_returned_or_blocked(
    thread: threading.Thread | None,
    counter: InFlight,
    *,
    within: float,
    to_the_end: bool = False,
) -> None:
    """Wait until ``thread`` has returned or (unless ``to_the_end``) blocks on ``counter``.

    Bounded by ``within`` seconds; the caller judges what it finds.
    """
    deadline = time.monotonic() + within
    while thread is not None and thread.is_alive() and time.monotonic() < deadline:
        if not to_the_end and blocks_in_wait_idle(counter):
            return
        thread.join(0.001)
