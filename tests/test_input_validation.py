"""Strict request validation, metadata rules and argument checks."""

from __future__ import annotations

import asyncio
import dataclasses
import datetime
import enum
import os
import uuid
import warnings
from typing import Any

import pytest

from dataoad import (
    ActionRunner,
    InMemoryLedger,
    InvalidArgumentError,
    InvalidRequestError,
    ReservedMetadataError,
    RetryPolicy,
)
from tests.support import CountingOperation


class Color(enum.Enum):
    RED = "red"


class IntColor(enum.IntEnum):
    ONE = 1


class MyStr(str):
    pass


class MyInt(int):
    pass


class MyDict(dict):  # type: ignore[type-arg]
    pass


@dataclasses.dataclass
class Point:
    x: int


def run(coro):
    return asyncio.run(coro)


async def attempt(request: Any = None, **kw: Any) -> tuple[CountingOperation, InMemoryLedger]:
    ledger = InMemoryLedger()
    op = CountingOperation()
    kw.setdefault("idempotency_key", "k")
    await ActionRunner(ledger).execute("a", op, request=request, **kw)
    return op, ledger


def assert_rejected_before_anything(error: type[Exception], **kw: Any) -> Exception:
    ledger = InMemoryLedger()
    op = CountingOperation()
    kw.setdefault("idempotency_key", "k")
    kw.setdefault("request", {})

    async def scenario() -> Exception:
        with pytest.raises(error) as info:
            await ActionRunner(ledger).execute(kw.pop("action_name", "a"), kw.pop("op", op), **kw)
        return info.value

    exc = run(scenario())
    assert op.calls == 0
    assert ledger.snapshot() == []
    return exc


@pytest.mark.parametrize(
    ("request_", "path"),
    [
        (
            {"items": [{"price": 1}, {"price": 2}, {"price": (1, 2)}]},
            'request["items"][2]["price"]',
        ),
        ({"a": (1,)}, 'request["a"]'),
        ({"a": Color.RED}, 'request["a"]'),
        ({"a": IntColor.ONE}, 'request["a"]'),
        ({"a": Point(1)}, 'request["a"]'),
        ({"a": datetime.date(2024, 1, 1)}, 'request["a"]'),
        ({"a": datetime.datetime(2024, 1, 1)}, 'request["a"]'),
        ({"a": uuid.UUID(int=1)}, 'request["a"]'),
        ({"a": MyStr("x")}, 'request["a"]'),
        ({"a": MyInt(1)}, 'request["a"]'),
        ({"a": MyDict()}, 'request["a"]'),
        ({"a": float("nan")}, 'request["a"]'),
        ({"a": float("inf")}, 'request["a"]'),
        ({"a": float("-inf")}, 'request["a"]'),
        ({"a": {1, 2}}, 'request["a"]'),
        ({"a": b"bytes"}, 'request["a"]'),
        ({"a": 2**53}, 'request["a"]'),
        ({"a": -(2**53)}, 'request["a"]'),
        ({"a": "\ud800"}, 'request["a"]'),
        ({"nested": {"deeper": [0, [1, object()]]}}, 'request["nested"]["deeper"][1][1]'),
        ({1: "int key"}, "request"),
        ({MyStr("k"): 1}, "request"),
    ],
)
def test_invalid_request_is_rejected_naming_the_path(request_: Any, path: str) -> None:
    exc = assert_rejected_before_anything(InvalidRequestError, request=request_)
    assert isinstance(exc, TypeError)
    assert exc.path == path  # type: ignore[attr-defined]
    assert path in str(exc)


@pytest.mark.parametrize("request_", [None, [], "{}", (), MyDict(a=1)])
def test_request_must_be_an_exact_dict(request_: Any) -> None:
    exc = assert_rejected_before_anything(InvalidRequestError, request=request_)
    assert exc.path == "request"  # type: ignore[attr-defined]


def test_bool_subclass_and_exact_scalars_accepted() -> None:
    ok = {
        "none": None,
        "t": True,
        "i": 2**53 - 1,
        "n": -(2**53 - 1),
        "f": 1.5,
        "s": "é",
        "l": [1, [2, {"x": []}]],
        "d": {},
    }
    op, ledger = run(attempt(ok))
    assert op.calls == 1
    assert len(ledger.snapshot()) == 1


