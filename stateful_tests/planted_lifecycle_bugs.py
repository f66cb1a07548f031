"""Planted bugs in namespaces, expiry, reopen and retention (appended to ``PLANTED_BUGS``).

Each breaks one rule of ``dataoad._lifecycle`` (or a ledger's statement of
it) the way a careless change would, and names the properties that must
report it.
"""

from __future__ import annotations

import contextvars
from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import Any

import pytest

import dataoad._attempts as attempts_module
import dataoad._lifecycle as lifecycle_module
import dataoad._retiring as retiring_module
import dataoad._runner as runner_module
import dataoad.ledgers.memory as memory_module
from dataoad import ActionReceipt, ActionStatus, ClaimState, InMemoryLedger, SQLiteLedger
from dataoad._clock import utc_now
from dataoad.ledgers._pruning import DeleteExact, NextBatch
from dataoad.ledgers.sqlite import _SQL
from stateful_tests.planted import PlantedBug, names

__all__ = ["LIFECYCLE_BUGS"]


class NamespaceBlindLedger(InMemoryLedger):
    """Checks a claim's key without its namespace: one tenant's key blocks another's."""

    async def claim(
        self, receipt: ActionReceipt, *, lease: float | None = None
    ) -> tuple[ActionReceipt, bool]:
        with self._lock:
            for held in self._by_id.values():
                if (
                    held.retired_at is None
                    and held.action_name == receipt.action_name
                    and held.idempotency_key == receipt.idempotency_key
                ):
                    return held, False
        return await super().claim(receipt, lease=lease)


def _unknown_expires(mp: pytest.MonkeyPatch) -> dict[str, Any]:
    def any_completed(current: ActionReceipt) -> bool:
        # Forgets that only a definitive outcome may give up its key.
        return current.claim_state is ClaimState.COMPLETED and current.retired_at is None

    mp.setattr(lifecycle_module, "may_retire", any_completed)
    return {}


def _reopens_confirmed(mp: pytest.MonkeyPatch) -> dict[str, Any]:
    def definitive(current: ActionReceipt) -> bool:
        # Reopens any definitive receipt, CONFIRMED too.
        return current.claim_state is ClaimState.COMPLETED and current.final_status in (
            ActionStatus.CONFIRMED,
            ActionStatus.FAILED,
        )

    mp.setattr(retiring_module, "reopenable", definitive)
    return {}


def _expires_unasked(mp: pytest.MonkeyPatch) -> dict[str, Any]:
    real = attempts_module.execute_once

    async def execute_once(store: Any, call: Any, events: Any, tenure: Any) -> Any:
        # Treats "no expiry asked" as "expired at once".
        if call.expires_after is None:
            call = call._replace(expires_after=0.0)
        return await real(store, call, events, tenure)

    mp.setattr(runner_module, "execute_once", execute_once)
    return {}


_CALLER_CLOCK: contextvars.ContextVar[Any] = contextvars.ContextVar("caller_clock")


def wall_time(clock: object) -> datetime:
    """The caller's wall time, as a runner reading its own clock would (no rule of the
    library reads it: that is the planted bug)."""
    read = getattr(clock, "wall_time", None)
    return read() if callable(read) else utc_now()


def _expiry_by_caller_clock(mp: pytest.MonkeyPatch) -> dict[str, Any]:
    """V2 of v0.2: the caller's wall clock held against the writer's ``updated_at``."""

    async def expire_if_due(
        store: Any, existing: ActionReceipt, expires_after: float | None, events: Any
    ) -> ActionReceipt | None:
        current: ActionReceipt | None = existing
        clock = _CALLER_CLOCK.get(None)
        for _ in range(retiring_module.MAX_RETIRE_ROUNDS):
            now = wall_time(clock)
            if (
                current is None
                or expires_after is None
                or not lifecycle_module.may_retire(current)
                or current.updated_at + timedelta(seconds=expires_after) > now
            ):
                return current
            if await retiring_module._retire(store, current, events, "expired"):
                return None
            current = await store.read_claim(current.action_name, current.idempotency_key)
        return current

    real = attempts_module.execute_once

    async def execute_once(store: Any, call: Any, events: Any, tenure: Any) -> Any:
        _CALLER_CLOCK.set(tenure.clock)  # what the old code read its "now" from
        return await real(store, call, events, tenure)

    mp.setattr(attempts_module, "expire_if_due", expire_if_due)
    mp.setattr(runner_module, "execute_once", execute_once)
    return {}


def _expiry_boundary_exclusive(mp: pytest.MonkeyPatch) -> dict[str, Any]:
    def stored_before(current: ActionReceipt, seconds: float, now: datetime) -> bool:
        # "Older than" read as strictly older: a receipt exactly that old stays.
        return (
            current.stored_at is not None and current.stored_at + timedelta(seconds=seconds) < now
        )

    mp.setattr(memory_module, "stored_before", stored_before)
    return {}


