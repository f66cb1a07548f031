"""Planted bugs in ``settle``, the one function that derives a claim's statuses (appended to ``PLANTED_BUGS``).

Each keeps the function's shape and breaks one of its rules the way an
edit of it would, in every module that settles (attempts, completing,
settling, the sweep).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import pytest

import dataoad._attempts as attempts_module
import dataoad._completing as completing_module
import dataoad._leases as leases_module
import dataoad._settling as settling_module
from dataoad import ActionStatus
from dataoad._evidence import (
    POST_COMPLETION_SOURCES,
    Settlement,
    aggregate_attempts,
    attempt_evidence,
    combine,
    merge_observations,
)
from dataoad._receipt import AttemptRecord
from dataoad._records import VerificationObservation
from stateful_tests.planted import PlantedBug, names

__all__ = ["SETTLE_BUGS"]

UNKNOWN = ActionStatus.UNKNOWN
CONFIRMED = ActionStatus.CONFIRMED


def _a_settle(*, stale_speaks: bool = False) -> Callable[..., Settlement]:
    """``settle`` with one rule broken."""

    def settle(
        attempts: Sequence[AttemptRecord], observations: Sequence[VerificationObservation]
    ) -> Settlement:
        execution = aggregate_attempts(
            [UNKNOWN if a.execution_status is None else a.execution_status for a in attempts]
        )
        attempts_status = aggregate_attempts(
            [attempt_evidence(a.execution_status, a.verification_status) for a in attempts]
        )
        post = [
            o.status
            for o in observations
            if o.source in POST_COMPLETION_SOURCES
            # stale_speaks: an observation made before the latest attempt still counts.
            and (o.attempt <= len(attempts) if stale_speaks else o.attempt == len(attempts))
        ]
        observed, observed_conflict = merge_observations(post)
        final, conflict = combine(attempts_status, observed, observed_conflict)
        verification = (
            observed if post else (attempts[-1].verification_status if attempts else None)
        )
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

    return settle


def _settle_bug(**broken: bool) -> Callable[[pytest.MonkeyPatch], dict[str, Any]]:
    def plant(mp: pytest.MonkeyPatch) -> dict[str, Any]:
        settle = _a_settle(**broken)
        for module in (attempts_module, completing_module, settling_module, leases_module):
            mp.setattr(module, "settle", settle)
        return {}

    return plant


SETTLE_BUGS = [
    PlantedBug(
        "settle-hears-a-stale-observation",
        "a verifier's answer about an earlier attempt, then another attempt that may have committed",
        "runner",
        names(
            "status-permitted-by-recorded-evidence",
            "failed-requires-no-effect-now-or-later",
            "unknown-evidence-never-erased",
            "confirmed-requires-the-effect",
        ),
        _settle_bug(stale_speaks=True),
    ),
]
