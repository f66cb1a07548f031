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

from dataoad._canonical import json_text
from dataoad._errors import InvalidArgumentError
from dataoad._frozen import FrozenDict
from dataoad._receipt import ActionReceipt, AttemptRecord, build_receipt
from dataoad._records import MAX_RECEIPT_OPERATOR_RECORDS, OperatorRecord
from dataoad._status import ActionStatus, ClaimState
from dataoad._verification import unstorable

__all__ = [
    "COLUMNS",
    "IDENTITY",
    "MUTABLE",
    "NO_OPERATOR_RECORDS",
    "WRITTEN",
    "attempts_from",
    "attempts_json",
    "json_text",
    "metadata_json",
    "operator_records_from",
    "receipt_of",
    "row_of",
    "status",
    "status_text",
    "values_of",
    "with_operator_record",
]

#: The receipts table's columns, in the order of ``row_of`` and ``receipt_of``.
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
    "owner",
    "fencing_token",
    "namespace",
    "retired_at",
    "lease_expires_at",
    "stored_at",
    "operator_records",
)

#: The columns a write takes from the receipt: all but the lease, the time
#: of storing, which the ledger stamps from its own clock, and the operator
#: records, which only an audit append writes (a writer's copy may be stale).
WRITTEN: Final = COLUMNS[:-3]
#: What a new claim stores as its operator records: none.
NO_OPERATOR_RECORDS: Final = "[]"

#: The claim's identity, which no transition changes.
IDENTITY: Final = (
    "action_id",
    "namespace",
    "action_name",
    "idempotency_key",
    "request_hash",
    "provider_reference",
    "risk",
)

#: Columns a transition copies from the receipt. Not the identity, and not
#: ``retired_at``, which only retiring sets (``_lifecycle``).
MUTABLE: Final = tuple(c for c in WRITTEN if c not in IDENTITY and c != "retired_at")


def status(value: str | None) -> ActionStatus | None:
    """The ActionStatus stored as ``value``."""
    return None if value is None else ActionStatus(value)


def status_text(value: ActionStatus | None) -> str | None:
    """How ``value`` is stored."""
    return None if value is None else value.value


def _time_text(moment: datetime | None) -> str | None:
    return None if moment is None else moment.isoformat()


class _EncodedByIdentity:
    """The text of immutable values this process wrote lately, by identity.

    A transition copies every field it does not change (``evolve``), so the
    metadata and the earlier attempt records of a receipt being written are
    the very objects of its last write: their text is reused, and only what
    changed is encoded again. Holding the value keeps its id from being
    reused while cached. Bounded; a race between threads only costs an
    encoding.
    """

    __slots__ = ("_entries", "_limit")

    def __init__(self, limit: int) -> None:
        self._entries: dict[int, tuple[object, str]] = {}
        self._limit = limit

    def text(self, value: Any, encode: Callable[[Any], str]) -> str:
        entry = self._entries.get(id(value))
        if entry is not None and entry[0] is value:
            return entry[1]
        text = encode(value)
        if len(self._entries) >= self._limit:
            self._entries = {}  # rebound, not cleared: a reader mid-lookup is unharmed
        self._entries[id(value)] = (value, text)
        return text


_ENCODED: Final = _EncodedByIdentity(1024)


def _record_object(r: AttemptRecord) -> dict[str, Any]:
    return {
        "number": r.number,
        "started_at": _time_text(r.started_at),
        "execution_status": status_text(r.execution_status),
        "verification_status": status_text(r.verification_status),
        "error": r.error,
        "provider_request_id": r.provider_request_id,
        "retry_decision": r.retry_decision,
        "finished_at": _time_text(r.finished_at),
    }


#: How ``json_text`` writes a string (``ensure_ascii=False``).
_quoted: Final[Callable[[str], str]] = json.encoder.encode_basestring


def _quoted_or_null(value: str | None) -> str:
    return "null" if value is None else _quoted(value)


def _status_json(value: ActionStatus | None) -> str:
    return "null" if value is None else _quoted(value.value)


def _time_json(moment: datetime | None) -> str:
    # isoformat writes only digits and "-:.+T": nothing to escape.
    return "null" if moment is None else f'"{moment.isoformat()}"'


def _record_json(r: AttemptRecord) -> str:
    """``json_text(_record_object(r))``, byte for byte, without building the object.

    Every write encodes its new attempt record, and going through a dict
    cost more than the rest of the row; the generic path stays for any
    field of an unexpected type (an int subclass, a string of another type).
    """
    if type(r.number) is not int:  # a bool is written as true, not as its int
        return json_text(_record_object(r))
    try:
        return (
            f'{{"number":{r.number},"started_at":{_time_json(r.started_at)},'
            f'"execution_status":{_status_json(r.execution_status)},'
            f'"verification_status":{_status_json(r.verification_status)},'
            f'"error":{_quoted_or_null(r.error)},'
            f'"provider_request_id":{_quoted_or_null(r.provider_request_id)},'
            f'"retry_decision":{_quoted_or_null(r.retry_decision)},'
            f'"finished_at":{_time_json(r.finished_at)}}}'
        )
    except (TypeError, AttributeError):  # a field not of its declared type
        return json_text(_record_object(r))


