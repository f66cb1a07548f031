"""Planted bugs in the fused claim (appended to ``PLANTED_BUGS``).

A new claim counts attempt 1 in the same conditional write that claims the
key, and looks the key up itself. Each bug breaks that transition the way a
careless change would, and names the properties that must report it.
"""

from __future__ import annotations

from typing import Any

import pytest

import dataoad._attempts as attempts_module
from dataoad import ActionReceipt, InMemoryLedger
from dataoad._proven import ProvenLedger
from stateful_tests.planted import PlantedBug, names

__all__ = ["CLAIM_BUGS"]


def _claim_counts_no_attempt(mp: pytest.MonkeyPatch) -> dict[str, Any]:
    real = attempts_module._fused_claim

    def buggy(store: Any, call: Any, tenure: Any) -> ActionReceipt:
        # Claims without counting attempt 1, yet runs it as if counted.
        return real(store, call, tenure).evolve(attempts=0, attempt_records=())

    mp.setattr(attempts_module, "_fused_claim", buggy)
    return {}


def _claim_proven_by_key(mp: pytest.MonkeyPatch) -> dict[str, Any]:
    real = ProvenLedger.claim

    async def buggy(
        self: ProvenLedger, proposed: ActionReceipt, lease: float | None = None
    ) -> tuple[ActionReceipt, bool]:
        try:
            return await self.ledger.claim(proposed, lease=lease)
        except Exception:
            # After a claim write raises, takes any receipt holding the key as its own.
            held = await self.ledger.find(
                proposed.action_name, proposed.idempotency_key, proposed.namespace
            )
            if held is not None:
                return proposed, True
            return await real(self, proposed, lease)

    mp.setattr(ProvenLedger, "claim", buggy)
    return {}


class ClaimWritesOverAHeldKeyLedger(InMemoryLedger):
    """Skips the lookup of a held key when the claim already counts its attempt."""

    async def claim(
        self, receipt: ActionReceipt, *, lease: float | None = None
    ) -> tuple[ActionReceipt, bool]:
        if receipt.attempts == 0:
            return await super().claim(receipt, lease=lease)
        key = (receipt.namespace, receipt.action_name, receipt.idempotency_key)
        with self._lock:
            # A "fast path" for the fused claim: insert, the key's holder forgotten.
            stored = self._leased(receipt, lease)
            self._by_id[receipt.action_id] = stored
            self._by_key[key] = receipt.action_id
            return stored, True


CLAIM_BUGS: list[PlantedBug] = [
    PlantedBug(
        "claim-counts-no-attempt",
        "any first call (its claim counts no attempt, yet it invokes)",
        "runner",
        # Or what the uncounted invocation leads to: a taker or an operator
        # sees a claim with no attempt and invokes or releases it.
        names(
            "invocation-counted-before-call",
            "no-second-mutation-of-a-claim-by-anyone",
            "claims-never-stolen",
        ),
        _claim_counts_no_attempt,
    ),
    PlantedBug(
        "claim-proven-by-key-only",
        "a claim write that raises while another caller holds the key",
        "runner",
        names(
            "only-the-claimer-invokes",
            "no-second-mutation-of-a-claim-by-anyone",
            "invocation-counted-before-call",
            # The caller invokes under another's claim: not its own token.
            "operations-run-only-while-their-claim-is-held",
        ),
        _claim_proven_by_key,
    ),
    PlantedBug(
        "fused-claim-overwrites-a-held-key",
        "a second caller of a held key",
        "ledger",
        names("backends-agree-with-the-model", "one-winner-per-key"),
        lambda mp: {"memory_class": ClaimWritesOverAHeldKeyLedger},
    ),
]
