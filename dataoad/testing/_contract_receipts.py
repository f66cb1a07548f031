"""Receipts the contract checks build: a fresh claim and its next transitions."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

from dataoad._receipt import ActionReceipt, AttemptRecord
from dataoad._status import ActionStatus, ClaimState

__all__ = ["completed", "make_receipt", "rich_receipt", "started"]

_T0 = datetime(2026, 1, 2, 3, 4, 5, 678901, tzinfo=UTC)


def make_receipt(**changes: Any) -> ActionReceipt:
    """A fresh PENDING claim (version 1, no attempts) with ``changes`` applied."""
    fields: dict[str, Any] = {
        "action_id": uuid.uuid4().hex,
        "action_name": "charge",
        "idempotency_key": "order-1",
        "request_hash": "0" * 64,
        "provider_reference": "order-1",
        "risk": "financial",
        "claim_state": ClaimState.PENDING,
        "attempts": 0,
        "execution_status": None,
        "verification_status": None,
        "final_status": None,
        "provider_request_id": None,
        "error": None,
        "metadata": {},
        "attempt_records": (),
        "version": 1,
        "created_at": _T0,
        "updated_at": _T0,
    }
    fields.update(changes)
    return ActionReceipt(**fields)


def started(receipt: ActionReceipt, *, seconds: int = 1) -> ActionReceipt:
    """The next-attempt transition of ``receipt``."""
    at = receipt.updated_at + timedelta(seconds=seconds)
    number = receipt.attempts + 1
    return receipt.evolve(
        attempts=number,
        attempt_records=(*receipt.attempt_records, AttemptRecord(number=number, started_at=at)),
        version=receipt.version + 1,
        updated_at=at,
    )


def completed(
    receipt: ActionReceipt, status: ActionStatus = ActionStatus.CONFIRMED
) -> ActionReceipt:
    """The completion transition of ``receipt`` (whose last attempt is open)."""
    at = receipt.updated_at + timedelta(seconds=1)
    last = receipt.attempt_records[-1]
    finished = AttemptRecord(
        number=last.number,
        started_at=last.started_at,
        execution_status=status,
        error=None if status is ActionStatus.CONFIRMED else "TimeoutError: lost",
        retry_decision="stop",
        finished_at=at,
    )
    return receipt.evolve(
        claim_state=ClaimState.COMPLETED,
        attempt_records=(*receipt.attempt_records[:-1], finished),
        execution_status=status,
        final_status=status,
        error=finished.error,
        version=receipt.version + 1,
        updated_at=at,
    )


def rich_receipt() -> ActionReceipt:
    """A completed receipt using every field, nested metadata and non-ASCII text."""
    base = make_receipt(
        action_name="refund ✓",
        idempotency_key="clé/1",
        provider_reference=None,
        risk=None,
        metadata={"tenant": "ünïcode", "tags": ["a", "b"], "n": 1.5, "deep": {"x": [None, True]}},
    )
    one = started(base)
    records = (
        AttemptRecord(
            number=1,
            started_at=one.updated_at,
            execution_status=ActionStatus.UNKNOWN,
            verification_status=ActionStatus.CONFIRMED,
            error="TimeoutError: ⏱",
            provider_request_id="pr_1",
            retry_decision="stop",
            finished_at=one.updated_at + timedelta(microseconds=1),
        ),
    )
    return one.evolve(
        claim_state=ClaimState.COMPLETED,
        attempt_records=records,
        execution_status=ActionStatus.UNKNOWN,
        verification_status=ActionStatus.CONFIRMED,
        final_status=ActionStatus.CONFIRMED,
        provider_request_id="pr_1",
        error="TimeoutError: ⏱",
        metadata={**base.metadata, "verification": {"status": "CONFIRMED"}},
        version=one.version + 1,
        updated_at=one.updated_at + timedelta(seconds=2),
    )