def test_cyclic_request_gets_a_clear_error() -> None:
    cyclic: dict[str, Any] = {"a": []}
    cyclic["a"].append(cyclic)
    exc = assert_rejected_before_anything(InvalidRequestError, request=cyclic)
    assert "cycle" in str(exc)


def test_deeply_nested_request_gets_a_clear_error_not_recursion_error() -> None:
    deep: dict[str, Any] = {}
    node = deep
    for _ in range(100_000):
        node["x"] = {}
        node = node["x"]
    exc = assert_rejected_before_anything(InvalidRequestError, request=deep)
    assert "deeper than" in str(exc)


def test_reserved_metadata_keys_are_rejected_before_a_claim_exists() -> None:
    for key in (
        "attempt_history",
        "attempt_records",
        "provider",
        "provider_request_id_conflict",
        "provider_request_ids",
        "recovery",
        "verification",
        "verification_conflict",
        "verification_observation_count",
        "verification_observations",
    ):
        exc = assert_rejected_before_anything(ReservedMetadataError, metadata={key: 1})
        assert isinstance(exc, ValueError)
        assert key in str(exc)


def test_nested_reserved_names_are_allowed() -> None:
    _op, ledger = run(attempt({}, metadata={"note": {"verification": "manual"}}))
    assert ledger.snapshot()[0].metadata["note"]["verification"] == "manual"


@pytest.mark.parametrize(
    "metadata",
    [{"a": object()}, {"a": float("nan")}, {1: "x"}, [], "x", {"a": (1,)}],
)
def test_metadata_must_be_json_compatible(metadata: Any) -> None:
    assert_rejected_before_anything(InvalidArgumentError, metadata=metadata)


def test_metadata_is_snapshotted_and_immutable() -> None:
    metadata: dict[str, Any] = {"tags": ["a"]}
    _op, ledger = run(attempt({}, metadata=metadata))
    metadata["tags"].append("b")
    stored = ledger.snapshot()[0].metadata
    assert list(stored["tags"]) == ["a"]
    with pytest.raises(TypeError):
        stored["tags"] = ()  # type: ignore[index]


@pytest.mark.parametrize(
    "kw",
    [
        {"action_name": ""},
        {"action_name": 3},
        {"action_name": MyStr("a")},
        {"idempotency_key": ""},
        {"idempotency_key": 7},
        {"idempotency_key": None},
        {"provider_reference": ""},
        {"provider_reference": 5},
        {"risk": 1},
        {"op": "not callable"},
    ],
)
def test_invalid_arguments_raise_before_anything(kw: dict[str, Any]) -> None:
    assert_rejected_before_anything(InvalidArgumentError, **kw)


def test_bad_input_leaves_existing_receipts_untouched() -> None:
    async def scenario() -> None:
        ledger = InMemoryLedger()
        runner = ActionRunner(ledger)
        await runner.execute("a", lambda: 1, request={"x": 1}, idempotency_key="k")
        before = ledger.snapshot()
        with pytest.raises(InvalidRequestError):
            await runner.execute("a", lambda: 1, request={"x": (1,)}, idempotency_key="k")
        with pytest.raises(ReservedMetadataError):
            await runner.execute(
                "a", lambda: 1, request={"x": 1}, idempotency_key="k", metadata={"recovery": 1}
            )
        assert ledger.snapshot() == before

    run(scenario())


def test_ledger_must_implement_the_protocol() -> None:
    with pytest.raises(InvalidArgumentError, match="Ledger protocol"):
        ActionRunner(object())  # type: ignore[arg-type]


def test_the_escape_hatch_warning_points_at_the_caller() -> None:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        RetryPolicy(max_attempts=2, retry_on_unknown=True)
    [warning] = caught
    # mutmut's trampolines add stack frames, so only an unmutated run can
    # check where the warning points.
    if "MUTANT_UNDER_TEST" not in os.environ:
        assert warning.filename == __file__
