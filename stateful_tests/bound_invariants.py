"""The properties of the documented bounds, registered with the others in ``invariants``.

Each checks the exact side of one bound that README.md and API.md state:
the wait for a claim holder (5 ms doubling to 250 ms, never past its
deadline, never giving up before it), the size of a request, the busy
timeout of a stuck SQLite writer lock, and the verifier observations a
receipt keeps. The bounds are read from the documents (constants here),
never from the library, so a changed constant is a changed rule.
"""

from __future__ import annotations

import itertools
from typing import Any, Final

from dataoad import ActionInProgressError, ActionReceipt, InvalidRequestError
from dataoad._evidence import settle
from stateful_tests.invariants import RunnerMachineBase, fail, progress, safety

__all__ = ["DOCUMENTED_FIRST_PAUSE", "DOCUMENTED_LONGEST_PAUSE"]

#: README: a waiter looks again "backing off from 5 ms to 250 ms between looks".
DOCUMENTED_FIRST_PAUSE: Final = 0.005
DOCUMENTED_LONGEST_PAUSE: Final = 0.25
#: Float sums of pauses may land a hair either side of a deadline.
_SLACK: Final = 1e-9


def _finished_waiters(m: RunnerMachineBase) -> list[Any]:
    return [
        c
        for c in m.contenders_list
        if c.kind == "execute" and c.wait is not None and c.finished and not c.crashed
    ]


@safety
def waiters_never_give_up_before_their_deadline(m: RunnerMachineBase) -> None:
    """A caller waiting ``wait_in_progress`` seconds for a claim holder answers ActionInProgressError only at a look made at or after its deadline, by the runner's clock."""
    for c in _finished_waiters(m):
        if not isinstance(c.outcome, ActionInProgressError) or not c.clock_readings:
            continue
        started, last = c.clock_readings[0], c.clock_readings[-1]
        if last - started < c.wait - _SLACK:
            raise fail(
                waiters_never_give_up_before_their_deadline,
                f"contender {c.name} waited with wait_in_progress={c.wait:g} s and gave up "
                f"{last - started:g} s after it began (its clock read {c.clock_readings})",
            )


@safety
def waits_back_off_as_documented(m: RunnerMachineBase) -> None:
    """Between two looks at a held claim a waiter pauses 5 ms, then twice its last pause up to 250 ms, and never past its deadline: each pause is exactly min(that, the time left)."""
    for c in m.contenders_list:
        if c.kind != "execute" or c.wait is None or not c.clock_readings or c.crashed:
            continue
        deadline = c.clock_readings[0] + c.wait
        nominal = DOCUMENTED_FIRST_PAUSE
        for index, (at, seconds) in enumerate(c.pauses):
            expected = min(nominal, deadline - at)
            if abs(seconds - expected) > _SLACK:
                raise fail(
                    waits_back_off_as_documented,
                    f"contender {c.name} (wait_in_progress={c.wait:g} s) paused {seconds:g} s "
                    f"before look {index + 2}, at {at - c.clock_readings[0]:g} s into its "
                    f"wait; the back-off from 5 ms to 250 ms and its deadline allow exactly "
                    f"{expected:g} s (its pauses: {[round(s, 6) for _, s in c.pauses]})",
                )
            nominal = min(nominal * 2, DOCUMENTED_LONGEST_PAUSE)


def _canonical_size_refused(outcome: object) -> bool:
    return isinstance(outcome, InvalidRequestError) and "max_request_bytes" in str(outcome)


@safety
def oversized_requests_touch_nothing(m: RunnerMachineBase) -> None:
    """A request a byte over its runner's max_request_bytes (canonical form) is refused with a typed error before any ledger call or provider call."""
    for c in m.contenders_list:
        if c.request_bound != "a byte short" or not c.finished or c.crashed:
            continue
        if not _canonical_size_refused(c.outcome) or c.ledger_faults or c.provider_calls:
            raise fail(
                oversized_requests_touch_nothing,
                f"contender {c.name}'s request is a byte over its runner's max_request_bytes; "
                f"it made {len(c.ledger_faults)} ledger call(s) and {len(c.provider_calls)} "
                f"provider call(s), and ended with {type(c.outcome).__name__}: {c.outcome}",
            )


