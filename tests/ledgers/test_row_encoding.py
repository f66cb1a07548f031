"""Row encoding: unchanged fields reuse their text, and the text is always what a fresh encoding gives."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta, timezone

import pytest
from hypothesis import given
from hypothesis import strategies as st

from dataoad import ActionStatus, InvalidArgumentError
from dataoad._receipt import AttemptRecord
from dataoad.ledgers import _codec
from dataoad.ledgers._codec import attempts_from, attempts_json, json_text, metadata_json
from dataoad.testing import make_receipt

_T0 = datetime(2026, 1, 1, tzinfo=UTC)

statuses = st.none() | st.sampled_from(ActionStatus)
# Fixed offsets only: a named zone's ambiguous hour never equals its own
# read-back (stored times keep the offset, not the zone; the runner writes UTC).
offsets = st.integers(-86399, 86399).map(lambda s: timezone(timedelta(seconds=s)))
moments = st.integers(0, 10**9).map(lambda us: _T0 + timedelta(microseconds=us)) | st.datetimes(
    timezones=st.none() | offsets
)
# Any code point, lone surrogates, quotes, backslashes and controls included.
texts = st.text(st.characters(codec=None, exclude_categories=()), max_size=40)
records = st.builds(
    AttemptRecord,
    number=st.integers(0, 2**70) | st.booleans(),
    started_at=moments,
    execution_status=statuses,
    verification_status=statuses,
    error=st.none() | texts,
    provider_request_id=st.none() | texts,
    retry_decision=st.none() | st.sampled_from(["retry", "stop"]) | texts,
    finished_at=st.none() | moments,
)


def _fresh(rs: tuple[AttemptRecord, ...]) -> str:
    """The encoding written before reuse existed: one json.dumps of the whole list."""
    return json_text(
        [
            {
                "number": r.number,
                "started_at": r.started_at.isoformat(),
                "execution_status": None
                if r.execution_status is None
                else r.execution_status.value,
                "verification_status": None
                if r.verification_status is None
                else r.verification_status.value,
                "error": r.error,
                "provider_request_id": r.provider_request_id,
                "retry_decision": r.retry_decision,
                "finished_at": None if r.finished_at is None else r.finished_at.isoformat(),
            }
            for r in rs
        ]
    )


@given(st.lists(records, max_size=6).map(tuple), records)
def test_attempt_records_text_is_byte_identical_to_a_fresh_encoding(
    rs: tuple[AttemptRecord, ...], changed: AttemptRecord
) -> None:
    for chosen in (rs, (*rs[:-1], changed)):  # then a transition: only the last one new
        fresh = _fresh(chosen)
        if not _storable(fresh):
            # A lone surrogate: JSON keeps it, no database encoder writes it.
            with pytest.raises(InvalidArgumentError, match="lone surrogate"):
                attempts_json(chosen)
            continue
        assert attempts_json(chosen) == fresh
        assert attempts_from(attempts_json(chosen)) == chosen


def _storable(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


@given(
    st.sampled_from(["error", "provider_request_id", "retry_decision"]),
    st.integers() | st.lists(st.integers(), max_size=2),
)
def test_a_field_of_an_undeclared_type_is_written_as_json_would_write_it(
    field: str, value: object
) -> None:
    record = AttemptRecord(number=1, started_at=_T0, **{field: value})  # type: ignore[arg-type]
    assert attempts_json((record,)) == _fresh((record,))
    assert json.loads(attempts_json((record,)))[0][field] == value


def test_an_equal_but_new_record_is_encoded_afresh_and_a_full_cache_starts_over() -> None:
    record = AttemptRecord(number=1, started_at=_T0, error="boom")
    text = attempts_json((record,))
    # More records than the cache holds: it starts over, and every text is right.
    many = [AttemptRecord(number=1, started_at=_T0, error=f"e{i}") for i in range(3000)]
    for i, r in enumerate(many):
        assert json.loads(attempts_json((r,)))[0]["error"] == f"e{i}"
    assert len(_codec._ENCODED._entries) <= 1024
    assert attempts_json((record,)) == text


def test_metadata_text_is_reused_only_for_a_frozen_snapshot() -> None:
    receipt = make_receipt(metadata={"k": [1, {"n": "é"}]})
    assert metadata_json(receipt.metadata) == '{"k":[1,{"n":"é"}]}'
    assert metadata_json(receipt.evolve(version=2).metadata) == '{"k":[1,{"n":"é"}]}'
    # A plain dict may change between writes: never served from the cache.
    plain: dict[str, object] = {"k": 1}
    assert metadata_json(plain) == '{"k":1}'
    plain["k"] = 2
    assert metadata_json(plain) == '{"k":2}'
