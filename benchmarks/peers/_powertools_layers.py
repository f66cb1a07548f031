"""Local persistence layers for Powertools' idempotency utility, in the shape of its DynamoDB layer.

Powertools ships DynamoDB, Redis and cache layers only. These three keep the
DynamoDB layer's item (key, status, expiry in seconds, in-progress expiry in
milliseconds, response data, validation hash) and its conditions
(``persistence/dynamodb.py``): ``_put_record`` succeeds when no record exists,
the record has expired, or it is INPROGRESS with an expired in-progress
expiry; otherwise it raises ``IdempotencyItemAlreadyExistsError`` carrying the
existing record, as DynamoDB's ``ReturnValuesOnConditionCheckFailure=ALL_OLD``
does. ``_update_record`` is an upsert like ``update_item``.
"""

from __future__ import annotations

import abc
import datetime as dt
import sqlite3
import threading
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple, NoReturn

from aws_lambda_powertools.utilities.idempotency import BasePersistenceLayer
from aws_lambda_powertools.utilities.idempotency.exceptions import (
    IdempotencyItemAlreadyExistsError,
    IdempotencyItemNotFoundError,
)
from aws_lambda_powertools.utilities.idempotency.persistence.datarecord import (
    STATUS_CONSTANTS,
    DataRecord,
)

if TYPE_CHECKING:
    import psycopg

__all__ = [
    "LocalPersistenceLayer",
    "DictPersistenceLayer",
    "PostgresPersistenceLayer",
    "SQLitePersistenceLayer",
]

INPROGRESS = STATUS_CONSTANTS["INPROGRESS"]


class _Item(NamedTuple):
    """One stored record, the attributes the DynamoDB layer writes (None: attribute absent)."""

    id: str
    status: str
    expiration: int
    in_progress_expiration: int | None
    data: str | None
    validation: str | None


def _now() -> tuple[int, int]:
    """``:now`` (seconds) and ``:now_in_millis``, computed as the DynamoDB layer computes them."""
    now = dt.datetime.now().timestamp()
    return int(now), int(now * 1000)


class LocalPersistenceLayer(BasePersistenceLayer):
    """What the three layers share: DynamoDB's item shape and its failed-put handling."""

    def __init__(self) -> None:
        super().__init__()  # type: ignore[no-untyped-call]  # Powertools leaves it unannotated

    def _new_item(self, data_record: DataRecord) -> _Item:
        """The item ``put_item`` writes: a put replaces every attribute, response data included."""
        validation = None
        if self.payload_validation_enabled and data_record.payload_hash:
            validation = data_record.payload_hash
        return _Item(
            id=data_record.idempotency_key,
            status=data_record.status,
            expiration=int(data_record.expiry_timestamp or 0),
            in_progress_expiration=data_record.in_progress_expiry_timestamp,
            data=None,
            validation=validation,
        )

    @staticmethod
    def _to_record(item: _Item) -> DataRecord:
        return DataRecord(
            idempotency_key=item.id,
            status=item.status,
            expiry_timestamp=item.expiration,
            in_progress_expiry_timestamp=item.in_progress_expiration,
            response_data=item.data or "",
            payload_hash=item.validation or "",
        )

    def _already_exists(self, data_record: DataRecord, old: _Item | None) -> NoReturn:
        """Raise as the DynamoDB layer does when its condition fails.

        ``old`` is None when the record vanished between the failed write and
        the read; Powertools then reads it itself and, not finding it, retries.
        """
        if old is None:
            raise IdempotencyItemAlreadyExistsError
        old_record = self._to_record(old)
        self._validate_payload(data_payload=data_record, stored_data_record=old_record)
        self._save_to_cache(data_record=old_record)
        raise IdempotencyItemAlreadyExistsError(old_data_record=old_record)

    def close(self) -> None:
        """Release what the layer holds (nothing, unless it has a connection)."""


