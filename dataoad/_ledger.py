"""The Ledger protocol: the storage contract every backend implements.

A ledger stores receipts and applies atomic conditional transitions. It
never decides outcomes; the runner does. Every write is conditional on the
stored ``version`` (optimistic concurrency), so a stale writer changes
nothing. A method that returns normally has made its write durable; one that
raises may or may not have committed (a lost acknowledgement), and callers
must read back before relying on either.

Leases: a PENDING claim may carry an owner, a fencing token and a lease
that the ledger stamps from its own clock (``lease`` seconds from now). Only
``take_over`` changes the owner (fencing token + 1) and only once the lease
has run out by that clock; every other transition must keep the owner and
token it was read under, so a worker whose claim was taken over cannot
write it any more.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Protocol

from dataoad._lifecycle import BeforeDelete
from dataoad._receipt import ActionReceipt
from dataoad._status import ActionStatus

__all__ = ["Inspection", "InspectableLedger", "LeasingLedger", "Ledger", "LifecycleLedger"]


class Ledger(Protocol):
    """Durable storage of claims and receipts with atomic conditional transitions."""

    async def claim(
        self, receipt: ActionReceipt, *, lease: float | None = None
    ) -> tuple[ActionReceipt, bool]:
        """Insert ``receipt`` unless its key ``(namespace, action_name, idempotency_key)`` is held.

        Returns ``(stored, True)`` when this call created the claim, or
        ``(existing, False)`` with the stored claim otherwise. Exactly one of
        any number of concurrent callers for one key gets True. With
        ``lease``, the claim's lease runs out that many seconds from now.
        The runner's claim already counts attempt 1 (the fused claim) and
        comes without a lookup first: a ledger should look the key up in the
        same call and write nothing when it is held (a replay is one read).
        """
        ...

    async def get(self, action_id: str) -> ActionReceipt | None:
        """The stored receipt with this action id, or None."""
        ...

    async def find(
        self, action_name: str, idempotency_key: str, namespace: str = ""
    ) -> ActionReceipt | None:
        """The stored receipt holding this key in ``namespace`` (never a retired one), or None.

        A ledger written before namespaces may omit ``namespace``; the runner
        passes it only when it is not the default ``""``.
        """
        ...

    async def start_attempt(self, receipt: ActionReceipt, *, lease: float | None = None) -> bool:
        """Store ``receipt`` as the next attempt of a PENDING claim.

        Succeeds (True) only if the stored receipt is PENDING, has version
        ``receipt.version - 1`` and one attempt fewer, and the same identity,
        owner and fencing token. Returns False, writing nothing, when the
        condition does not hold. The lease restarts (``lease`` seconds, or none).
        """
        ...

    async def record(self, receipt: ActionReceipt) -> bool:
        """Store ``receipt`` as the next version of the claim, attempts unchanged.

        Succeeds (True) only if the stored receipt has version
        ``receipt.version - 1``, the same attempt count, identity, owner and
        fencing token, and the write does not move a COMPLETED claim back to
        PENDING. Returns False, writing nothing, otherwise. A COMPLETED
        receipt has no lease; a PENDING one keeps the lease it had.
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


class LeasingLedger(Ledger, Protocol):
    """A ledger that keeps leases: what a runner with ``lease`` set needs."""

    async def take_over(self, receipt: ActionReceipt, *, lease: float) -> bool:
        """Hand an expired PENDING claim to ``receipt.owner``.

        Succeeds (True) only if the stored claim is PENDING, its lease ran out
        by the ledger's clock, and ``receipt`` is it at the next version and
        the next fencing token with only owner and update time changed. The
        new owner's lease runs out ``lease`` seconds from now.
        """
        ...

    async def renew(self, action_id: str, fencing_token: int, lease: float) -> bool:
        """Restart the lease of a PENDING claim still held under ``fencing_token``.

        Not a transition (the version stays). False, writing nothing, once
        the claim was taken over (a higher token) or completed.
        """
        ...


class LifecycleLedger(Ledger, Protocol):
    """A ledger that can free keys and delete old receipts (see ``_lifecycle``)."""

    async def retire(self, receipt: ActionReceipt, *, older_than: float | None = None) -> bool:
        """Free the key of a definitive receipt: store ``receipt`` with ``retired_at`` set.

        Succeeds (True) only if the stored receipt is COMPLETED, CONFIRMED or
        FAILED, still holds its key, and ``receipt`` is it at the next version
        with only ``retired_at`` and the update time changed; with
        ``older_than``, only if the ledger stored it at least that many
        seconds ago by its own clock, judged inside the same conditional
        write (an expiry). The receipt stays readable by its id; the key can
        then be claimed afresh.
        """
        ...

    async def prune(
        self,
        *,
        completed_before: datetime,
        statuses: Sequence[ActionStatus] = ...,
        namespace: str | None = None,
        batch_size: int = ...,
        dry_run: bool = False,
        before_delete: BeforeDelete | None = None,
    ) -> int:
        """Delete completed receipts in ``statuses`` (default CONFIRMED and FAILED).

        Only receipts the ledger stored (``stored_at``, its own clock) before
        ``completed_before``, in
        ``namespace`` when given; UNKNOWN only when named, PENDING never. In
        small batches, each receipt only at the version it was read at;
        ``before_delete`` sees every batch first. Returns how many were
        deleted (with ``dry_run``, how many would be, deleting nothing).
        """
        ...


class Inspection(Protocol):
    """Read-only listing, the same on every backend; the operator commands use only this."""

    async def receipts(
        self,
        *,
        final_status: ActionStatus | None = None,
        pending: bool | None = None,
        stale: bool | None = None,
        action_name: str | None = None,
        idempotency_key: str | None = None,
        action_id_prefix: str | None = None,
        since: datetime | None = None,
        limit: int | None = None,
        namespace: str | None = None,
        newest_first: bool = False,
    ) -> list[ActionReceipt]:
        """Stored receipts, oldest first (by creation time, then action id), filtered.

        ``final_status``: only that outcome; ``pending``: only PENDING (True)
        or only COMPLETED (False) claims; ``stale``: only PENDING claims whose
        lease ran out by the ledger's clock (True) or only the others
        (False); ``action_name``: only that action;
        ``idempotency_key``: only that key; ``action_id_prefix``: only ids
        starting so; ``since``: created at or after; ``limit``: at most that
        many; ``namespace``: only that namespace; ``newest_first``: the
        reverse order (with ``limit``, the newest that many). Retired receipts
        are listed too.
        """
        ...

    async def get(self, action_id: str) -> ActionReceipt | None:
        """The stored receipt with this action id, or None."""
        ...


class InspectableLedger(LeasingLedger, LifecycleLedger, Inspection, Protocol):
    """A ledger with the read-only listing: what the operator commands open."""
