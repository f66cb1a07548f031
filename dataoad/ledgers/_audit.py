"""The operator audit of the SQL ledgers: one append-only table beside the receipts.

Records are only ever inserted, each stamped with the ledger's own clock;
nothing updates or deletes them, and pruning receipts leaves them be. The
SQL is written once here for both dialects.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from datetime import datetime
from typing import Any, Final

from dataoad._errors import InvalidArgumentError
from dataoad._operator import OperatorRecord
from dataoad._verification import check_stored_text
from dataoad.ledgers._statements import Dialect, Statement, compile_sql

__all__ = [
    "AUDIT_FIELDS",
    "AuditStatements",
    "check_audit_filters",
    "check_new_record",
    "insert_values",
    "listed",
    "record_of",
]

#: The stored fields of a record, besides its time.
AUDIT_FIELDS: Final = ("operator", "host", "verb", "action_id", "namespace", "reason", "outcome")
#: The most records one listing returns.
MAX_AUDIT_LIMIT: Final = 100_000


def check_audit_filters(
    since: object, operator: object, namespace: object, action_id: object, limit: object
) -> None:
    """InvalidArgumentError for a filter no ledger can apply."""
    if since is not None and (type(since) is not datetime or since.tzinfo is None):
        raise InvalidArgumentError("since must be a timezone-aware datetime or None")
    for name, value in (("operator", operator), ("action_id", action_id)):
        check_stored_text(name, value, limit=1000, optional=True)
    if namespace is not None and type(namespace) is not str:
        raise InvalidArgumentError("namespace must be a str or None")
    if limit is not None and (type(limit) is not int or not 1 <= limit <= MAX_AUDIT_LIMIT):
        raise InvalidArgumentError(f"limit must be an int in [1, {MAX_AUDIT_LIMIT}] or None")


def record_of(row: Sequence[Any], time: Callable[[Any], datetime]) -> OperatorRecord:
    """The record stored as ``row`` (AUDIT_FIELDS, then the time)."""
    fields = dict(zip(AUDIT_FIELDS, row, strict=False))
    return OperatorRecord(**fields, at=time(row[len(AUDIT_FIELDS)]))


class AuditStatements:
    """The audit's two statements for one table in one dialect."""

    def __init__(self, table: str, dialect: Dialect) -> None:
        self._dialect = dialect
        names = ", ".join(AUDIT_FIELDS)
        placeholders = ", ".join(f":{f}" for f in AUDIT_FIELDS)
        self.insert = compile_sql(
            f"INSERT INTO {table} ({names}, at) VALUES ({placeholders}, {dialect.now}) "
            "RETURNING at",
            dialect,
        )
        self._select = f"SELECT {names}, at FROM {table}"

    def listing(
        self,
        *,
        since: Any,
        operator: str | None,
        namespace: str | None,
        action_id: str | None,
        limit: int | None,
    ) -> tuple[Statement, dict[str, Any]]:
        """The newest records first (in the order they were stored), filtered."""
        conditions: list[str] = []
        values: dict[str, Any] = {}
        for name, value, test in (
            ("since", since, "at >= :since"),
            ("operator", operator, "operator = :operator"),
            ("namespace", namespace, "namespace = :namespace"),
            ("action_id", action_id, "action_id = :action_id"),
        ):
            if value is not None:
                conditions.append(test)
                values[name] = value
        sql = self._select
        if conditions:
            sql += " WHERE " + " AND ".join(conditions)
        sql += " ORDER BY seq DESC"
        if limit is not None:
            sql += " LIMIT :limit"
            values["limit"] = limit
        return compile_sql(sql, self._dialect), values


def insert_values(record: OperatorRecord) -> dict[str, Any]:
    """The insert's values for ``record`` (the ledger adds its clock)."""
    return {name: getattr(record, name) for name in AUDIT_FIELDS}


def check_new_record(record: object) -> OperatorRecord:
    """An OperatorRecord not stored yet (``at`` None), or InvalidArgumentError."""
    if type(record) is not OperatorRecord:
        raise InvalidArgumentError(f"expected an OperatorRecord, not {type(record).__qualname__}")
    if record.at is not None:
        raise InvalidArgumentError("the ledger stamps a record's time: pass at=None")
    return record


def listed(
    records: Sequence[OperatorRecord],
    *,
    since: datetime | None,
    operator: str | None,
    namespace: str | None,
    action_id: str | None,
    limit: int | None,
) -> list[OperatorRecord]:
    """``records`` (oldest first, as stored) filtered like the SQL listing, newest first."""
    found = [
        r
        for r in reversed(records)
        if (since is None or (r.at is not None and r.at >= since))
        and (operator is None or r.operator == operator)
        and (namespace is None or r.namespace == namespace)
        and (action_id is None or r.action_id == action_id)
    ]
    return found if limit is None else found[:limit]