class DictPersistenceLayer(LocalPersistenceLayer):
    """Records in a dict; a lock makes each conditional write atomic, as DynamoDB's are."""

    def __init__(self) -> None:
        self._items: dict[str, _Item] = {}
        self._lock = threading.Lock()
        super().__init__()

    def _get_record(self, idempotency_key: str) -> DataRecord:
        with self._lock:
            item = self._items.get(idempotency_key)
        if item is None:
            raise IdempotencyItemNotFoundError
        return self._to_record(item)

    def _put_record(self, data_record: DataRecord) -> None:
        item = self._new_item(data_record)
        now, now_in_millis = _now()
        with self._lock:
            old = self._items.get(item.id)
            if (
                old is None
                or old.expiration < now
                or (
                    old.status == INPROGRESS
                    and old.in_progress_expiration is not None
                    and old.in_progress_expiration < now_in_millis
                )
            ):
                self._items[item.id] = item
                return
        self._already_exists(data_record, old)

    def _update_record(self, data_record: DataRecord) -> None:
        key = data_record.idempotency_key
        with self._lock:
            # update_item sets these attributes and keeps the others (creating the item if absent).
            old = self._items.get(key) or _Item(key, "", 0, None, None, None)
            self._items[key] = old._replace(
                status=data_record.status,
                expiration=int(data_record.expiry_timestamp or 0),
                data=data_record.response_data,
                validation=(
                    data_record.payload_hash if self.payload_validation_enabled else old.validation
                ),
            )

    def _delete_record(self, data_record: DataRecord) -> None:
        with self._lock:
            self._items.pop(data_record.idempotency_key, None)


_COLUMNS = "id, status, expiration, in_progress_expiration, data, validation"
# DynamoDB's condition, read against the stored row (``r``) of a conflicting insert.
_REPLACEABLE = (
    "r.expiration < {now} OR (r.status = {inprogress}"
    " AND r.in_progress_expiration IS NOT NULL AND r.in_progress_expiration < {now_in_millis})"
)
_PUT = (
    "INSERT INTO {table} AS r (" + _COLUMNS + ") VALUES ({id}, {status}, {expiration},"
    " {in_progress_expiration}, NULL, {validation})"
    " ON CONFLICT (id) DO UPDATE SET status = excluded.status, expiration = excluded.expiration,"
    " in_progress_expiration = excluded.in_progress_expiration, data = NULL,"
    " validation = excluded.validation WHERE " + _REPLACEABLE + " RETURNING id"
)
_UPDATE = (
    "INSERT INTO {table} (id, status, expiration, data, validation)"
    " VALUES ({id}, {status}, {expiration}, {data}, {validation})"
    " ON CONFLICT (id) DO UPDATE SET status = excluded.status, expiration = excluded.expiration,"
    " data = excluded.data"
)
_GET = "SELECT " + _COLUMNS + " FROM {table} WHERE id = {id}"
_DELETE = "DELETE FROM {table} WHERE id = {id}"
_NAMES = (*_Item._fields, "now", "now_in_millis", "inprogress")


class _SQLItemLayer(LocalPersistenceLayer):
    """The SQL layers: one statement per write, one row per record, placeholders per driver."""

    def _statements(self, table: str, placeholder: str) -> None:
        names = {name: placeholder.format(name) for name in _NAMES}
        self._put_sql = _PUT.format(table=table, **names)
        self._update_sql = _UPDATE.format(table=table, **names)
        # update_item sets the validation attribute only when payload validation is on.
        self._update_validation_sql = self._update_sql + ", validation = excluded.validation"
        self._get_sql = _GET.format(table=table, **names)
        self._delete_sql = _DELETE.format(table=table, **names)

    @abc.abstractmethod
    def _execute(self, sql: str, params: dict[str, Any]) -> list[tuple[Any, ...]]:
        """Run one autocommitted statement and return its rows."""

    def _get_record(self, idempotency_key: str) -> DataRecord:
        rows = self._execute(self._get_sql, {"id": idempotency_key})
        if not rows:
            raise IdempotencyItemNotFoundError
        return self._to_record(_Item(*rows[0]))

    def _put_record(self, data_record: DataRecord) -> None:
        item = self._new_item(data_record)
        now, now_in_millis = _now()
        params = item._asdict() | {
            "now": now,
            "now_in_millis": now_in_millis,
            "inprogress": INPROGRESS,
        }
        if self._execute(self._put_sql, params):
            return
        # DynamoDB hands back the old item with the failed put; SQL needs a read for it.
        rows = self._execute(self._get_sql, {"id": item.id})
        self._already_exists(data_record, _Item(*rows[0]) if rows else None)

    def _update_record(self, data_record: DataRecord) -> None:
        sql = self._update_validation_sql if self.payload_validation_enabled else self._update_sql
        self._execute(
            sql,
            {
                "id": data_record.idempotency_key,
                "status": data_record.status,
                "expiration": data_record.expiry_timestamp,
                "data": data_record.response_data,
                "validation": data_record.payload_hash or None,
            },
        )

    def _delete_record(self, data_record: DataRecord) -> None:
        self._execute(self._delete_sql, {"id": data_record.idempotency_key})


