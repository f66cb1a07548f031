"""Evidence rules: how attempts and verifier observations become one statement.

Pure, synchronous functions on plain values, so they can be checked
exhaustively and symbolically. The runner calls them; it never decides a
status any other way.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Sequence

from dataoad._receipt import AttemptRecord
from dataoad._records import ObservationSource, VerificationObservation
from dataoad._status import ActionStatus

__all__ = [
    "MAX_KEPT_OBSERVATIONS",
    "POST_COMPLETION_SOURCES",
    "Settlement",
    "aggregate_attempts",
    "attempt_evidence",
    "combine",
    "keep_observations",
    "merge_observations",
    "recovered_value_correlated",
    "settle",
]

CONFIRMED = ActionStatus.CONFIRMED
FAILED = ActionStatus.FAILED
UNKNOWN = ActionStatus.UNKNOWN

#: Most verifier observations a receipt keeps. An agent that keeps retrying
#: an UNKNOWN action with a verifier adds one per replay; beyond this many,
#: the oldest that no status, conflict or provider request id depends on are
#: dropped (and counted), so receipts and their writes stay bounded.
MAX_KEPT_OBSERVATIONS = 16

#: Observation sources that look at the action as a whole, after execution.
POST_COMPLETION_SOURCES = frozenset(s for s in ObservationSource if s.covers_the_action)


def attempt_evidence(
    execution_status: ActionStatus | None, verification_status: ActionStatus | None
) -> ActionStatus:
    """What one attempt proves.

    An unfinished attempt (no execution status) may have produced the effect,
    so it is UNKNOWN. Ambiguous execution defers to the attempt's verifier.

    post: execution_status is not None or __return__ == ActionStatus.UNKNOWN
    post: execution_status != ActionStatus.UNKNOWN or verification_status is not None or __return__ == ActionStatus.UNKNOWN
    """
    if execution_status is None:
        return UNKNOWN
    if execution_status is UNKNOWN:
        return verification_status if verification_status is not None else UNKNOWN
    return execution_status


def aggregate_attempts(evidence: Sequence[ActionStatus]) -> ActionStatus | None:
    """The status of a claim from its attempts' evidence, in any order.

    One confirmation establishes occurrence. Otherwise, once any attempt may
    have produced an unverified effect, no later FAILED attempt can erase it.

    post: (__return__ is None) == (len(evidence) == 0)
    post: __return__ != ActionStatus.FAILED or all(e == ActionStatus.FAILED for e in evidence)
    post: __return__ != ActionStatus.CONFIRMED or ActionStatus.CONFIRMED in evidence
    """
    if not evidence:
        return None
    if CONFIRMED in evidence:
        return CONFIRMED
    if UNKNOWN in evidence:
        return UNKNOWN
    return FAILED


def merge_observations(statuses: Iterable[ActionStatus]) -> tuple[ActionStatus | None, bool]:
    """Merge independent verifier observations; returns (status, contradiction).

    Contradictory CONFIRMED and FAILED observations make UNKNOWN, flagged as a
    contradiction; UNKNOWN observations add no evidence. Order never matters.

    post: __return__[1] == (ActionStatus.CONFIRMED in statuses and ActionStatus.FAILED in statuses)
    post: not __return__[1] or __return__[0] == ActionStatus.UNKNOWN
    """
    seen = set(statuses)
    if not seen:
        return None, False
    if CONFIRMED in seen and FAILED in seen:
        return UNKNOWN, True
    if CONFIRMED in seen:
        return CONFIRMED, False
    if FAILED in seen:
        return FAILED, False
    return UNKNOWN, False


def combine(
    attempts_status: ActionStatus | None,
    observed_status: ActionStatus | None,
    observed_conflict: bool,
) -> tuple[ActionStatus, bool]:
    """Combine attempt evidence with action-wide read-back; returns (final, contradiction).

    An action-wide observation bound to the provider reference covers every
    attempt, so it can settle an UNKNOWN claim either way. It never silently
    overrules opposite decisive evidence: that is a contradiction, UNKNOWN.

    post: not __return__[1] or __return__[0] == ActionStatus.UNKNOWN
    post: __return__[0] != ActionStatus.FAILED or (attempts_status in (None, ActionStatus.FAILED, ActionStatus.UNKNOWN) and observed_status in (None, ActionStatus.FAILED, ActionStatus.UNKNOWN))
    """
    if observed_conflict:
        return UNKNOWN, True
    if observed_status is None or observed_status is UNKNOWN:
        return (attempts_status if attempts_status is not None else UNKNOWN), False
    if attempts_status is None or attempts_status is UNKNOWN:
        return observed_status, False
    if attempts_status is observed_status:
        return observed_status, False
    return UNKNOWN, True


@dataclasses.dataclass(frozen=True, slots=True)
class Settlement:
    """The derived statuses of a completed claim."""

    execution_status: ActionStatus | None
    verification_status: ActionStatus | None
    final_status: ActionStatus
    verification_conflict: bool
    provider_request_ids: tuple[str, ...]

    @property
    def provider_request_id(self) -> str | None:
        """The retained provider request id: the first one confirmed."""
        return self.provider_request_ids[0] if self.provider_request_ids else None

    @property
    def provider_request_id_conflict(self) -> bool:
        """Whether confirmations named different provider request ids."""
        return len(self.provider_request_ids) > 1


def settle(
    attempts: Sequence[AttemptRecord], observations: Sequence[VerificationObservation]
) -> Settlement:
    """Derive every status of a claim from its recorded facts."""
    execution = aggregate_attempts(
        [UNKNOWN if a.execution_status is None else a.execution_status for a in attempts]
    )
    attempts_status = aggregate_attempts(
        [attempt_evidence(a.execution_status, a.verification_status) for a in attempts]
    )
    # An action-wide observation speaks only for the attempts that had started
    # when it was made; one older than the latest attempt proves nothing now.
    post = [
        o.status
        for o in observations
        if o.source in POST_COMPLETION_SOURCES and o.attempt == len(attempts)
    ]
    observed, observed_conflict = merge_observations(post)
    final, conflict = combine(attempts_status, observed, observed_conflict)
    verification = observed if post else (attempts[-1].verification_status if attempts else None)
    ids: list[str] = []
    for o in observations:
        rid = o.provider_request_id
        if o.status is CONFIRMED and rid is not None and rid not in ids:
            ids.append(rid)
    return Settlement(
        execution_status=execution,
        verification_status=verification,
        final_status=final,
        verification_conflict=conflict,
        provider_request_ids=tuple(ids),
    )


def recovered_value_correlated(
    final_status: ActionStatus,
    provider_request_id_conflict: bool,
    verification_request_id: str | None,
    retained_request_id: str | None,
) -> bool:
    """Whether a verifier-recovered value may be exposed.

    Only for an unconflicted CONFIRMED claim, and only when a non-null
    provider request id matches on both sides: two missing ids never match.

    post: not __return__ or (verification_request_id is not None and verification_request_id == retained_request_id)
    post: not __return__ or final_status == ActionStatus.CONFIRMED
    """
    return (
        final_status is CONFIRMED
        and not provider_request_id_conflict
        and verification_request_id is not None
        and verification_request_id == retained_request_id
    )


def keep_observations(
    attempts: Sequence[AttemptRecord],
    observations: Sequence[VerificationObservation],
    limit: int | None = None,
) -> tuple[VerificationObservation, ...]:
    """``observations`` cut to about ``limit`` (default MAX_KEPT_OBSERVATIONS), proving the same.

    Oldest first, an observation is dropped only when :func:`settle` derives
    exactly the same statuses, conflict flag and provider request ids
    without it, so one that decides the status or records a conflict is
    never dropped (then more than ``limit`` are kept). The newest is always
    kept: it is the receipt's ``verification``.
    """
    if limit is None:
        limit = MAX_KEPT_OBSERVATIONS  # read now: the state machines lower it
    kept = list(observations)
    if len(kept) <= limit:
        return tuple(kept)
    target = settle(attempts, kept)
    index = 0
    while len(kept) > limit and index < len(kept) - 1:
        candidate = kept[:index] + kept[index + 1 :]
        if settle(attempts, candidate) == target:
            kept = candidate
        else:
            index += 1
    return tuple(kept)