class AgesFromTheClaimLedger(InMemoryLedger):
    """Ages a receipt for expiry from when its claim was stored, not from its last write."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._claimed_at: dict[str, datetime] = {}

    async def claim(
        self, receipt: ActionReceipt, *, lease: float | None = None
    ) -> tuple[ActionReceipt, bool]:
        stored, made = await super().claim(receipt, lease=lease)
        if made and stored.stored_at is not None:
            self._claimed_at[stored.action_id] = stored.stored_at
        return stored, made

    async def retire(self, receipt: ActionReceipt, *, older_than: float | None = None) -> bool:
        with self._lock:
            current = self._by_id.get(receipt.action_id)
            claimed_at = self._claimed_at.get(receipt.action_id)
            if older_than is not None and current is not None and claimed_at is not None:
                # The age asked for, held against the claim's stamp: in effect
                # a smaller age asked of the last write.
                since = (current.stored_at or claimed_at) - claimed_at
                older_than = max(0.0, older_than - since.total_seconds())
        return await super().retire(receipt, older_than=older_than)


class VersionBlindPruneLedger(SQLiteLedger):
    """Deletes what its batch read, whether or not it changed meanwhile."""

    def _prune_steps(
        self, before: datetime, chosen: tuple[ActionStatus, ...], scope: str | None
    ) -> tuple[NextBatch, DeleteExact]:
        next_batch, _ = super()._prune_steps(before, chosen, scope)

        async def delete_by_id(batch: Sequence[ActionReceipt]) -> int:
            deleted = 0
            for receipt in batch:
                current = await self.get(receipt.action_id)
                if current is not None:
                    # The version it was read at, not the stored one: no check.
                    exact = [(current.action_id, current.version)]
                    statement, values = _SQL.delete_exact(exact)
                    deleted += len(await self._write(statement, values))
            return deleted

        return next_batch, delete_by_id


class PrunesAtItsCutoffLedger(SQLiteLedger):
    """Reads "stored before the cut-off" as "at or before": a receipt stored exactly then goes."""

    def _prune_steps(
        self, before: datetime, chosen: tuple[ActionStatus, ...], scope: str | None
    ) -> tuple[NextBatch, DeleteExact]:
        return super()._prune_steps(before + timedelta(microseconds=1), chosen, scope)


class VersionBlindRetireLedger(InMemoryLedger):
    """Retires a definitive receipt from whatever version the writer read."""

    async def retire(self, receipt: ActionReceipt, *, older_than: float | None = None) -> bool:
        with self._lock:
            current = self._by_id.get(receipt.action_id)
            if current is None or not lifecycle_module.may_retire(current):
                return False
            if older_than is not None and not lifecycle_module.stored_before(
                current, older_than, self._now()
            ):
                return False
            stored = current.evolve(
                retired_at=receipt.retired_at,
                version=current.version + 1,
                updated_at=receipt.updated_at,
                stored_at=self._now(),
            )
            if receipt.retired_at is None:
                return False
            self._by_id[receipt.action_id] = stored
            del self._by_key[(current.namespace, current.action_name, current.idempotency_key)]
            return True


LIFECYCLE_BUGS = [
    PlantedBug(
        "namespace-left-out-of-the-key",
        "the same action and key claimed in two namespaces",
        "ledger",
        # Or: concurrent claims of a key in one namespace all refused, because
        # the same key is held in another: no winner at all.
        names("backends-agree-with-the-model", "one-winner-per-key"),
        lambda mp: {"memory_class": NamespaceBlindLedger},
    ),
    PlantedBug(
        "unknown-receipt-expires",
        "a caller asking for expiry meets an UNKNOWN receipt",
        "runner",
        names("keys-freed-only-from-definitive-outcomes"),
        _unknown_expires,
        # The memory ledger's rule; the SQL ledgers state it in their statements.
        backend="memory",
    ),
    PlantedBug(
        "reopens-confirmed",
        "an operator reopens a CONFIRMED receipt",
        "runner",
        names("reopen-frees-only-definitive-failures"),
        _reopens_confirmed,
    ),
    PlantedBug(
        "expires-without-being-asked",
        "a plain duplicate meets a definitive receipt",
        "runner",
        # Its new claim reuses the old mutation's reference: a second effect,
        # or an invocation of that reference left ambiguous under a FAILED
        # receipt that said it could never land.
        names(
            "keys-freed-only-from-definitive-outcomes",
            "no-second-mutation-of-a-claim-by-anyone",
            "unknown-evidence-never-erased",
        ),
        _expires_unasked,
    ),
    PlantedBug(
        "expiry-by-the-caller-clock",
        "a caller whose clock runs fast asks for an age the receipt has not reached",
        "runner",
        # Or a caller asking for exactly the age reached by the ledger's
        # clock, whose own clock (or the writer's) says it has not been.
        names("expiry-is-judged-by-the-ledger-clock", "expiry-frees-a-receipt-at-exactly-its-age"),
        _expiry_by_caller_clock,
    ),
    PlantedBug(
        "expiry-boundary-exclusive",
        "a caller asking for exactly the age a definitive receipt has reached",
        "runner",
        names("expiry-frees-a-receipt-at-exactly-its-age"),
        _expiry_boundary_exclusive,
        # The memory ledger's rule; the SQL ledgers state it in their statements.
        backend="memory",
    ),
    PlantedBug(
        "expiry-from-the-claim",
        "a caller asking for just more than the age of a receipt whose claim is older",
        "runner",
        names("expiry-is-judged-by-the-ledger-clock"),
        lambda mp: {"ledger_class": AgesFromTheClaimLedger},
    ),
    PlantedBug(
        "prune-without-version-check",
        "a receipt merged into while a prune reads its batch",
        "ledger",
        names("backends-agree-with-the-model", "backends-hold-identical-receipts"),
        lambda mp: {"sqlite_class": VersionBlindPruneLedger},
    ),
    PlantedBug(
        "prune-at-the-cutoff",
        "a prune whose cut-off is the time a receipt was stored",
        "ledger",
        names("backends-agree-with-the-model", "backends-hold-identical-receipts"),
        lambda mp: {"sqlite_class": PrunesAtItsCutoffLedger},
    ),
    PlantedBug(
        "retire-without-version-check",
        "a key freed by a writer that read an older version",
        "ledger",
        names("backends-agree-with-the-model", "backends-hold-identical-receipts"),
        lambda mp: {"memory_class": VersionBlindRetireLedger},
    ),
]
