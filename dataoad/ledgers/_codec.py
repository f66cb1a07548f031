"""Encoding of receipt fields shared by the SQL ledgers.

Attempt records and metadata are stored as compact JSON text, never as a
database JSON type: the ledger never queries inside them, and text gives
back exactly what was written (a JSON column type may renormalise numbers).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from datetime import datetime
from typing import Any, Final

from dataoad._receipt import ActionReceipt, AttemptRecord
from dataoad._status import ActionStatus, ClaimState

__all__ = [
    "COLUMNS",
    "listing_query",
    "attempts_from",
    "attempts_json",
    "json_text",
    "receipt_of",
    "row_of",
    "status",
    "status_text",
]

#: The receipts table's columns, in the order of ``row_of`` and ``receipt_of``.
#: The first six are the claim's identity, which no transition changes.
COLUMNS: Final = (
    "action_id",
    "action_name",
    "idempotency_key",
    "request_hash",
    "provider_reference",
    "risk",
    "claim_state",
    "attempts",
    "execution_status",
    "verification_status",
    "final_status",
    "provider_request_id",
    "error",
    "metadata",
    "attempt_records",
    "version",
    "created_at",
    "updated_at",
)


def status(value: str | None) -> ActionStatus | None:
    """The ActionStatus stored as ``value``."""
    return None if value is None else ActionStatus(value)


def status_text(value: ActionStatus | None) -> str | None:
    """How ``value`` is stored."""
    return None if value is None else value.value


def _time_text(moment: datetime | None) -> str | None:
    return None if moment is None else moment.isoformat()


def json_text(value: Any) -> str:
    """Compact JSON text; NaN and infinities are refused, as everywhere in Dataoad."""
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False, allow_nan=False)


def attempts_json(records: Sequence[AttemptRecord]) -> str:
    """Attempt records as JSON text."""
    return json_text(
        [
            {
                "number": r.number,
                "started_at": _time_text(r.started_at),
                "execution_status": status_text(r.execution_status),
                "verification_status": status_text(r.verification_status),
                "error": r.error,
                "provider_request_id": r.provider_request_id,
                "retry_decision": r.retry_decision,
                "finished_at": _time_text(r.finished_at),
            }
            for r in records
        ]
    )


def attempts_from(text: str) -> tuple[AttemptRecord, ...]:
    """Attempt records from their JSON text."""
    return tuple(
        AttemptRecord(
            number=item["number"],
            started_at=datetime.fromisoformat(item["started_at"]),
            execution_status=status(item["execution_status"]),
            verification_status=status(item["verification_status"]),
            error=item["error"],
            provider_request_id=item["provider_request_id"],
            retry_decision=item["retry_decision"],
            finished_at=None
            if item["finished_at"] is None
            else datetime.fromisoformat(item["finished_at"]),
        )
        for item in json.loads(text)
    )


def _same(moment: datetime) -> Any:
    return moment


def row_of(receipt: ActionReceipt, time: Callable[[datetime], Any] = _same) -> tuple[Any, ...]:
    """The receipt as a row of COLUMNS; ``time`` encodes the two timestamps."""
    return (
        receipt.action_id,
        receipt.action_name,
        receipt.idempotency_key,
        receipt.request_hash,
        receipt.provider_reference,
        receipt.risk,
        receipt.claim_state.value,
        receipt.attempts,
        status_text(receipt.execution_status),
        status_text(receipt.verification_status),
        status_text(receipt.final_status),
        receipt.provider_request_id,
        receipt.error,
        json_text(receipt.metadata),
        attempts_json(receipt.attempt_records),
        receipt.version,
        time(receipt.created_at),
        time(receipt.updated_at),
    )


def receipt_of(row: Sequence[Any], time: Callable[[Any], datetime] = _same) -> ActionReceipt:
    """The receipt stored as ``row``; ``time`` decodes the two timestamps."""
    return ActionReceipt(
        action_id=row[0],
        action_name=row[1],
        idempotency_key=row[2],
        request_hash=row[3],
        provider_reference=row[4],
        risk=row[5],
        claim_state=ClaimState(row[6]),
        attempts=row[7],
        execution_status=status(row[8]),
        verification_status=status(row[9]),
        final_status=status(row[10]),
        provider_request_id=row[11],
        error=row[12],
        metadata=json.loads(row[13]),
        attempt_records=attempts_from(row[14]),
        version=row[15],
        created_at=time(row[16]),
        updated_at=time(row[17]),
    )


def listing_query(
    select: str,
    placeholder: Callable[[int], str],
    *,
    final_status: ActionStatus | None,
    pending: bool | None,
    action_name: str | None,
    since: Any,
    limit: int | None,
) -> tuple[str, list[Any]]:
    """The SQL and parameters of a filtered receipts listing, oldest first.

    ``placeholder(n)`` writes the n-th parameter (``?`` or ``$n``); ``since``
    is already encoded the way the backend stores ``created_at``.
    """
    conditions = [
        ("final_status", None if final_status is None else final_status.value, "="),
        ("claim_state", None if pending is None else ("PENDING" if pending else "COMPLETED"), "="),
        ("action_name", action_name, "="),
        ("created_at", since, ">="),
    ]
    clauses: list[str] = []
    params: list[Any] = []
    for column, value, operator in conditions:
        if value is not None:
            params.append(value)
            clauses.append(f"{column} {operator} {placeholder(len(params))}")
    sql = select + (f" WHERE {' AND '.join(clauses)}" if clauses else "")
    sql += " ORDER BY created_at, action_id"
    if limit is not None:
        params.append(int(limit))
        sql += f" LIMIT {placeholder(len(params))}"
    return sql, params
