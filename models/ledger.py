"""The abstract ledger: claims and their conditional transitions, from the contract.

Receipts are reduced to the fields the transitions are conditional on. Time
is the ledger's own clock, in seconds (``now``): it alone judges leases.
A key is ``(namespace, action name, key)`` and is held by the one receipt
of it that was never retired; retiring (expiry, reopen) and pruning follow
``dataoad._lifecycle``, restated here independently.
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
    namespace: str = ""
    #: Whether the key was freed from this receipt (it stays readable).
    retired: bool = False
    #: Seconds of the receipt's last change, on the writers' clock (informative only).
    updated: float = 0.0
    #: When the ledger stored this version, on its own clock (``now``): retention
    #: and expiry judge ages by it. The ledger stamps it, so equality ignores it.
    stored: float = dataclasses.field(default=0.0, compare=False)


class AbstractLedger:
    """Claims keyed by (action name, key); every write conditional on the version."""

    def __init__(self) -> None:
        self.by_id: dict[str, ModelReceipt] = {}
        self.now = 0.0

    @staticmethod
    def _holder(current: ModelReceipt, proposed: ModelReceipt) -> bool:
        return (current.owner, current.token) == (proposed.owner, proposed.token)

    def _leased(self, receipt: ModelReceipt, lease: float | None) -> ModelReceipt:
        return dataclasses.replace(
            receipt, lease_until=None if lease is None else self.now + lease, stored=self.now
        )

    def find(self, action_name: str, key: str, namespace: str = "") -> ModelReceipt | None:
        """The receipt holding (namespace, action name, key), if any."""
        for receipt in self.by_id.values():
            if (receipt.namespace, receipt.action_name, receipt.key) == (
                namespace,
                action_name,
                key,
            ) and not receipt.retired:
                return receipt
        return None

    def claim(self, receipt: ModelReceipt, lease: float | None = None) -> tuple[ModelReceipt, bool]:
        """Create the claim unless the key is held."""
        existing = self.find(receipt.action_name, receipt.key, receipt.namespace)
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
                current,
                owner=proposed.owner,
                token=proposed.token,
                version=proposed.version,
                updated=proposed.updated,
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
            # Not a transition: the time of storing stays.
            self.by_id[action_id] = dataclasses.replace(current, lease_until=self.now + lease)
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
            and _identity(proposed) == _identity(current)
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
            and _identity(proposed) == _identity(current)
        )
        if ok:
            assert current is not None
            # The lease is the ledger's: kept while PENDING, gone once completed.
            kept = current.lease_until if proposed.pending and current.pending else None
            self.by_id[proposed.action_id] = dataclasses.replace(
                proposed, lease_until=kept, stored=self.now
            )
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

    def retire(self, proposed: ModelReceipt) -> bool:
        """Free the key of a completed CONFIRMED or FAILED receipt; nothing else changes."""
        current = self.by_id.get(proposed.action_id)
        ok = (
            current is not None
            and not current.pending
            and current.final in ("CONFIRMED", "FAILED")
            and not current.retired
            and proposed.retired
            and proposed.version == current.version + 1
            and dataclasses.replace(
                current, retired=True, version=proposed.version, updated=proposed.updated
            )
            == proposed
        )
        if ok:
            self.by_id[proposed.action_id] = dataclasses.replace(proposed, stored=self.now)
        return ok

    def prune(
        self,
        before: float,
        statuses: frozenset[str],
        namespace: str | None,
        changed: frozenset[str] = frozenset(),
    ) -> int:
        """Delete completed receipts in ``statuses`` stored before ``before`` (ledger clock).

        ``changed``: receipts that moved while the prune read them; kept.
        """
        before = min(before, self.now)  # never past the moment the prune began
        doomed = [
            r.action_id
            for r in self.by_id.values()
            if not r.pending
            and r.final in statuses
            and r.stored < before
            and (namespace is None or r.namespace == namespace)
            and r.action_id not in changed
        ]
        for action_id in doomed:
            del self.by_id[action_id]
        return len(doomed)


def _identity(receipt: ModelReceipt) -> tuple[object, ...]:
    """What no transition but retiring may change."""
    return (
        receipt.namespace,
        receipt.action_name,
        receipt.key,
        receipt.request_hash,
        receipt.retired,
    )
