"""The abstract ledger: claims and their conditional transitions, from the contract.

Receipts are reduced to the fields the transitions are conditional on.
"""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class ModelReceipt:
    """The contract-relevant part of a receipt."""

    action_id: str
    action_name: str
    key: str
    request_hash: str
    pending: bool
    attempts: int
    version: int
    final: str | None = None


class AbstractLedger:
    """Claims keyed by (action name, key); every write conditional on the version."""

    def __init__(self) -> None:
        self.by_id: dict[str, ModelReceipt] = {}

    def find(self, action_name: str, key: str) -> ModelReceipt | None:
        """The claim for (action name, key), if any."""
        for receipt in self.by_id.values():
            if (receipt.action_name, receipt.key) == (action_name, key):
                return receipt
        return None

    def claim(self, receipt: ModelReceipt) -> tuple[ModelReceipt, bool]:
        """Create the claim unless the name and key are taken."""
        existing = self.find(receipt.action_name, receipt.key)
        if existing is not None:
            return existing, False
        self.by_id[receipt.action_id] = receipt
        return receipt, True

    def start_attempt(self, proposed: ModelReceipt) -> bool:
        """One more attempt, from the exact pending version."""
        current = self.by_id.get(proposed.action_id)
        ok = (
            current is not None
            and current.pending
            and proposed.pending
            and proposed.version == current.version + 1
            and proposed.attempts == current.attempts + 1
            and (proposed.action_name, proposed.key, proposed.request_hash)
            == (current.action_name, current.key, current.request_hash)
        )
        if ok:
            self.by_id[proposed.action_id] = proposed
        return ok

    def record(self, proposed: ModelReceipt) -> bool:
        """Any other transition: same attempts, next version, never reopened."""
        current = self.by_id.get(proposed.action_id)
        ok = (
            current is not None
            and proposed.version == current.version + 1
            and proposed.attempts == current.attempts
            and not (not current.pending and proposed.pending)
            and (proposed.action_name, proposed.key, proposed.request_hash)
            == (current.action_name, current.key, current.request_hash)
        )
        if ok:
            self.by_id[proposed.action_id] = proposed
        return ok

    def release(self, action_id: str, version: int) -> bool:
        """Remove a pending claim with no attempts, at exactly this version."""
        current = self.by_id.get(action_id)
        ok = (
            current is not None
            and current.pending
            and current.attempts == 0
            and current.version == version
        )
        if ok:
            del self.by_id[action_id]
        return ok
