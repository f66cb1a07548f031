"""The abstract ledger: claims and their conditional transitions, from the contract.

Receipts are reduced to the fields the transitions are conditional on. Time
is the ledger's own clock, in seconds (``now``): it alone judges leases.
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
    owner: str | None = None
    token: int = 1
    #: When the lease runs out on the ledger's clock; None: no lease (or completed).
    lease_until: float | None = None


class AbstractLedger:
    """Claims keyed by (action name, key); every write conditional on the version."""

    def __init__(self) -> None:
        self.by_id: dict[str, ModelReceipt] = {}
        self.now = 0.0

    @staticmethod
    def _holder(current: ModelReceipt, proposed: ModelReceipt) -> bool:
        return (current.owner, current.token) == (proposed.owner, proposed.token)

    def _leased(self, receipt: ModelReceipt, lease: float | None) -> ModelReceipt:
        return dataclasses.replace(receipt, lease_until=None if lease is None else self.now + lease)

    def find(self, action_name: str, key: str) -> ModelReceipt | None:
        """The claim for (action name, key), if any."""
        for receipt in self.by_id.values():
            if (receipt.action_name, receipt.key) == (action_name, key):
                return receipt
        return None

    def claim(self, receipt: ModelReceipt, lease: float | None = None) -> tuple[ModelReceipt, bool]:
        """Create the claim unless the name and key are taken."""
        existing = self.find(receipt.action_name, receipt.key)
        if existing is not None:
            return existing, False
        receipt = self._leased(receipt, lease)
        self.by_id[receipt.action_id] = receipt
        return receipt, True

    def expired(self, receipt: ModelReceipt) -> bool:
        """Whether a PENDING claim's lease ran out by the ledger's clock."""
        return (
            receipt.pending and receipt.lease_until is not None and receipt.lease_until <= self.now
        )

    def take_over(self, proposed: ModelReceipt, lease: float) -> bool:
        """An expired claim passes to a new owner under the next token, nothing else changed."""
        current = self.by_id.get(proposed.action_id)
        ok = (
            current is not None
            and self.expired(current)
            and proposed.token == current.token + 1
            and proposed.version == current.version + 1
            and dataclasses.replace(
                current, owner=proposed.owner, token=proposed.token, version=proposed.version
            )
            == dataclasses.replace(proposed, lease_until=current.lease_until)
        )
        if ok:
            self.by_id[proposed.action_id] = self._leased(proposed, lease)
        return ok

    def renew(self, action_id: str, token: int, lease: float) -> bool:
        """Only the holder of the current token extends a PENDING claim's lease."""
        current = self.by_id.get(action_id)
        ok = current is not None and current.pending and current.token == token
        if ok:
            assert current is not None
            self.by_id[action_id] = self._leased(current, lease)
        return ok

    def start_attempt(self, proposed: ModelReceipt, lease: float | None = None) -> bool:
        """One more attempt, from the exact pending version."""
        current = self.by_id.get(proposed.action_id)
        ok = (
            current is not None
            and current.pending
            and proposed.pending
            and proposed.version == current.version + 1
            and proposed.attempts == current.attempts + 1
            and self._holder(current, proposed)
            and (proposed.action_name, proposed.key, proposed.request_hash)
            == (current.action_name, current.key, current.request_hash)
        )
        if ok:
            self.by_id[proposed.action_id] = self._leased(proposed, lease)
        return ok

    def record(self, proposed: ModelReceipt) -> bool:
        """Any other transition: same attempts, next version, never reopened."""
        current = self.by_id.get(proposed.action_id)
        ok = (
            current is not None
            and proposed.version == current.version + 1
            and proposed.attempts == current.attempts
            and not (not current.pending and proposed.pending)
            and self._holder(current, proposed)
            and (proposed.action_name, proposed.key, proposed.request_hash)
            == (current.action_name, current.key, current.request_hash)
        )
        if ok:
            assert current is not None
            # The lease is the ledger's: kept while PENDING, gone once completed.
            kept = current.lease_until if proposed.pending and current.pending else None
            self.by_id[proposed.action_id] = dataclasses.replace(proposed, lease_until=kept)
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
