"""Every documented bound of an argument, on both sides: the limit itself is accepted, one
step past it is refused, before anything is written.

A bound checked only far from its limit lets a ``<`` that should be ``<=``, a constant one
off, or a limit counted in the wrong unit (characters for bytes) pass; an outside review
found such changes passed the suite. The step is the bound's own unit: one character, one
UTF-8 byte, one byte of a size, the smallest float above a time.
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Coroutine
from typing import Any

import pytest

from dataoad import (
    ActionRunner,
    ActionStatus,
    InMemoryLedger,
    InvalidArgumentError,
    InvalidRequestError,
    SQLiteLedger,
)
from dataoad._bounds import DEFAULT_VERIFIER_TIMEOUT, MAX_BYTES, MAX_VERIFIER_TIMEOUT
from dataoad._identity import MAX_KEY_BYTES
from dataoad._receipt import MAX_ERROR_LENGTH, bound_text

WIDE = "\U0001f600"  # four UTF-8 bytes, one character


async def _runs(runner: ActionRunner, **call: Any) -> ActionStatus:
    arguments: dict[str, Any] = {"request": {}, "idempotency_key": "k", **call}
    action = arguments.pop("action_name", "charge")
    return (await runner.execute(action, lambda: "ok", **arguments)).status


async def _refused(runner: ActionRunner, error: type[Exception], **call: Any) -> None:
    with pytest.raises(error):
        await _runs(runner, **call)
    assert runner.ledger.snapshot() == []  # type: ignore[attr-defined]


def test_the_documented_limits_are_these() -> None:
    """API.md and the docstrings name these numbers; the checks below stand on them."""
    assert MAX_ERROR_LENGTH == 1000
    assert MAX_BYTES == 64 << 20
    assert MAX_VERIFIER_TIMEOUT == 3600
    assert MAX_KEY_BYTES == 4 * (128 + 512)
    defaults = inspect.signature(ActionRunner).parameters
    assert defaults["verifier_timeout"].default == DEFAULT_VERIFIER_TIMEOUT == 30.0
    assert defaults["max_request_bytes"].default == 1 << 20
    assert defaults["max_metadata_bytes"].default == 64 << 10
    assert inspect.signature(SQLiteLedger).parameters["busy_timeout"].default == 5.0


def test_an_error_of_exactly_the_bound_is_kept_whole_and_one_more_is_cut() -> None:
    exact = "e" * MAX_ERROR_LENGTH
    assert bound_text(exact) == exact
    cut = bound_text(exact + "f")
    assert len(cut) == MAX_ERROR_LENGTH
    assert cut == "e" * (MAX_ERROR_LENGTH - 1) + "\u2026"


async def test_a_recorded_error_is_cut_at_exactly_the_bound() -> None:
    runner = ActionRunner(InMemoryLedger())

    async def fails_with(message: str) -> None:
        raise RuntimeError(message)

    prefix = "RuntimeError: "
    for extra, kept_whole in ((0, True), (1, False)):
        message = "m" * (MAX_ERROR_LENGTH - len(prefix) + extra)

        def operation(m: str = message) -> Coroutine[Any, Any, None]:
            return fails_with(m)

        result = await runner.execute("charge", operation, request={}, idempotency_key=f"k{extra}")
        error = result.receipt.attempt_records[0].error
        assert error is not None
        assert len(error) == MAX_ERROR_LENGTH
        assert (error == prefix + message) is kept_whole


@pytest.mark.parametrize(
    ("option", "limit", "past"),
    [
        ("max_request_bytes", MAX_BYTES, MAX_BYTES + 1),
        ("max_metadata_bytes", MAX_BYTES, MAX_BYTES + 1),
        ("max_request_bytes", 1, 0),
        ("verifier_timeout", MAX_VERIFIER_TIMEOUT, math.nextafter(MAX_VERIFIER_TIMEOUT, math.inf)),
        ("verifier_timeout", math.ulp(0.0), 0.0),
    ],
)
def test_a_runner_bound_at_its_limit_is_accepted_and_one_step_past_refused(
    option: str, limit: float, past: float
) -> None:
    at_limit: dict[str, Any] = {option: limit}
    one_past: dict[str, Any] = {option: past}
    ActionRunner(InMemoryLedger(), **at_limit)
    with pytest.raises(InvalidArgumentError, match=option):
        ActionRunner(InMemoryLedger(), **one_past)


@pytest.mark.parametrize(
    ("limit", "past"),
    [(0, -math.ulp(0.0)), (3600, math.nextafter(3600.0, math.inf))],
)
def test_a_busy_timeout_at_its_limit_is_accepted_and_one_step_past_refused(
    tmp_path: Any, limit: float, past: float
) -> None:
    SQLiteLedger(tmp_path / "ledger.sqlite3", busy_timeout=limit)
    with pytest.raises(InvalidArgumentError, match="busy_timeout"):
        SQLiteLedger(tmp_path / "ledger.sqlite3", busy_timeout=past)


async def test_metadata_is_bounded_in_utf8_bytes_not_characters() -> None:
    # {"n":"..."} is 8 bytes of JSON around the text; each WIDE is four bytes.
    limit = 8 + 4 * 25
    runner = ActionRunner(InMemoryLedger(), max_metadata_bytes=limit)
    assert await _runs(runner, metadata={"n": WIDE * 25}) is ActionStatus.CONFIRMED
    tight = ActionRunner(InMemoryLedger(), max_metadata_bytes=limit - 1)
    await _refused(tight, InvalidRequestError, metadata={"n": WIDE * 25})
    with pytest.raises(InvalidRequestError) as info:
        await _runs(tight, metadata={"n": WIDE * 25})
    assert info.value.path == "metadata"
    assert str(info.value) == (
        f"metadata is {limit} bytes as JSON, over this runner's max_metadata_bytes={limit - 1}: "
        "it is stored and rewritten with every transition of the receipt"
    )


async def test_a_request_is_bounded_in_utf8_bytes_not_characters() -> None:
    # {"n":"..."} canonical: 8 bytes around the text.
    runner = ActionRunner(InMemoryLedger(), max_request_bytes=8 + 4 * 25)
    assert await _runs(runner, request={"n": WIDE * 25}) is ActionStatus.CONFIRMED
    tight = ActionRunner(InMemoryLedger(), max_request_bytes=8 + 4 * 25 - 1)
    await _refused(tight, InvalidRequestError, request={"n": WIDE * 25})


async def test_a_key_of_exactly_the_byte_bound_is_accepted_and_one_byte_more_refused() -> None:
    key = WIDE * 512  # the longest idempotency key: 2,048 bytes
    namespace = WIDE * 127  # 508 bytes
    room = MAX_KEY_BYTES - 4 * 512 - 4 * 127  # what is left for the action name
    assert room == 4
    runner = ActionRunner(InMemoryLedger(), namespace=namespace)
    assert await _runs(runner, action_name="a" * room, idempotency_key=key) is (
        ActionStatus.CONFIRMED
    )
    await _refused(
        ActionRunner(InMemoryLedger(), namespace=namespace),
        InvalidArgumentError,
        action_name="a" * (room + 1),
        idempotency_key=key,
    )


@pytest.mark.parametrize(
    ("argument", "limit"),
    [("action_name", 128), ("idempotency_key", 512), ("provider_reference", 1000), ("risk", 128)],
)
async def test_an_identity_string_at_its_limit_is_accepted_and_one_more_refused(
    argument: str, limit: int
) -> None:
    assert await _runs(ActionRunner(InMemoryLedger()), **{argument: "x" * limit}) is (
        ActionStatus.CONFIRMED
    )
    await _refused(
        ActionRunner(InMemoryLedger()), InvalidArgumentError, **{argument: "x" * (limit + 1)}
    )


def test_an_owner_of_200_characters_is_accepted_and_201_refused() -> None:
    assert ActionRunner(InMemoryLedger(), owner="o" * 200).owner == "o" * 200
    with pytest.raises(InvalidArgumentError, match="owner"):
        ActionRunner(InMemoryLedger(), owner="o" * 201)


TEN_YEARS = 10 * 365 * 86_400.0
HUNDRED_YEARS = 100 * 365 * 86_400.0


async def test_expires_after_at_its_limits_is_accepted_and_one_step_past_refused() -> None:
    for limit in (0.0, TEN_YEARS):
        assert await _runs(ActionRunner(InMemoryLedger()), expires_after=limit) is (
            ActionStatus.CONFIRMED
        )
    for past in (-math.ulp(0.0), math.nextafter(TEN_YEARS, math.inf)):
        await _refused(ActionRunner(InMemoryLedger()), InvalidArgumentError, expires_after=past)


async def test_prune_bounds_at_their_limits_are_accepted_and_one_step_past_refused() -> None:
    ledger = InMemoryLedger()
    assert await ledger.prune(older_than=HUNDRED_YEARS, batch_size=10_000) == 0
    assert await ledger.prune(older_than=0.0, batch_size=1) == 0
    past: tuple[dict[str, Any], ...] = (
        {"older_than": math.nextafter(HUNDRED_YEARS, math.inf)},
        {"older_than": -math.ulp(0.0)},
        {"older_than": 1.0, "batch_size": 10_001},
        {"older_than": 1.0, "batch_size": 0},
    )
    for bad in past:
        with pytest.raises(InvalidArgumentError):
            await ledger.prune(**bad)


def test_postgres_options_at_their_limits_are_accepted_and_one_step_past_refused() -> None:
    from dataoad import PostgresLedger  # the postgres extra (dev has it)

    dsn = "postgresql://localhost/dataoad"
    PostgresLedger(dsn, command_timeout=3600, table="t" * 48)
    with pytest.raises(InvalidArgumentError, match="command_timeout"):
        PostgresLedger(dsn, command_timeout=math.nextafter(3600.0, math.inf))
    with pytest.raises(InvalidArgumentError, match="48 characters"):
        PostgresLedger(dsn, table="t" * 49)