@progress
def a_request_at_exactly_its_bound_is_accepted(m: RunnerMachineBase) -> None:
    """A request whose canonical form is exactly its runner's max_request_bytes is not refused for its size."""
    for c in m.contenders_list:
        if c.request_bound == "exactly" and c.finished and _canonical_size_refused(c.outcome):
            raise fail(
                a_request_at_exactly_its_bound_is_accepted,
                f"contender {c.name}'s request is exactly its runner's max_request_bytes and "
                f"was refused: {c.outcome}",
            )


@safety
def lock_waits_last_their_busy_timeout(m: RunnerMachineBase) -> None:
    """A write that meets a process stuck holding SQLite's writer lock gives up (LedgerBusyError) only after waiting its whole busy_timeout (the other side of lock-waits-are-bounded)."""
    busy_timeout = getattr(m, "busy_timeout", None)
    if busy_timeout is None:
        return
    for c in m.contenders_list:
        for method, seconds in c.lock_give_ups:
            if seconds < busy_timeout:
                raise fail(
                    lock_waits_last_their_busy_timeout,
                    f"contender {c.name}'s {method} met a stuck writer lock and gave up after "
                    f"{seconds * 1000:.2f} ms, before its busy_timeout of "
                    f"{busy_timeout * 1000:g} ms",
                )


def _observation_bound(m: RunnerMachineBase) -> int | None:
    bound = getattr(m, "observation_bound", None)
    return bound if isinstance(bound, int) else None


def _numbers(receipt: ActionReceipt) -> list[int | None]:
    return [o.number for o in receipt.observations]


@safety
def observations_kept_up_to_their_bound(m: RunnerMachineBase) -> None:
    """A receipt keeps every verifier observation while it has at most the bound's number, always keeps the newest, and counts every one ever made."""
    bound = _observation_bound(m)
    if bound is None:
        return
    for receipt in m.observed.values():
        kept = receipt.observations
        if not kept:
            continue
        count = receipt.metadata.get("verification_observation_count")
        numbers = _numbers(receipt)
        problem = None
        if kept[-1].number != count:
            problem = f"its newest kept observation is number {kept[-1].number}"
        elif any(b is None or a is None or b <= a for a, b in itertools.pairwise(numbers)):
            problem = "its observations are not numbered in order"
        elif isinstance(count, int) and count <= bound and len(kept) != count:
            problem = f"it keeps {len(kept)} of them, at or below the bound of {bound}"
        if problem is not None:
            raise fail(
                observations_kept_up_to_their_bound,
                f"receipt {receipt.action_id[:8]} of {receipt.idempotency_key} counts {count} "
                f"observation(s) and {problem} (kept numbers {numbers})",
            )


@safety
def observations_past_their_bound_are_needed(m: RunnerMachineBase) -> None:
    """Past the bound, a receipt keeps more observations than the bound only when each kept one but the newest is needed: without it the receipt's statuses, conflict flag or provider request ids would change."""
    bound = _observation_bound(m)
    if bound is None:
        return
    for receipt in m.observed.values():
        kept = receipt.observations
        if len(kept) <= bound:
            continue
        whole = settle(receipt.attempt_records, kept)
        for index in range(len(kept) - 1):
            without = kept[:index] + kept[index + 1 :]
            if settle(receipt.attempt_records, without) == whole:
                raise fail(
                    observations_past_their_bound_are_needed,
                    f"receipt {receipt.action_id[:8]} of {receipt.idempotency_key} keeps "
                    f"{len(kept)} observations past the bound of {bound}, and observation "
                    f"number {kept[index].number} is needed by nothing (kept numbers "
                    f"{_numbers(receipt)})",
                )
