"""InMemoryLedger: process-local, thread-safe, for tests and ephemeral runs."""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Callable, Sequence
from datetime import datetime
from types import TracebackType

from dataoad._errors import InvalidArgumentError
from dataoad._ledger_arguments import (
    check_claim,
    check_key,
    check_listing,
    check_receipt,
    checked_action_id,
    checked_count,
    checked_lease,
    checked_older_than,
    required_lease,
)
from dataoad._ledger_rules import (
    check_ledger_clock,
    check_record,
    check_renew,
    check_start_attempt,
    check_take_over,
    lease_expired,
    lease_until,
)
from dataoad._lifecycle import (
    DEFAULT_PRUNE_STATUSES,
    check_retire,
    prunable,
    stored_before,
)
from dataoad._operator import OperatorRecord
from dataoad._receipt import ActionReceipt
from dataoad._records import MAX_RECEIPT_OPERATOR_RECORDS
from dataoad._status import ActionStatus, ClaimState
from dataoad.ledgers._audit import check_audit_filters, check_new_record, listed
from dataoad.ledgers._durability import DurabilityReport, judge_memory
from dataoad.ledgers._pruning import (
    DEFAULT_BATCH_SIZE,
    BeforeDelete,
    DeleteExact,
    NextBatch,
    prune,
)

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
        # Only receipts that hold their key (never retired) are here.
        self._by_key: dict[tuple[str, str, str], str] = {}
        self._audit: list[OperatorRecord] = []

    async def __aenter__(self) -> InMemoryLedger:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    def _leased(
        self, receipt: ActionReceipt, lease: float | None, current: ActionReceipt | None = None
    ) -> ActionReceipt:
        # ``current``: the stored version this one replaces (None for a new claim).
        now = self._now()
        return receipt.evolve(
            lease_expires_at=lease_until(now, lease),
            stored_at=now,
            operator_records=() if current is None else current.operator_records,
        )

    async def claim(
        self, receipt: ActionReceipt, *, lease: float | None = None
    ) -> tuple[ActionReceipt, bool]:
        """Insert the claim unless its action name and key are taken."""
        check_claim(receipt)
        lease = checked_lease(lease)
        key = (receipt.namespace, receipt.action_name, receipt.idempotency_key)
        with self._lock:
            existing_id = self._by_key.get(key)
            if existing_id is not None:
                return self._by_id[existing_id], False
            if receipt.action_id in self._by_id:
                raise InvalidArgumentError(f"action id {receipt.action_id!r} already exists")
            receipt = self._leased(receipt, lease)
            self._by_id[receipt.action_id] = receipt
            self._by_key[key] = receipt.action_id
            return receipt, True

    async def get(self, action_id: str) -> ActionReceipt | None:
        """The receipt with this action id, or None."""
        checked_action_id(action_id)
        with self._lock:
            return self._by_id.get(action_id)

    async def find(
        self, action_name: str, idempotency_key: str, namespace: str = ""
    ) -> ActionReceipt | None:
        """The receipt holding this key in ``namespace``, or None."""
        check_key(action_name, idempotency_key, namespace)
        with self._lock:
            action_id = self._by_key.get((namespace, action_name, idempotency_key))
            return None if action_id is None else self._by_id[action_id]

    async def start_attempt(self, receipt: ActionReceipt, *, lease: float | None = None) -> bool:
        """Store the next attempt (renewing the lease) if the stored claim allows that step."""
        check_receipt(receipt)
        lease = checked_lease(lease)
        with self._lock:
            current = self._by_id.get(receipt.action_id)
            if current is None or not check_start_attempt(current, receipt):
                return False
            self._by_id[receipt.action_id] = self._leased(receipt, lease, current)
            return True

    async def record(self, receipt: ActionReceipt) -> bool:
        """Store the next version if the stored claim allows exactly that step."""
        check_receipt(receipt)
        with self._lock:
            current = self._by_id.get(receipt.action_id)
            if current is None or not check_record(current, receipt):
                return False
            # The lease is the ledger's, never the writer's: kept while PENDING
            # (a COMPLETED receipt drops it itself: nobody holds it).
            # So are the operator records (appended only with the audit).
            self._by_id[receipt.action_id] = receipt.evolve(
                lease_expires_at=current.lease_expires_at,
                stored_at=self._now(),
                operator_records=current.operator_records,
            )
            return True

    async def take_over(self, receipt: ActionReceipt, *, lease: float) -> bool:
        """Hand an expired claim to ``receipt.owner`` under the next fencing token."""
        check_receipt(receipt)
        lease = required_lease(lease)
        with self._lock:
            current = self._by_id.get(receipt.action_id)
            if current is None or not check_take_over(current, receipt, self._now()):
                return False
            self._by_id[receipt.action_id] = self._leased(receipt, lease, current)
            return True

    async def renew(self, action_id: str, fencing_token: int, lease: float) -> bool:
        """Extend the lease of a PENDING claim still held under ``fencing_token``."""
        checked_action_id(action_id)
        checked_count("fencing_token", fencing_token, 1)
        lease = required_lease(lease)
        with self._lock:
            current = self._by_id.get(action_id)
            if current is None or not check_renew(current, fencing_token):
                return False
            # A renewal is not a transition: the time of storing stays.
            self._by_id[action_id] = current.evolve(
                lease_expires_at=lease_until(self._now(), lease)
            )
            return True

    async def release(self, action_id: str, version: int) -> bool:
        """Delete an unstarted PENDING claim at exactly ``version``."""
        checked_action_id(action_id)
        checked_count("version", version, 1)
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
            del self._by_key[(current.namespace, current.action_name, current.idempotency_key)]
            return True

    async def retire(self, receipt: ActionReceipt, *, older_than: float | None = None) -> bool:
        """Free the key of a definitive receipt at exactly the previous version.

        With ``older_than``, only if it was stored at least that many seconds
        ago by this ledger's clock (an expiry).
        """
        check_receipt(receipt)
        older_than = checked_older_than(older_than)
        with self._lock:
            current = self._by_id.get(receipt.action_id)
            now = self._now()
            if current is None or not check_retire(current, receipt):
                return False
            if older_than is not None and not stored_before(current, older_than, now):
                return False
            self._by_id[receipt.action_id] = receipt.evolve(
                stored_at=now, operator_records=current.operator_records
            )
            del self._by_key[(current.namespace, current.action_name, current.idempotency_key)]
            return True

    async def prune(
        self,
        *,
        completed_before: datetime | None = None,
        older_than: float | None = None,
        statuses: Sequence[ActionStatus] = DEFAULT_PRUNE_STATUSES,
        namespace: str | None = None,
        batch_size: int = DEFAULT_BATCH_SIZE,
        dry_run: bool = False,
        before_delete: BeforeDelete | None = None,
        operator: str | None = None,
        reason: str | None = None,
    ) -> int:
        """Delete completed receipts in ``statuses`` stored before the cut-off.

        The cut-off is ``completed_before``, or ``older_than`` seconds before
        now by the ledger's own clock; either is held against the time the
        ledger stored each receipt (``stored_at``), never a writer's clock.

        In batches, each receipt only at the version it was read at; returns
        how many were deleted (with ``dry_run``, how many would be).
        A prune that deletes is audited: ``operator`` (default: the OS
        user) and ``reason`` go into its OperatorRecord.
        """
        return await prune(
            self._prune_steps,
            completed_before=completed_before,
            older_than=older_than,
            ledger_now=self._ledger_now,
            statuses=statuses,
            namespace=namespace,
            batch_size=batch_size,
            dry_run=dry_run,
            before_delete=before_delete,
            operator=operator,
            reason=reason,
            audit_to=self,
        )

    def _prune_steps(
        self, before: datetime, chosen: tuple[ActionStatus, ...], scope: str | None
    ) -> tuple[NextBatch, DeleteExact]:

        # One sorted pass, then slices: a receipt that changes later is caught
        # by the version check when its batch is deleted.
        with self._lock:
            ordered = sorted(
                (
                    r
                    for r in self._by_id.values()
                    if prunable(r, completed_before=before, statuses=chosen, namespace=scope)
                ),
                key=lambda r: (r.stored_at, r.action_id),
            )
        position = 0

        async def next_batch(after: tuple[datetime, str] | None, limit: int) -> list[ActionReceipt]:
            nonlocal position
            batch = ordered[position : position + limit]
            position += len(batch)
            return batch

        async def delete_exact(batch: Sequence[ActionReceipt]) -> int:
            deleted = 0
            with self._lock:
                for read in batch:
                    current = self._by_id.get(read.action_id)
                    if current is None or current.version != read.version:
                        continue  # changed while pruning: kept
                    del self._by_id[read.action_id]
                    key = (current.namespace, current.action_name, current.idempotency_key)
                    if self._by_key.get(key) == read.action_id:
                        del self._by_key[key]
                    deleted += 1
            return deleted

        return next_batch, delete_exact

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
        namespace: str | None = None,
        newest_first: bool = False,
    ) -> list[ActionReceipt]:
        """Stored receipts, oldest first, filtered like every ledger's listing.

        ``since``: created at or after. The same filters and order as the
        SQLite and PostgreSQL ledgers (the Inspection protocol).
        """
        check_listing(
            final_status=final_status,
            pending=pending,
            stale=stale,
            action_name=action_name,
            idempotency_key=idempotency_key,
            action_id_prefix=action_id_prefix,
            since=since,
            limit=limit,
            namespace=namespace,
            newest_first=newest_first,
        )
        now = self._now()
        selected = [
            r
            for r in self.snapshot()
            if (final_status is None or r.final_status is final_status)
            and (pending is None or (r.claim_state is ClaimState.PENDING) is pending)
            and (stale is None or lease_expired(r, now) is stale)
            and (action_name is None or r.action_name == action_name)
            and (namespace is None or r.namespace == namespace)
            and (idempotency_key is None or r.idempotency_key == idempotency_key)
            and (action_id_prefix is None or r.action_id.startswith(action_id_prefix))
            and (since is None or r.created_at >= since)
        ]
        if newest_first:
            selected.reverse()
        return selected if limit is None else selected[: int(limit)]

    async def _ledger_now(self) -> datetime:
        return self._now()

    async def durability(self) -> DurabilityReport:
        """Never durable: the receipts live and die with this process."""
        return judge_memory()

    async def append_audit(self, record: OperatorRecord) -> OperatorRecord:
        """Append ``record`` to the audit, stamped with this ledger's clock."""
        check_new_record(record)
        with self._lock:
            stored = dataclasses.replace(record, at=self._now())
            self._audit.append(stored)
            current = None if record.action_id is None else self._by_id.get(record.action_id)
            if current is not None:  # the receipt's own copy, the newest kept
                kept = (*current.operator_records, stored)[-MAX_RECEIPT_OPERATOR_RECORDS:]
                self._by_id[current.action_id] = current.evolve(operator_records=kept)
            return stored

    async def audit(
        self,
        *,
        since: datetime | None = None,
        operator: str | None = None,
        namespace: str | None = None,
        action_id: str | None = None,
        limit: int | None = None,
    ) -> list[OperatorRecord]:
        """The operator records, newest first, filtered; pruning receipts keeps them."""
        check_audit_filters(since, operator, namespace, action_id, limit)
        with self._lock:
            records = list(self._audit)
        return listed(
            records,
            since=since,
            operator=operator,
            namespace=namespace,
            action_id=action_id,
            limit=limit,
        )

    async def close(self) -> None:
        """Nothing to release; kept for symmetry with durable ledgers."""
