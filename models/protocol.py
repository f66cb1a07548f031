"""The evidence rules of the specification, restated independently.

Statuses are plain strings here ("CONFIRMED", "FAILED", "UNKNOWN") so that
this module shares no code with the library it is the oracle for.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Sequence
from typing import Literal

Outcome = Literal["CONFIRMED", "FAILED", "UNKNOWN"]
CONFIRMED: Outcome = "CONFIRMED"
FAILED: Outcome = "FAILED"
UNKNOWN: Outcome = "UNKNOWN"


def classify_execution(kind: str, *, has_verifier: bool) -> Outcome:
    """What one invocation proves: ``kind`` is "returned", "definitive" or "raised"."""
    if kind == "definitive":
        return FAILED
    if kind == "raised":
        return UNKNOWN
    return UNKNOWN if has_verifier else CONFIRMED


@dataclasses.dataclass(frozen=True)
class Evidence:
    """What a verifier reported, in the terms the specification judges it by."""

    claim: Outcome  # what the verifier says
    healthy: bool = True
    conclusive: bool = True
    retry_safe: bool = False
    bound: bool = True  # echoed the receipt's provider reference


def classify_verification(evidence: Evidence | None) -> Outcome:
    """A verifier's worth: None stands for an exception or an invalid return."""
    if evidence is None or not evidence.bound or not evidence.healthy:
        return UNKNOWN
    if evidence.claim == CONFIRMED:
        return CONFIRMED
    if evidence.claim == FAILED and evidence.conclusive and evidence.retry_safe:
        return FAILED
    return UNKNOWN


def aggregate(attempts: Iterable[Outcome]) -> Outcome | None:
    """One outcome from every attempt's: confirmation wins, UNKNOWN is never erased."""
    seen = list(attempts)
    if not seen:
        return None
    if CONFIRMED in seen:
        return CONFIRMED
    if UNKNOWN in seen:
        return UNKNOWN
    return FAILED


def merge(observations: Iterable[Outcome]) -> tuple[Outcome | None, bool]:
    """Concurrent observations: (merged, contradictory)."""
    seen = set(observations)
    if CONFIRMED in seen and FAILED in seen:
        return UNKNOWN, True
    for outcome in (CONFIRMED, FAILED, UNKNOWN):
        if outcome in seen:
            return outcome, False
    return None, False


def retry_allowed(
    status: Outcome,
    *,
    attempts: int,
    max_attempts: int,
    retry_on_failed: bool,
    retry_on_unknown: bool,
    retryable: bool,
) -> bool:
    """The retry rule: capacity, the policy flag, and trustworthy evidence."""
    if attempts >= max_attempts:
        return False
    if status == FAILED:
        return retry_on_failed and retryable
    if status == UNKNOWN:
        return retry_on_unknown
    return False


def permitted_outcomes(*, effect_exists: bool, may_appear_later: bool) -> frozenset[Outcome]:
    """The statuses a receipt may state, given the world's truth for its reference.

    CONFIRMED needs the effect; FAILED needs that it does not exist and cannot
    appear later; UNKNOWN is always an honest statement.
    """
    allowed: set[Outcome] = {UNKNOWN}
    if effect_exists:
        allowed.add(CONFIRMED)
    elif not may_appear_later:
        allowed.add(FAILED)
    return frozenset(allowed)


def evidence_permits(
    executions: Sequence[Outcome | None], observations: Iterable[tuple[int, Evidence | None]]
) -> frozenset[Outcome]:
    """The statuses a receipt may state given only the evidence it records.

    ``executions``: what each attempt's invocation proves, in order (None:
    it never finished). ``observations``: (attempt judged, what the verifier
    reported; None for an exception or an invalid answer). CONFIRMED needs a
    proving execution or a confirming observation; FAILED needs nothing
    confirming and every attempt settled FAILED, by its own definitive
    failure or by a fenced absence observed at or after it. UNKNOWN is
    always honest.
    """
    judged = [(attempt, classify_verification(evidence)) for attempt, evidence in observations]
    allowed: set[Outcome] = {UNKNOWN}
    if CONFIRMED in executions or any(outcome == CONFIRMED for _, outcome in judged):
        allowed.add(CONFIRMED)
    elif executions and all(
        execution == FAILED
        or any(outcome == FAILED and attempt >= number for attempt, outcome in judged)
        for number, execution in enumerate(executions, start=1)
    ):
        allowed.add(FAILED)
    return frozenset(allowed)
