"""Planted bugs at the documented bounds (appended to ``PLANTED_BUGS``).

Each moves one bound a step, the way an off-by-one or a unit slip would: the
wait for a claim holder, the request size, the busy timeout, the
observations a receipt keeps. Each is found only at the boundary the bound
rules drive, never far from it.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any, TypeVar

import pytest

import dataoad._arguments as arguments_module
import dataoad._evidence as evidence_module
import dataoad._observing as observing_module
import dataoad._runner as runner_module
from dataoad import ActionInProgressError
from dataoad._bounds import DEFAULT_MAX_REQUEST_BYTES
from dataoad._canonical import checked_request_hash
from dataoad._clock import Clock
from dataoad._receipt import AttemptRecord
from dataoad._records import VerificationObservation
from dataoad._waiting import WAIT_FIRST_DELAY, WAIT_MAX_DELAY
from dataoad.ledgers._writer_lock import WriterLock
from stateful_tests.planted import PlantedBug, names

__all__ = ["BOUND_BUGS"]

T = TypeVar("T")


def _a_wait(*, gives_up_early: bool = False, cut_at_deadline: bool = True, doubles: bool = True):  # type: ignore[no-untyped-def]
    """The wait for a claim holder with one of its rules broken."""

    async def until_the_holder_finishes(
        look: Callable[[], Awaitable[T]], wait: float | None, clock: Clock
    ) -> T:
        deadline = None if wait is None else clock.monotonic() + wait
        delay = WAIT_FIRST_DELAY
        while True:
            try:
                return await look()
            except ActionInProgressError:
                if deadline is None:
                    raise
                remaining = deadline - clock.monotonic()
                # gives_up_early: "no time for another whole pause" taken as "no time".
                if remaining <= (delay if gives_up_early else 0):
                    raise
            await clock.sleep(min(delay, remaining) if cut_at_deadline else delay)
            if doubles:
                delay = min(delay * 2, WAIT_MAX_DELAY)

    return until_the_holder_finishes


def _wait_bug(**broken: bool) -> Callable[[pytest.MonkeyPatch], dict[str, Any]]:
    def plant(mp: pytest.MonkeyPatch) -> dict[str, Any]:
        mp.setattr(runner_module, "until_the_holder_finishes", _a_wait(**broken))
        return {}

    return plant


def _request_bound_exclusive(mp: pytest.MonkeyPatch) -> dict[str, Any]:
    def checked(request: object, max_bytes: int | None = None) -> str:
        # "Up to" read as "below": a request of exactly the bound is refused.
        return checked_request_hash(request, None if max_bytes is None else max_bytes - 1)

    mp.setattr(arguments_module, "checked_request_hash", checked)
    return {}


def _request_bound_of_the_default(mp: pytest.MonkeyPatch) -> dict[str, Any]:
    def checked(request: object, max_bytes: int | None = None) -> str:
        # The runner's own bound is lost on the way: the default applies.
        return checked_request_hash(request, DEFAULT_MAX_REQUEST_BYTES)

    mp.setattr(arguments_module, "checked_request_hash", checked)
    return {}


def _busy_timeout_in_milliseconds(mp: pytest.MonkeyPatch) -> dict[str, Any]:
    real = WriterLock.hold

    @contextmanager
    def hold(self: WriterLock, timeout: float) -> Iterator[None]:
        # busy_timeout is in seconds; SQLite's own PRAGMA counts milliseconds.
        with real(self, timeout / 1000):
            yield

    mp.setattr(WriterLock, "hold", hold)
    return {}


def _keeps(shift: int) -> Callable[[pytest.MonkeyPatch], dict[str, Any]]:
    """keep_observations with its bound moved ``shift`` observations."""
    real = evidence_module.keep_observations

    def plant(mp: pytest.MonkeyPatch) -> dict[str, Any]:
        def keep(
            attempts: Sequence[AttemptRecord],
            observations: Sequence[VerificationObservation],
            limit: int | None = None,
        ) -> tuple[VerificationObservation, ...]:
            bound = evidence_module.MAX_KEPT_OBSERVATIONS if limit is None else limit
            return real(attempts, observations, bound + shift)

        mp.setattr(observing_module, "keep_observations", keep)
        return {}

    return plant


BOUND_BUGS = [
    PlantedBug(
        "waiter-gives-up-a-pause-early",
        "a waiter whose time left is shorter than its next pause",
        "runner",
        names("waiters-never-give-up-before-their-deadline"),
        _wait_bug(gives_up_early=True),
    ),
    PlantedBug(
        "waiter-sleeps-past-its-deadline",
        "a waiter whose next pause is longer than the time it has left",
        "runner",
        names("waits-back-off-as-documented"),
        _wait_bug(cut_at_deadline=False),
    ),
    PlantedBug(
        "wait-without-back-off",
        "a waiter that looks at a held claim a third time",
        "runner",
        names("waits-back-off-as-documented"),
        _wait_bug(doubles=False),
    ),
    PlantedBug(
        "request-bound-exclusive",
        "a request of exactly its runner's max_request_bytes",
        "runner",
        names("a-request-at-exactly-its-bound-is-accepted"),
        _request_bound_exclusive,
    ),
    PlantedBug(
        "request-bound-of-the-default",
        "a request a byte over its runner's max_request_bytes, far below the default",
        "runner",
        names("oversized-requests-touch-nothing"),
        _request_bound_of_the_default,
    ),
    PlantedBug(
        "busy-timeout-in-milliseconds",
        "a write that meets a process stuck holding SQLite's writer lock",
        "runner",
        names("lock-waits-last-their-busy-timeout"),
        _busy_timeout_in_milliseconds,
        backend="sqlite",
    ),
    PlantedBug(
        "observations-dropped-at-the-bound",
        "a receipt with exactly as many observations as the bound",
        "runner",
        names("observations-kept-up-to-their-bound"),
        _keeps(-1),
    ),
    PlantedBug(
        "observations-kept-past-the-bound",
        "a receipt with one observation more than the bound that nothing needs",
        "runner",
        names("observations-past-their-bound-are-needed"),
        _keeps(+1),
    ),
]
