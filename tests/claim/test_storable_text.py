"""Identity strings every ledger can store and index, and error strings made storable.

Refused before any ledger access: over-long action names and keys, NUL
characters and lone surrogates (PostgreSQL text cannot hold NUL, and no
encoder writes a lone surrogate). Error strings from operations are not
refused but made storable, so an outcome is never lost to its own message.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from dataoad import (
    ActionRunner,
    ActionStatus,
    InMemoryLedger,
    InvalidArgumentError,
    SQLiteLedger,
    VerificationResult,
)
from dataoad._receipt import bounded_error
from dataoad.testing import FaultyLedger
from suite_support import REQUEST, CountingOperation
from suite_support.services import PostgresTestTable


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("action_name", "a" * 129, "longer than 128"),
        ("idempotency_key", "k" * 513, "longer than 512"),
        ("idempotency_key", "order\x00-1", "NUL"),
        ("idempotency_key", "order-\ud800", "lone surrogate"),
        ("provider_reference", "ref\x00", "NUL"),
        ("risk", "r" * 129, "longer than 128"),
    ],
)
def test_unstorable_identity_strings_are_refused_before_the_ledger(
    field: str, value: str, message: str
) -> None:
    inner = InMemoryLedger()
    ledger = FaultyLedger(inner)  # logs every call the runner makes, by name
    op = CountingOperation()
    kwargs: dict[str, Any] = {"request": REQUEST, "idempotency_key": "k", field: value}
    name = kwargs.pop("action_name", "charge")
    with pytest.raises(InvalidArgumentError, match=message):
        asyncio.run(ActionRunner(ledger).execute(name, op, **kwargs))
    assert ledger.calls == []
    assert inner.snapshot() == []
    assert op.calls == 0


def test_longest_accepted_identity_strings_are_stored() -> None:
    ledger = InMemoryLedger()
    result = asyncio.run(
        ActionRunner(ledger).execute(
            "a" * 128, CountingOperation("ok"), request=REQUEST, idempotency_key="k" * 512
        )
    )
    assert result.status is ActionStatus.CONFIRMED


@pytest.mark.parametrize("reference", ["ref\x00", "ref-\udc00"])
def test_verifier_identifiers_must_be_storable(reference: str) -> None:
    with pytest.raises(InvalidArgumentError):
        VerificationResult.confirmed(verified_provider_reference=reference)


def test_bounded_error_makes_any_message_storable() -> None:
    text = bounded_error(RuntimeError("bad\x00byte and \ud800 half a pair"))
    assert "\x00" not in text
    text.encode("utf-8")  # no lone surrogate left
    assert text.startswith("RuntimeError: bad\\x00byte")


async def _nul_error() -> None:
    raise TimeoutError("gateway said \x00 and \udcff")


async def test_an_operation_error_with_nul_is_recorded_on_sqlite(tmp_path: Path) -> None:
    async with SQLiteLedger(tmp_path / "l.sqlite3") as ledger:
        result = await ActionRunner(ledger).execute(
            "charge", _nul_error, request=REQUEST, idempotency_key="k"
        )
        assert result.status is ActionStatus.UNKNOWN
        stored = await ledger.get(result.receipt.action_id)
        assert stored == result.receipt
        assert stored.error is not None
        assert "\x00" not in stored.error


async def test_an_operation_error_with_nul_is_recorded_on_postgres() -> None:
    table = PostgresTestTable()

    await table.create()
    ledger = table.client()
    try:
        result = await ActionRunner(ledger).execute(
            "charge", _nul_error, request=REQUEST, idempotency_key="k"
        )
        assert result.status is ActionStatus.UNKNOWN
        assert await ledger.get(result.receipt.action_id) == result.receipt
    finally:
        await ledger.close()
        await table.drop()
