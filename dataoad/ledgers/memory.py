"""InMemoryLedger: process-local, thread-safe, for tests and ephemeral runs."""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Callable
from datetime import datetime
from types import TracebackType

from dataoad._ledger_rules import (
    check_ledger_clock,
    check_record,
    check_renew,
    check_start_attempt,
    check_take_over,
    lease_expired,
    lease_until,
)
from dataoad._receipt import ActionReceipt
from dataoad._status import ActionStatus, ClaimState

__all__ = ["InMemoryLedger"]


class InMemoryLedger:
    """A ledger kept in a dict; all state is lost when the process exits.

    Every transition runs under one ``threading.Lock`` and never awaits while
    holding it, so one instance may be shared by several event loops in
    several threads. Receipts are immutable, so they are stored as given.

    ``clock`` (for tests) is the ledger's own clock, which alone judges
    leases: a callable returning an aware datetime; default: UTC now.
    """

    def __init__(self, *, clock: Callable[[], datetime] | None = None) -> None:
        self._now = check_ledger_clock(clock)
        self._lock = threading.Lock()
        self._by_id: dict[str, ActionReceipt] = {}
        self._by_key: dict[tuple[str, str], str] = {}

    async def __aenter__(self) -> InMemoryLedger:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    def _leased(self, receipt: ActionReceipt, lease: float | None) -> ActionReceipt:
        return dataclasses.replace(receipt, lease_expires_at=lease_until(self._now(), lease))

    async def claim(
        self, receipt: ActionReceipt, *, lease: float | None = None
    ) -> tuple[ActionReceipt, bool]:
        """Insert the claim unless its action name and key are taken."""
        key = (receipt.action_name, receipt.idempotency_key)
        with self._lock:
            existing_id = self._by_key.get(key)
            if existing_id is not None:
                return self._by_id[existing_id], False
            if receipt.action_id in self._by_id:
                raise ValueError(f"action id {receipt.action_id!r} already exists")
            receipt = self._leased(receipt, lease)
            self._by_id[receipt.action_id] = receipt
            self._by_key[key] = receipt.action_id
            return receipt, True

    async def get(self, action_id: str) -> ActionReceipt | None:
        """The receipt with this action id, or None."""
        with self._lock:
            return self._by_id.get(action_id)

    async def find(self, action_name: str, idempotency_key: str) -> ActionReceipt | None:
        """The claim for this action name and key, or None."""
        with self._lock:
            action_id = self._by_key.get((action_name, idempotency_key))
            return None if action_id is None else self._by_id[action_id]

    async def start_attempt(self, receipt: ActionReceipt, *, lease: float | None = None) -> bool:
        """Store the next attempt (renewing the lease) if the stored claim allows that step."""
        with self._lock:
            current = self._by_id.get(receipt.action_id)
            if current is None or not check_start_attempt(current, receipt):
                return False
            self._by_id[receipt.action_id] = self._leased(receipt, lease)
            return True

    async def record(self, receipt: ActionReceipt) -> bool:
        """Store the next version if the stored claim allows exactly that step."""
        with self._lock:
            current = self._by_id.get(receipt.action_id)
            if current is None or not check_record(current, receipt):
                return False
            # The lease is the ledger's, never the writer's: kept while PENDING
            # (a COMPLETED receipt drops it itself: nobody holds it).
            self._by_id[receipt.action_id] = dataclasses.replace(
                receipt, lease_expires_at=current.lease_expires_at
            )
            return True

    async def take_over(self, receipt: ActionReceipt, *, lease: float) -> bool:
        """Hand an expired claim to ``receipt.owner`` under the next fencing token."""
        with self._lock:
            current = self._by_id.get(receipt.action_id)
            if current is None or not check_take_over(current, receipt, self._now()):
                return False
            self._by_id[receipt.action_id] = self._leased(receipt, lease)
            return True

    async def renew(self, action_id: str, fencing_token: int, lease: float) -> bool:
        """Extend the lease of a PENDING claim still held under ``fencing_token``."""
        with self._lock:
            current = self._by_id.get(action_id)
            if current is None or not check_renew(current, fencing_token):
                return False
            self._by_id[action_id] = self._leased(current, lease)
            return True

    async def release(self, action_id: str, version: int) -> bool:
        """Delete an unstarted PENDING claim at exactly ``version``."""
        with self._lock:
            current = self._by_id.get(action_id)
            if (
                current is None
                or current.claim_state is not ClaimState.PENDING
                or current.attempts != 0
                or current.version != version
            ):
                return False
            del self._by_id[action_id]
            del self._by_key[(current.action_name, current.idempotency_key)]
            return True

    def snapshot(self) -> list[ActionReceipt]:
        """Every stored receipt, oldest first, without awaiting (for tests and REPLs)."""
        with self._lock:
            return sorted(self._by_id.values(), key=lambda r: (r.created_at, r.action_id))

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
    ) -> list[ActionReceipt]:
        """Stored receipts, oldest first, filtered like every ledger's listing.

        ``since``: created at or after. The same filters and order as the
        SQLite and PostgreSQL ledgers (the Inspection protocol).
        """
        now = self._now()
        selected = [
            r
            for r in self.snapshot()
            if (final_status is None or r.final_status is final_status)
            and (pending is None or (r.claim_state is ClaimState.PENDING) is pending)
            and (stale is None or lease_expired(r, now) is stale)
            and (action_name is None or r.action_name == action_name)
            and (idempotency_key is None or r.idempotency_key == idempotency_key)
            and (action_id_prefix is None or r.action_id.startswith(action_id_prefix))
            and (since is None or r.created_at >= since)
        ]
        return selected if limit is None else selected[: int(limit)]

    async def close(self) -> None:
        """Nothing to release; kept for symmetry with durable ledgers."""
