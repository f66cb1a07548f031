"""The Ledger protocol: the storage contract every backend implements.

A ledger stores receipts and applies atomic conditional transitions. It
never decides outcomes; the runner does. Every write is conditional on the
stored ``version`` (optimistic concurrency), so a stale writer changes
nothing. A method that returns normally has made its write durable; one that
raises may or may not have committed (a lost acknowledgement), and callers
must read back before relying on either.
"""

from __future__ import annotations

from datetime import datetime
from typing import Protocol

from dataoad._receipt import ActionReceipt
from dataoad._status import ActionStatus

__all__ = ["Inspection", "InspectableLedger", "Ledger"]


class Ledger(Protocol):
    """Durable storage of claims and receipts with atomic conditional transitions."""

    async def claim(self, receipt: ActionReceipt) -> tuple[ActionReceipt, bool]:
        """Insert ``receipt`` unless ``(action_name, idempotency_key)`` is claimed.

        Returns ``(receipt, True)`` when this call created the claim, or
        ``(existing, False)`` with the stored claim otherwise. Exactly one of
        any number of concurrent callers for one key gets True.
        """
        ...

    async def get(self, action_id: str) -> ActionReceipt | None:
        """The stored receipt with this action id, or None."""
        ...

    async def find(self, action_name: str, idempotency_key: str) -> ActionReceipt | None:
        """The stored claim for this action name and key, or None."""
        ...

    async def start_attempt(self, receipt: ActionReceipt) -> bool:
        """Store ``receipt`` as the next attempt of a PENDING claim.

        Succeeds (True) only if the stored receipt is PENDING, has version
        ``receipt.version - 1`` and one attempt fewer, and the same identity.
        Returns False, writing nothing, when the condition does not hold.
        """
        ...

    async def record(self, receipt: ActionReceipt) -> bool:
        """Store ``receipt`` as the next version of the claim, attempts unchanged.

        Succeeds (True) only if the stored receipt has version
        ``receipt.version - 1``, the same attempt count and identity, and the
        write does not move a COMPLETED claim back to PENDING. Returns False,
        writing nothing, otherwise.
        """
        ...

    async def release(self, action_id: str, version: int) -> bool:
        """Delete a claim that never started an attempt.

        Succeeds (True) only if the stored receipt is PENDING, has zero
        attempts and exactly ``version``; atomic against ``start_attempt``.
        """
        ...

    async def close(self) -> None:
        """Release the ledger's resources. Safe to call more than once."""
        ...


class Inspection(Protocol):
    """Read-only listing, the same on every backend; the operator commands use only this."""

    async def receipts(
        self,
        *,
        final_status: ActionStatus | None = None,
        pending: bool | None = None,
        action_name: str | None = None,
        idempotency_key: str | None = None,
        action_id_prefix: str | None = None,
        since: datetime | None = None,
        limit: int | None = None,
    ) -> list[ActionReceipt]:
        """Stored receipts, oldest first (by creation time, then action id), filtered.

        ``final_status``: only that outcome; ``pending``: only PENDING (True)
        or only COMPLETED (False) claims; ``action_name``: only that action;
        ``idempotency_key``: only that key; ``action_id_prefix``: only ids
        starting so; ``since``: created at or after; ``limit``: at most that many.
        """
        ...

    async def get(self, action_id: str) -> ActionReceipt | None:
        """The stored receipt with this action id, or None."""
        ...


class InspectableLedger(Ledger, Inspection, Protocol):
    """A ledger with the read-only listing: what the operator commands open."""
