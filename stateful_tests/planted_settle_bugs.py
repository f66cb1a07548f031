"""Planted bugs in ``settle``, the one function that derives a claim's statuses (appended to ``PLANTED_BUGS``).

Each breaks one of its rules the way an edit of it would, in every module
that settles (attempts, completing, settling, the sweep).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import pytest

import dataoad._attempts as attempts_module
import dataoad._completing as completing_module
import dataoad._evidence as evidence_module
import dataoad._settled as settled_module
from dataoad._evidence import POST_COMPLETION_SOURCES, Settlement
from dataoad._receipt import AttemptRecord
from dataoad._records import VerificationObservation
from stateful_tests.planted import PlantedBug, names

__all__ = ["SETTLE_BUGS"]


def _stale_observations_speak(mp: pytest.MonkeyPatch) -> dict[str, Any]:
    real = evidence_module.settle

    def settle(
        attempts: Sequence[AttemptRecord], observations: Sequence[VerificationObservation]
    ) -> Settlement:
        # An action-wide observation made before the latest attempt is read as
        # if it had been made after it.
        latest = len(attempts)
        heard = [
            dataclasses.replace(o, attempt=latest)
            if o.source in POST_COMPLETION_SOURCES and o.attempt < latest
            else o
            for o in observations
        ]
        return real(attempts, heard)

    for module in (attempts_module, completing_module, settled_module):
        mp.setattr(module, "settle", settle)
    return {}


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
            # The earlier attempt's "absent" spoke over the retry's confirmation.
            "clean-success-is-confirmed",
        ),
        _stale_observations_speak,
    ),
]
