"""``execute(wait_in_progress=...)``: a duplicate's bounded wait for the claim holder.

The whole rule of the wait in one place: look at the claim, and while
another caller holds it, look again after a pause that doubles from
``WAIT_FIRST_DELAY`` to ``WAIT_MAX_DELAY`` (the holder is usually quick; a
stranded claim must not be hammered), never sleeping past the deadline.
The deadline is judged by the runner's own monotonic clock: the wait is
one caller's patience, not an age of anything stored. When it is reached
the last look's ``ActionInProgressError`` is raised, and not before.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Final, TypeVar

from dataoad._clock import Clock
from dataoad._errors import ActionInProgressError

__all__ = ["WAIT_FIRST_DELAY", "WAIT_MAX_DELAY", "until_the_holder_finishes"]

T = TypeVar("T")

#: First and longest pause between looks at a claim held by another caller.
WAIT_FIRST_DELAY: Final = 0.005
WAIT_MAX_DELAY: Final = 0.25


async def until_the_holder_finishes(
    look: Callable[[], Awaitable[T]], wait: float | None, clock: Clock
) -> T:
    """``await look()``, looked again while it raises ActionInProgressError, for ``wait`` s.

    ``wait=None`` looks once. A wait of 0 looks once and gives up at once.
    """
    deadline = None if wait is None else clock.monotonic() + wait
    delay = WAIT_FIRST_DELAY
    while True:
        try:
            return await look()
        except ActionInProgressError:
            if deadline is None:
                raise
            remaining = deadline - clock.monotonic()
            if remaining <= 0:
                raise
        await clock.sleep(min(delay, remaining))
        delay = min(delay * 2, WAIT_MAX_DELAY)
