"""The runner's clock: how it tells and passes time, as one declared seam.

``wait_in_progress`` reads it (and leases will). Tests and the state machines
pass their own, so that a waiter's deadline depends on the steps taken, not
on the machine's speed.
"""

from __future__ import annotations

import asyncio
import time
from typing import Protocol, runtime_checkable

__all__ = ["Clock", "SystemClock"]


@runtime_checkable
class Clock(Protocol):
    """Monotonic seconds, and a way to let them pass without blocking the loop."""

    def monotonic(self) -> float:
        """Seconds on a clock that never goes backwards."""
        ...

    async def sleep(self, seconds: float) -> None:
        """Let ``seconds`` pass (the event loop keeps running)."""
        ...


class SystemClock:
    """The default: ``time.monotonic`` and ``asyncio.sleep``."""

    def monotonic(self) -> float:
        """``time.monotonic()``."""
        return time.monotonic()

    async def sleep(self, seconds: float) -> None:
        """``asyncio.sleep(seconds)``."""
        await asyncio.sleep(seconds)
