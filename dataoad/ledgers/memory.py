"""InMemoryLedger: process-local, thread-safe, for tests and ephemeral runs."""

from __future__ import annotations

import threading
from datetime import datetime
from types import TracebackType

from dataoad._ledger_rules import check_record, check_start_attempt
from dataoad._receipt import ActionReceipt
from dataoad._status import ActionStatus, ClaimState

__all__ = ["InMemoryLedger"]


class InMemoryLedger:
    """A ledger kept in a dict; all state is lost when the process exits.

    Every transition runs under one ``threading.Lock`` and never awaits while
    holding it, so one instance may be shared by several event loops in
    several threads. Receipts are immutable, so they are stored as given.
    """

    def __init__(self) -> None:
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

    async def claim(self, receipt: ActionReceipt) -> tuple[ActionReceipt, bool]:
        """Insert the claim unless its action name and key are taken."""
        key = (receipt.action_name, receipt.idempotency_key)
        with self._lock:
            existing_id = self._by_key.get(key)
            if existing_id is not None:
                return self._by_id[existing_id], False
            if receipt.action_id in self._by_id:
                raise ValueError(f"action id {receipt.action_id!r} already exists")
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

    async def start_attempt(self, receipt: ActionReceipt) -> bool:
        """Store the next attempt if the stored claim allows exactly that step."""
        with self._lock:
            current = self._by_id.get(receipt.action_id)
            if current is None or not check_start_attempt(current, receipt):
                return False
            self._by_id[receipt.action_id] = receipt
            return True

    async def record(self, receipt: ActionReceipt) -> bool:
        """Store the next version if the stored claim allows exactly that step."""
        with self._lock:
            current = self._by_id.get(receipt.action_id)
            if current is None or not check_record(current, receipt):
                return False
            self._by_id[receipt.action_id] = receipt
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
        selected = [
            r
            for r in self.snapshot()
            if (final_status is None or r.final_status is final_status)
            and (pending is None or (r.claim_state is ClaimState.PENDING) is pending)
            and (action_name is None or r.action_name == action_name)
            and (idempotency_key is None or r.idempotency_key == idempotency_key)
            and (action_id_prefix is None or r.action_id.startswith(action_id_prefix))
            and (since is None or r.created_at >= since)
        ]
        return selected if limit is None else selected[: int(limit)]

    async def close(self) -> None:
        """Nothing to release; kept for symmetry with durable ledgers."""
