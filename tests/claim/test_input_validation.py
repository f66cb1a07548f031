"""Strict request validation, metadata rules and argument checks."""

from __future__ import annotations

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
    ActionStatus,
    InMemoryLedger,
    InvalidArgumentError,
    InvalidRequestError,
    ReservedMetadataError,
    RetryPolicy,
)
from suite_support import REF, REQUEST, CountingOperation, confirmed, fixed_verifier

C, F, U = ActionStatus.CONFIRMED, ActionStatus.FAILED, ActionStatus.UNKNOWN


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


async def attempt(request: Any = None, **kw: Any) -> tuple[CountingOperation, InMemoryLedger]:
    ledger = InMemoryLedger()
    op = CountingOperation()
    kw.setdefault("idempotency_key", "k")
    await ActionRunner(ledger).execute("a", op, request=request, **kw)
    return op, ledger


async def assert_rejected_before_anything(error: type[Exception], **kw: Any) -> Exception:
    ledger = InMemoryLedger()
    op = CountingOperation()
    kw.setdefault("idempotency_key", "k")
    kw.setdefault("request", {})

    with pytest.raises(error) as info:
        await ActionRunner(ledger).execute(kw.pop("action_name", "a"), kw.pop("op", op), **kw)
    exc = info.value
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
async def test_invalid_request_is_rejected_naming_the_path(request_: Any, path: str) -> None:
    exc = await assert_rejected_before_anything(InvalidRequestError, request=request_)
    assert isinstance(exc, TypeError)
    assert exc.path == path  # type: ignore[attr-defined]
    assert path in str(exc)


@pytest.mark.parametrize("request_", [None, [], "{}", (), MyDict(a=1)])
async def test_request_must_be_an_exact_dict(request_: Any) -> None:
    exc = await assert_rejected_before_anything(InvalidRequestError, request=request_)
    assert exc.path == "request"  # type: ignore[attr-defined]


async def test_bool_subclass_and_exact_scalars_accepted() -> None:
    ok: dict[str, Any] = {
        "none": None,
        "t": True,
        "i": 2**53 - 1,
        "n": -(2**53 - 1),
        "f": 1.5,
        "s": "é",
        "l": [1, [2, {"x": []}]],
        "d": {},
    }
    op, ledger = await attempt(ok)
    assert op.calls == 1
    assert len(ledger.snapshot()) == 1


async def test_cyclic_request_gets_a_clear_error() -> None:
    cyclic: dict[str, Any] = {"a": []}
    cyclic["a"].append(cyclic)
    exc = await assert_rejected_before_anything(InvalidRequestError, request=cyclic)
    assert "cycle" in str(exc)


async def test_deeply_nested_request_gets_a_clear_error_not_recursion_error() -> None:
    deep: dict[str, Any] = {}
    node = deep
    for _ in range(100_000):
        node["x"] = {}
        node = node["x"]
    exc = await assert_rejected_before_anything(InvalidRequestError, request=deep)
    assert "deeper than" in str(exc)


async def test_reserved_metadata_keys_are_rejected_before_a_claim_exists() -> None:
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
        exc = await assert_rejected_before_anything(ReservedMetadataError, metadata={key: 1})
        assert isinstance(exc, ValueError)
        assert key in str(exc)


async def test_nested_reserved_names_are_allowed() -> None:
    _op, ledger = await attempt({}, metadata={"note": {"verification": "manual"}})
    assert ledger.snapshot()[0].metadata["note"]["verification"] == "manual"


@pytest.mark.parametrize(
    "metadata",
    [{"a": object()}, {"a": float("nan")}, {1: "x"}, [], "x", {"a": (1,)}],
)
async def test_metadata_must_be_json_compatible(metadata: Any) -> None:
    await assert_rejected_before_anything(InvalidArgumentError, metadata=metadata)


async def test_metadata_is_snapshotted_and_immutable() -> None:
    metadata: dict[str, Any] = {"tags": ["a"]}
    _op, ledger = await attempt({}, metadata=metadata)
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
async def test_invalid_arguments_raise_before_anything(kw: dict[str, Any]) -> None:
    await assert_rejected_before_anything(InvalidArgumentError, **kw)


async def test_bad_input_leaves_existing_receipts_untouched() -> None:
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


