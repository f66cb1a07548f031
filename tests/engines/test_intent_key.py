"""``dataoad.intent_key``: one key per intent, the same on every host and Python version."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys

import pytest

from dataoad import InvalidArgumentError, InvalidRequestError, intent_key
from dataoad._bounds import DEFAULT_MAX_REQUEST_BYTES
from dataoad._intent import MAX_SCOPE_LENGTH

#: Fixed vectors: (scope, action, request, key). The keys were computed once
#: and are never recomputed: a change here is a change of every stored key.
VECTORS = [
    (
        "order-1",
        "charge",
        {"amount": 1000, "currency": "EUR"},
        "intent-v1:aa1c8c1e9ac65f8e8bff859aa95bc2da8fbdb4de4c64fcc7a78b2ebf3f1e2214",
    ),
    (
        "conv-\u00e9",
        "refund",
        {"b": [1, 2.5, "x"], "a": {"z": None, "y": True}},
        "intent-v1:865f169949ddeeebe92419c90a64092477ca1e98814c5b2c115a107fb0775220",
    ),
    ("o", "a", {}, "intent-v1:74cb159356381d25a863ce63ac58f4f389b51ad15d6f6c8c55bf59d110671c0f"),
]

#: The same vectors' RFC 8785 bytes, written out by hand (sorted keys, no
#: spaces, UTF-8, shortest number forms).
CANONICAL = [
    b'["order-1","charge",{"amount":1000,"currency":"EUR"}]',
    '["conv-\u00e9","refund",{"a":{"y":true,"z":null},"b":[1,2.5,"x"]}]'.encode(),
    b'["o","a",{}]',
]


@pytest.mark.parametrize(("vector", "canonical"), list(zip(VECTORS, CANONICAL, strict=True)))
def test_fixed_vectors(vector: tuple[str, str, dict[str, object], str], canonical: bytes) -> None:
    scope, action, request, key = vector
    assert intent_key(scope, action, request) == key
    assert key == "intent-v1:" + hashlib.sha256(canonical).hexdigest()


def test_the_same_keys_in_another_interpreter_with_another_hash_seed() -> None:
    script = (
        "import json, sys\nfrom dataoad import intent_key\n"
        "print(json.dumps([intent_key(s, a, r) for s, a, r in json.load(sys.stdin)]))"
    )
    out = subprocess.run(
        [sys.executable, "-c", script],
        input=json.dumps([v[:3] for v in VECTORS]),
        capture_output=True,
        text=True,
        check=True,
        env={**os.environ, "PYTHONHASHSEED": "12345", "LC_ALL": "C"},
    ).stdout
    assert json.loads(out) == [v[3] for v in VECTORS]


def test_key_order_does_not_matter_and_every_part_does() -> None:
    base = intent_key("order-1", "charge", {"amount": 1000, "currency": "EUR"})
    assert intent_key("order-1", "charge", {"currency": "EUR", "amount": 1000}) == base
    others = {
        intent_key("order-2", "charge", {"amount": 1000, "currency": "EUR"}),
        intent_key("order-1", "refund", {"amount": 1000, "currency": "EUR"}),
        intent_key("order-1", "charge", {"amount": 1001, "currency": "EUR"}),
        intent_key("order-1", "charge", {"amount": "1000", "currency": "EUR"}),
    }
    assert base not in others
    assert len(others) == 4


def test_parts_cannot_be_shifted_into_one_another() -> None:
    # A separator-joined key would make these two one intent.
    assert intent_key("a:b", "c", {}) != intent_key("a", "b:c", {})
    assert intent_key('a","b', "c", {}) != intent_key("a", 'b","c', {})


def test_the_key_is_a_valid_idempotency_key() -> None:
    key = intent_key("x" * MAX_SCOPE_LENGTH, "a" * 128, {"k": "v"})
    assert key.startswith("intent-v1:")
    assert len(key) == 10 + 64


@pytest.mark.parametrize(
    ("scope", "action", "request_", "error"),
    [
        ("", "charge", {}, InvalidArgumentError),
        (None, "charge", {}, InvalidArgumentError),
        (b"order", "charge", {}, InvalidArgumentError),
        ("a\x00b", "charge", {}, InvalidArgumentError),
        ("\ud800", "charge", {}, InvalidArgumentError),
        ("x" * (MAX_SCOPE_LENGTH + 1), "charge", {}, InvalidArgumentError),
        ("order", "", {}, InvalidArgumentError),
        ("order", "a" * 129, {}, InvalidArgumentError),
        ("order", 7, {}, InvalidArgumentError),
        ("order", "charge", [], InvalidRequestError),
        ("order", "charge", None, InvalidRequestError),
        ("order", "charge", {"amount": float("nan")}, InvalidRequestError),
        ("order", "charge", {"when": object()}, InvalidRequestError),
        ("order", "charge", {"pair": (1, 2)}, InvalidRequestError),
        ("order", "charge", {1: "not a str key"}, InvalidRequestError),
    ],
)
def test_bad_input_is_refused_with_a_typed_error(
    scope: object, action: object, request_: object, error: type[Exception]
) -> None:
    with pytest.raises(error):
        intent_key(scope, action, request_)  # type: ignore[arg-type]


def test_the_request_bound_is_execute_s_default_on_both_sides() -> None:
    overhead = len(b'{"p":""}')
    fits = {"p": "x" * (DEFAULT_MAX_REQUEST_BYTES - overhead)}
    intent_key("order", "charge", fits)
    too_big = {"p": "x" * (DEFAULT_MAX_REQUEST_BYTES - overhead + 1)}
    with pytest.raises(InvalidRequestError, match="bytes in canonical form"):
        intent_key("order", "charge", too_big)
