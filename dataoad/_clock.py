"""The runner's clock: how it tells and passes time, as one declared seam.

``wait_in_progress`` and lease renewal read it. Tests and the state machines
pass their own, so that a waiter's deadline depends on the steps taken, not
on the machine's speed.

A ledger has a clock of its own, a wall clock (``LedgerClock``): it alone
judges whether a lease ran out, so no decision compares two hosts' clocks.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Protocol, TypeAlias, runtime_checkable

__all__ = ["Clock", "LedgerClock", "SystemClock", "utc_now"]

#: A ledger's wall clock: returns the current time as an aware datetime.
LedgerClock: TypeAlias = Callable[[], datetime]


def utc_now() -> datetime:
    """The current time as an aware UTC datetime."""
    return datetime.now(UTC)


@runtime_checkable
class Clock(Protocol):
    """Monotonic seconds, and a way to let them pass without blocking the loop."""

    def monotonic(self) -> float:
        """Seconds on a clock that never goes backwards."""
        ...

    async def sleep(self, seconds: float) -> None:
        """Let ``seconds`` pass (the event loop keeps running)."""
        ...


#: Linux's clock that keeps counting while the host is suspended; CLOCK_MONOTONIC
#: stops then, while a ledger's wall clock runs on, so a runner woken from a
#: suspend would think its lease younger than the ledger knows it is.
_SUSPEND_AWARE = getattr(time, "CLOCK_BOOTTIME", None)


class SystemClock:
    """The default: a monotonic clock that counts suspended time, ``asyncio.sleep`` and UTC now."""

    def wall_time(self) -> datetime:
        """``datetime.now(UTC)``."""
        return utc_now()

    def monotonic(self) -> float:
        """Seconds on ``CLOCK_BOOTTIME`` where the platform has it, else ``time.monotonic()``."""
        if _SUSPEND_AWARE is not None:
            return time.clock_gettime(_SUSPEND_AWARE)
        return time.monotonic()

    async def sleep(self, seconds: float) -> None:
        """``asyncio.sleep(seconds)``."""
        await asyncio.sleep(seconds)