def _storable(what: str, encode: Callable[[Any], str]) -> Callable[[Any], str]:
    """``encode``, refusing (InvalidArgumentError) what no ledger could store.

    The runner only ever hands a ledger JSON it has checked; a receipt built
    by hand may hold a value JSON has no form for, or a lone surrogate, which
    the JSON text keeps and no database encoder writes.
    """

    def storable(value: Any) -> str:
        try:
            text = encode(value)
        except (TypeError, ValueError) as exc:
            raise InvalidArgumentError(f"{what} cannot be stored as JSON: {exc}") from None
        why = unstorable(text)
        if why is not None:
            raise InvalidArgumentError(f"{what} {why}")
        return text

    return storable


_RECORD_TEXT: Final = _storable("an attempt record", _record_json)
_METADATA_TEXT: Final = _storable("metadata", json_text)


def attempts_json(records: Sequence[AttemptRecord]) -> str:
    """Attempt records as JSON text (a JSON array of one object per record)."""
    return "[" + ",".join(_ENCODED.text(r, _RECORD_TEXT) for r in records) + "]"


def metadata_json(metadata: Any) -> str:
    """A receipt's metadata as JSON text (reused while the frozen snapshot is unchanged)."""
    if type(metadata) is not FrozenDict:  # only a receipt's deep-frozen snapshot is cached
        return _METADATA_TEXT(metadata)
    return _ENCODED.text(metadata, _METADATA_TEXT)


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


def operator_records_from(text: str) -> tuple[OperatorRecord, ...]:
    """A receipt's operator records from their JSON text (oldest first)."""
    if text == NO_OPERATOR_RECORDS:  # nearly every receipt: skip the parser
        return ()
    return tuple(OperatorRecord.from_json(item) for item in json.loads(text))


def with_operator_record(text: str, record: OperatorRecord) -> str:
    """The JSON text of a receipt's operator records with ``record`` appended (the newest kept)."""
    items = json.loads(text)
    items.append(record.to_json())
    return json_text(items[-MAX_RECEIPT_OPERATOR_RECORDS:])


def _same(moment: datetime) -> Any:
    return moment


def values_of(receipt: ActionReceipt, time: Callable[[datetime], Any] = _same) -> dict[str, Any]:
    """The receipt's column values by column name; ``time`` encodes the two timestamps."""
    return {
        "action_id": receipt.action_id,
        "action_name": receipt.action_name,
        "idempotency_key": receipt.idempotency_key,
        "request_hash": receipt.request_hash,
        "provider_reference": receipt.provider_reference,
        "risk": receipt.risk,
        "claim_state": receipt.claim_state.value,
        "attempts": receipt.attempts,
        "execution_status": status_text(receipt.execution_status),
        "verification_status": status_text(receipt.verification_status),
        "final_status": status_text(receipt.final_status),
        "provider_request_id": receipt.provider_request_id,
        "error": receipt.error,
        "metadata": metadata_json(receipt.metadata),
        "attempt_records": attempts_json(receipt.attempt_records),
        "version": receipt.version,
        "created_at": time(receipt.created_at),
        "updated_at": time(receipt.updated_at),
        "owner": receipt.owner,
        "fencing_token": receipt.fencing_token,
        "namespace": receipt.namespace,
        "retired_at": None if receipt.retired_at is None else time(receipt.retired_at),
    }


def row_of(receipt: ActionReceipt, time: Callable[[datetime], Any] = _same) -> tuple[Any, ...]:
    """The receipt as a row of WRITTEN, in their order (for whole-row inserts)."""
    values = values_of(receipt, time)
    return tuple(values[column] for column in WRITTEN)


def receipt_of(row: Sequence[Any], time: Callable[[Any], datetime] = _same) -> ActionReceipt:
    """The receipt stored as ``row`` (the COLUMNS, selected in their order)."""
    value = dict(zip(COLUMNS, row, strict=True))
    return build_receipt(
        {
            "action_id": value["action_id"],
            "action_name": value["action_name"],
            "idempotency_key": value["idempotency_key"],
            "request_hash": value["request_hash"],
            "provider_reference": value["provider_reference"],
            "risk": value["risk"],
            "claim_state": ClaimState(value["claim_state"]),
            "attempts": value["attempts"],
            "execution_status": status(value["execution_status"]),
            "verification_status": status(value["verification_status"]),
            "final_status": status(value["final_status"]),
            "provider_request_id": value["provider_request_id"],
            "error": value["error"],
            "metadata": json.loads(value["metadata"]),
            "attempt_records": attempts_from(value["attempt_records"]),
            "version": value["version"],
            "created_at": time(value["created_at"]),
            "updated_at": time(value["updated_at"]),
            "owner": value["owner"],
            "fencing_token": value["fencing_token"],
            "namespace": value["namespace"],
            "retired_at": None if value["retired_at"] is None else time(value["retired_at"]),
            "lease_expires_at": None
            if value["lease_expires_at"] is None
            else time(value["lease_expires_at"]),
            "stored_at": None if value["stored_at"] is None else time(value["stored_at"]),
            "operator_records": operator_records_from(value["operator_records"]),
        }
    )
