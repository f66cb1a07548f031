"""The request hash's quick path is byte-identical to ``rfc8785`` and refuses what it refuses.

``dataoad._canonical`` checks a request in one walk that builds no error
paths, and writes its canonical form with the standard library's C encoder
when no float and no key beyond the Basic Multilingual Plane occurs (else
with ``rfc8785``). A receipt stored by an earlier version must keep its
hash, so the bytes are held to ``rfc8785.dumps`` over generated JSON:
floats, exponents, ``-0.0``, control and escaped characters, astral
characters in keys and values, deep nesting. And the quick walk must refuse
exactly what the explaining walk refuses, so a bad request still gets its
typed error with the path that names the fault.
"""

from __future__ import annotations

import enum
import hashlib
from typing import Any

import pytest
import rfc8785
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dataoad import InvalidRequestError
from dataoad._canonical import (
    MAX_DEPTH,
    MAX_SAFE_INTEGER,
    _explain,
    _NotStrictJson,
    _request_error,
    _scan,
    canonical_json,
    checked_request_hash,
    request_hash,
)

# Text that exercises every escaping and ordering rule: controls, quotes,
# backslashes, DEL, line and paragraph separators, characters around the
# surrogate range (U+D7FF, U+E000, U+FFFF) and astral characters.
TRICKY = st.sampled_from(
    [
        *("\x00", "\x1f", '"', "\\", "\b", "\t", "\n", "\x7f", "\u2028"),
        *("\ud7ff", "\ue000", "\uffff", "\U00010000", "\U0001f600", "é", "a", "Z", "0"),
    ]
)
TEXT = st.one_of(
    st.text(max_size=8),
    st.lists(TRICKY, max_size=6).map("".join),
    st.text(st.characters(codec="utf-8"), max_size=8),
)
FLOATS = st.one_of(
    st.floats(allow_nan=False, allow_infinity=False),
    st.sampled_from([-0.0, 0.0, 1.0, 1e21, 1e-7, 1e20, 1e-6, 123456789012345680.0, 5e-324]),
)
SCALARS = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-MAX_SAFE_INTEGER, MAX_SAFE_INTEGER),
    FLOATS,
    TEXT,
)


def objects(scalars: st.SearchStrategy[Any]) -> st.SearchStrategy[dict[str, Any]]:
    """JSON objects nesting lists and objects of ``scalars``."""
    values = st.recursive(
        scalars,
        lambda inner: st.one_of(
            st.lists(inner, max_size=4), st.dictionaries(TEXT, inner, max_size=4)
        ),
        max_leaves=20,
    )
    return st.dictionaries(TEXT, values, max_size=5)


OBJECTS = objects(SCALARS)
# The same without floats: the values the C encoder writes.
PLAIN_OBJECTS = objects(
    st.one_of(st.none(), st.booleans(), st.integers(-MAX_SAFE_INTEGER, MAX_SAFE_INTEGER), TEXT)
)

EXAMPLES = settings(max_examples=200, deadline=None, suppress_health_check=list(HealthCheck))


@EXAMPLES
@given(OBJECTS)
def test_canonical_bytes_equal_rfc8785_on_any_strict_json(value: dict[str, Any]) -> None:
    assert canonical_json(value) == rfc8785.dumps(value)
    expected = hashlib.sha256(rfc8785.dumps(value)).hexdigest()
    assert request_hash(value) == expected
    assert checked_request_hash(value) == expected


@EXAMPLES
@given(PLAIN_OBJECTS)
def test_the_c_encoder_path_is_byte_identical_where_it_is_taken(value: dict[str, Any]) -> None:
    plain = _scan(value)
    keys_in_bmp = all(max(k, default="a") <= "\uffff" for k in _all_keys(value))
    assert plain is keys_in_bmp  # taken whenever no float and no astral key occurs
    assert canonical_json(value) == rfc8785.dumps(value)


def _all_keys(value: Any) -> list[str]:
    if type(value) is dict:
        return [k for key, child in value.items() for k in (key, *_all_keys(child))]
    if type(value) is list:
        return [k for child in value for k in _all_keys(child)]
    return []


def test_keys_are_ordered_by_utf16_code_units_not_code_points() -> None:
    # U+E000 sorts after U+1F600 by code point but before it in UTF-16
    # (the astral key's first unit is a high surrogate, 0xD83D).
    value = {"\ue000": 1, "\U0001f600": 2}
    assert _scan(value) is False
    assert canonical_json(value) == '{"\U0001f600":2,"\ue000":1}'.encode()


class Level(enum.IntEnum):
    LOW = 1


class MyStr(str):
    pass


# Leaves and keys the rules refuse, mixed into otherwise valid values.
BAD_LEAVES = st.sampled_from(
    [
        float("nan"),
        float("inf"),
        -float("inf"),
        MAX_SAFE_INTEGER + 1,
        -MAX_SAFE_INTEGER - 1,
        Level.LOW,
        MyStr("x"),
        (1, 2),
        {1, 2},
        b"bytes",
        "\ud800",
        object(),
    ]
)
BAD_KEYS = st.sampled_from([1, None, ("t",), "\udfff", MyStr("k")])
MAYBE_BAD = st.recursive(
    st.one_of(SCALARS, BAD_LEAVES),
    lambda inner: st.one_of(
        st.lists(inner, max_size=3),
        st.dictionaries(st.one_of(TEXT, BAD_KEYS), inner, max_size=3),
    ),
    max_leaves=12,
)


def _explained(value: object) -> InvalidRequestError | None:
    try:
        _explain(value, root="request", error=_request_error)
    except InvalidRequestError as exc:
        return exc
    return None


@EXAMPLES
@given(st.one_of(MAYBE_BAD, st.dictionaries(st.one_of(TEXT, BAD_KEYS), MAYBE_BAD, max_size=4)))
def test_the_quick_walk_refuses_exactly_what_the_explaining_walk_refuses(value: object) -> None:
    explained = _explained(value)
    try:
        _scan(value)
        quick_refused = False
    except _NotStrictJson:
        quick_refused = True
    assert quick_refused is (explained is not None)
    if explained is not None:
        with pytest.raises(InvalidRequestError) as info:
            checked_request_hash(value)
        assert str(info.value) == str(explained)
        assert info.value.path == explained.path


def test_cycles_and_depth_are_refused_by_both_walks() -> None:
    looped: dict[str, Any] = {"a": []}
    looped["a"].append(looped)
    deep: dict[str, Any] = {}
    node = deep
    for _ in range(MAX_DEPTH + 1):
        node["d"] = {}
        node = node["d"]
    shared = [1]
    for value, refused in [(looped, True), (deep, True), ({"x": shared, "y": shared}, False)]:
        assert (_explained(value) is not None) is refused
        if refused:
            with pytest.raises(_NotStrictJson):
                _scan(value)
        else:
            _scan(value)