_SQLITE_SYNCHRONOUS = frozenset({"OFF", "NORMAL", "FULL", "EXTRA"})


class SQLitePersistenceLayer(_SQLItemLayer):
    """Records in a SQLite file (WAL, the given ``synchronous``), one autocommitted statement per write."""

    def __init__(self, path: Path, synchronous: str) -> None:
        if synchronous.upper() not in _SQLITE_SYNCHRONOUS:
            raise ValueError(f"synchronous must be one of {sorted(_SQLITE_SYNCHRONOUS)}")
        # isolation_level=None: autocommit, so each statement is its own transaction.
        self._conn = sqlite3.connect(path, isolation_level=None)
        self._conn.execute("PRAGMA journal_mode=WAL")
        self._conn.execute(f"PRAGMA synchronous={synchronous.upper()}")
        self._conn.execute(
            "CREATE TABLE IF NOT EXISTS idempotency (id TEXT PRIMARY KEY, status TEXT NOT NULL,"
            " expiration INTEGER NOT NULL, in_progress_expiration INTEGER, data TEXT, validation TEXT)"
        )
        self._statements("idempotency", ":{}")
        super().__init__()

    def _execute(self, sql: str, params: dict[str, Any]) -> list[tuple[Any, ...]]:
        # fetchall: with RETURNING the autocommit transaction ends only once the statement is done.
        rows: list[tuple[Any, ...]] = self._conn.execute(sql, params).fetchall()
        return rows

    def close(self) -> None:
        """Close the connection (the file stays, in the caller's folder)."""
        self._conn.close()


class PostgresPersistenceLayer(_SQLItemLayer):
    """Records in a PostgreSQL table of its own (psycopg 3, autocommit), dropped on close."""

    def __init__(self, dsn: str, table: str) -> None:
        import psycopg  # the extra may be absent: the dict and SQLite layers do not need it
        from psycopg import sql

        self._conn: psycopg.Connection[tuple[Any, ...]] = psycopg.connect(dsn, autocommit=True)
        quoted = sql.Identifier(table).as_string(self._conn)
        try:
            self._conn.execute(
                sql.SQL(
                    "CREATE TABLE {} (id TEXT PRIMARY KEY, status TEXT NOT NULL,"
                    " expiration BIGINT NOT NULL, in_progress_expiration BIGINT, data TEXT,"
                    " validation TEXT)"
                ).format(sql.Identifier(table))
            )
        except BaseException:
            self._conn.close()
            raise
        self._table = table
        self._statements(quoted, "%({})s")
        super().__init__()

    def _execute(self, sql: str, params: dict[str, Any]) -> list[tuple[Any, ...]]:
        cursor = self._conn.execute(sql, params)
        rows: list[tuple[Any, ...]] = cursor.fetchall() if cursor.description else []
        return rows

    def close(self) -> None:
        """Drop the table and close the connection."""
        from psycopg import sql

        try:
            self._conn.execute(
                sql.SQL("DROP TABLE IF EXISTS {}").format(sql.Identifier(self._table))
            )
        finally:
            self._conn.close()
