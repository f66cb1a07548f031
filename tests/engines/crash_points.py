"""Where a worker is killed in a guarded step, and the observer that kills it there.

A worker process reads ``DATAOAD_CRASH_AT`` and dies by SIGKILL at that
point of its first guarded call, as a machine losing power would: no
``finally``, no checkpoint, no outcome write after it.
"""

from __future__ import annotations

import os
import signal
from typing import Final

from dataoad import EventKind, RunnerEvent

__all__ = ["POINTS", "CrashObserver", "crash_here"]

#: Before the claim; after the claim (attempt started) and before the provider
#: call; after the provider committed and before the outcome write; after the
#: outcome write and before the engine's checkpoint of the step.
POINTS: Final = ("before_claim", "after_claim", "after_commit", "after_outcome")

_AT_EVENT: Final = {
    "before_claim": EventKind.CALL_STARTED,
    "after_claim": EventKind.ATTEMPT_STARTED,
    "after_outcome": EventKind.COMPLETED,
}


def crash_at() -> str | None:
    """The point this process dies at, if any."""
    return os.environ.get("DATAOAD_CRASH_AT") or None


def crash_here(point: str) -> None:
    """Die now if this process was told to die at ``point``."""
    if crash_at() == point:
        os.kill(os.getpid(), signal.SIGKILL)


class CrashObserver:
    """Kills the process at the runner event of its crash point."""

    def on_event(self, event: RunnerEvent) -> None:
        point = crash_at()
        if point is not None and _AT_EVENT.get(point) is event.kind:
            os.kill(os.getpid(), signal.SIGKILL)