def test_a_stored_text_must_be_encodable() -> None:
    from dataoad._verification import check_stored_text

    with pytest.raises(InvalidArgumentError) as info:
        check_stored_text("name", "a\ud800", limit=10)
    assert str(info.value) == "name is not valid Unicode (lone surrogate)"
    with pytest.raises(InvalidArgumentError) as info:
        check_stored_text("name", None, limit=10)
    assert str(info.value) == "name must be a str, not NoneType"


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (
            lambda: ActionRunner(object()),  # type: ignore[arg-type]
            "ledger object does not implement the Ledger protocol",
        ),
        (
            lambda: ActionRunner(InMemoryLedger(), policy=3),  # type: ignore[arg-type]
            "policy must be a RetryPolicy, not int",
        ),
    ],
)
def test_a_bad_runner_argument_is_named(call: Any, message: str) -> None:
    with pytest.raises(InvalidArgumentError) as info:
        call()
    assert str(info.value).startswith(message)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"operation": 3}, "operation must be callable, not int"),
        ({"policy": "x"}, "policy must be a RetryPolicy, not str"),
        (
            {"verifier": fixed_verifier(confirmed()), "provider_reference": None},
            "a verifier needs provider_reference: verification must be bound to the "
            "provider's own reference for this mutation",
        ),
        (
            {"verifier": 3},
            "verifier must have a callable verify(receipt) method or be a callable, not int",
        ),
    ],
)
async def test_a_bad_execute_argument_is_named_before_anything_is_stored(
    kwargs: dict[str, Any], message: str
) -> None:
    ledger = InMemoryLedger()
    call: dict[str, Any] = {
        "operation": CountingOperation(),
        "request": REQUEST,
        "idempotency_key": "k",
        "provider_reference": REF,
        **kwargs,
    }
    operation = call.pop("operation")
    with pytest.raises(InvalidArgumentError) as info:
        await ActionRunner(ledger).execute("charge", operation, **call)
    assert str(info.value) == message
    assert await ledger.find("charge", "k") is None


async def test_a_bad_text_argument_is_named() -> None:
    with pytest.raises(InvalidArgumentError) as info:
        await ActionRunner(InMemoryLedger()).execute(  # type: ignore[call-overload]
            3,
            CountingOperation(),
            request={},
            idempotency_key="k",
        )
    assert str(info.value) == "action_name must be a str, not int"


def test_a_partial_ledger_is_refused_naming_every_missing_method() -> None:
    class Partial:
        async def claim(self, receipt: Any) -> Any: ...
        async def find(self, action_name: str, key: str) -> Any: ...
        async def start_attempt(self, receipt: Any) -> Any: ...
        async def release(self, action_id: str, version: int) -> Any: ...

    with pytest.raises(InvalidArgumentError) as info:
        ActionRunner(Partial())  # type: ignore[arg-type]
    assert str(info.value).endswith("(missing get, record)")


async def test_float_subclass_rejected() -> None:
    class Fl(float):
        pass

    r = ActionRunner(InMemoryLedger())
    with pytest.raises(InvalidRequestError):
        await r.execute("a", lambda: 1, request={"a": Fl(1.5)}, idempotency_key="k")


def test_depth_boundary() -> None:
    from dataoad._canonical import MAX_DEPTH, validate_request

    def nest(n: int) -> dict[str, Any]:
        d: dict[str, Any] = {}
        for _ in range(n):
            d = {"a": d}
        return d

    validate_request(nest(MAX_DEPTH - 1))
    with pytest.raises(InvalidRequestError):
        validate_request(nest(MAX_DEPTH))


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (
            lambda: RetryPolicy(max_attempts="2"),  # type: ignore[arg-type]
            "max_attempts must be an int, not str",
        ),
        (lambda: RetryPolicy(max_attempts=0), "max_attempts must be >= 1, got 0"),
        (
            lambda: RetryPolicy(retry_on_failed=1),  # type: ignore[arg-type]
            "retry_on_failed must be a bool, not int",
        ),
        (
            lambda: RetryPolicy().should_retry("FAILED", 1, True),  # type: ignore[arg-type]
            "status must be an ActionStatus, not str",
        ),
        (
            lambda: RetryPolicy().should_retry(F, 1.0, True),  # type: ignore[arg-type]
            "attempts must be an int, not float",
        ),
        (lambda: RetryPolicy().should_retry(F, 0, True), "attempts must be >= 1, got 0"),
        (
            lambda: RetryPolicy().should_retry(F, 1, 1),  # type: ignore[arg-type]
            "failure_is_retryable must be a bool, not int",
        ),
    ],
)
def test_each_refusal_names_what_was_wrong(make: Any, message: str) -> None:
    with pytest.raises(InvalidArgumentError) as info:
        make()
    assert str(info.value) == message
