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
from dataoad._lifecycle import check_moment
from dataoad._operator import OperatorRecord
from dataoad._records import MAX_RECEIPT_OPERATOR_RECORDS
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
    "postgres_receipt_records",
    "sqlite_receipt_records",
]

#: The stored fields of a record, besides its time.
AUDIT_FIELDS: Final = ("operator", "host", "verb", "action_id", "namespace", "reason", "outcome")
#: The most records one listing returns.
MAX_AUDIT_LIMIT: Final = 100_000


def check_audit_filters(
    since: object, operator: object, namespace: object, action_id: object, limit: object
) -> None:
    """InvalidArgumentError for a filter no ledger can apply."""
    if since is not None:
        check_moment("since", since)
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


def _json_object(function: str, source: str) -> str:
    # The keys and order of OperatorRecord.to_json, so the codec reads it back.
    pairs = ", ".join(f"'{f}', {source}.{f}" for f in (*AUDIT_FIELDS, "at"))
    return f"{function}({pairs})"


def sqlite_receipt_records(audit: str, receipt_id: str) -> str:
    """SQLite: the JSON text of the newest records naming ``receipt_id``, oldest first.

    How a receipt's operator records are rebuilt from the audit where the
    receipt has no stored copy yet (the migration to schema 7, and a reader
    of an older file).
    """
    newest = (
        f"SELECT * FROM {audit} WHERE action_id = {receipt_id} "
        f"ORDER BY seq DESC LIMIT {MAX_RECEIPT_OPERATOR_RECORDS}"
    )
    return (
        f"(SELECT json_group_array({_json_object('json_object', 'a')}) "
        f"FROM (SELECT * FROM ({newest}) ORDER BY seq) AS a)"
    )


def postgres_receipt_records(audit: str, receipt_id: str) -> str:
    """PostgreSQL: what ``sqlite_receipt_records`` is for SQLite (the migration to schema 6)."""
    return (
        f"(SELECT CAST(jsonb_agg(item ORDER BY seq) AS text) FROM ("
        f"SELECT seq, {_json_object('jsonb_build_object', 'a')} AS item FROM {audit} AS a "
        f"WHERE a.action_id = {receipt_id} ORDER BY seq DESC "
        f"LIMIT {MAX_RECEIPT_OPERATOR_RECORDS}) AS kept)"
    )


class AuditStatements:
    """The audit's statements for one audit table, beside ``receipts``, in one dialect.

    Appending a record that names a receipt also appends it to that receipt's
    operator records, atomically: PostgreSQL in one statement (below); SQLite
    in one transaction of the ledger's (the codec builds the JSON).
    """

    def __init__(self, table: str, dialect: Dialect, receipts: str) -> None:
        self._dialect = dialect
        names = ", ".join(AUDIT_FIELDS)
        placeholders = ", ".join(f":{f}" for f in AUDIT_FIELDS)
        insert = f"INSERT INTO {table} ({names}, at) VALUES ({placeholders}, {dialect.now})"
        self.insert = compile_sql(f"{insert} RETURNING at", dialect)
        self.receipt_records = compile_sql(
            f"SELECT operator_records FROM {receipts} WHERE action_id = :action_id", dialect
        )
        self.set_receipt_records = compile_sql(
            f"UPDATE {receipts} SET operator_records = :records WHERE action_id = :action_id",
            dialect,
        )
        # PostgreSQL: the insert and the receipt's copy in one statement. The
        # copy keeps the newest records, oldest first, as JSON text; the
        # update takes the receipt's row lock but leaves its version alone,
        # so a runner's conditional write still applies after it.
        appended = (
            "CAST(r.operator_records AS jsonb) || "
            f"jsonb_build_array({_json_object('jsonb_build_object', 'made')})"
        )
        self.insert_and_append = compile_sql(
            f"WITH made AS ({insert} RETURNING {names}, at), "
            f"copied AS (UPDATE {receipts} AS r SET operator_records = ("
            "SELECT CAST(jsonb_agg(item ORDER BY n) AS text) FROM ("
            f"SELECT item, n FROM jsonb_array_elements({appended}) "
            f"WITH ORDINALITY AS e(item, n) ORDER BY n DESC "
            f"LIMIT {MAX_RECEIPT_OPERATOR_RECORDS}) AS kept) "
            "FROM made WHERE r.action_id = made.action_id) "
            "SELECT at FROM made",
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
