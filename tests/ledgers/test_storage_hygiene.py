"""What is stored: hashes not requests, bounded errors, never provider values."""

from __future__ import annotations

import dataclasses
import json

from dataoad import ActionRunner, ActionStatus, InMemoryLedger
from dataoad._receipt import MAX_ERROR_LENGTH
from suite_support import REF, CountingOperation, confirmed, fixed_verifier


def stored_text(receipt: object) -> str:
    return json.dumps(dataclasses.asdict(receipt), default=str)  # type: ignore[call-overload]


async def test_raw_request_and_provider_values_are_never_stored() -> None:
    secret_request = {"card_number": "4111-SECRET-REQUEST"}
    secret_value = {"token": "SECRET-PROVIDER-VALUE"}

    ledger = InMemoryLedger()
    runner = ActionRunner(ledger)
    await runner.execute("a", lambda: secret_value, request=secret_request, idempotency_key="k1")
    await runner.execute(
        "a",
        CountingOperation(TimeoutError()),
        request=secret_request,
        idempotency_key="k2",
        provider_reference=REF,
        verifier=fixed_verifier(confirmed(value=secret_value)),
    )
    for receipt in ledger.snapshot():
        text = stored_text(receipt)
        assert "SECRET-REQUEST" not in text
        assert "SECRET-PROVIDER-VALUE" not in text


async def test_stored_error_strings_are_bounded() -> None:
    class Unprintable(Exception):
        def __str__(self) -> str:
            raise RuntimeError("cannot print")

    runner = ActionRunner(InMemoryLedger())
    huge = await runner.execute(
        "a", CountingOperation(TimeoutError("x" * 50_000)), request={}, idempotency_key="k1"
    )
    assert huge.receipt.error is not None
    assert len(huge.receipt.error) <= MAX_ERROR_LENGTH
    assert huge.receipt.error.startswith("TimeoutError: xxx")
    assert len(huge.receipt.attempt_records[0].error or "") <= MAX_ERROR_LENGTH
    odd = await runner.execute(
        "a", CountingOperation(Unprintable()), request={}, idempotency_key="k2"
    )
    assert odd.status is ActionStatus.UNKNOWN
    assert odd.receipt.error is not None
    assert odd.receipt.error.startswith("Unprintable")


async def test_verifier_error_and_reason_strings_are_bounded() -> None:
    runner = ActionRunner(InMemoryLedger())
    result = await runner.execute(
        "a",
        CountingOperation(TimeoutError()),
        request={},
        idempotency_key="k",
        provider_reference=REF,
        verifier=fixed_verifier(RuntimeError("y" * 50_000)),
    )
    observation = result.receipt.metadata["verification"]
    assert len(observation["error"]) <= MAX_ERROR_LENGTH


async def test_version_increases_by_one_per_durable_transition() -> None:
    runner = ActionRunner(InMemoryLedger())
    result = await runner.execute(
        "a",
        CountingOperation(TimeoutError()),
        request={},
        idempotency_key="k",
        provider_reference=REF,
    )
    # claim counting attempt 1 (1), completion (2)
    assert result.receipt.version == 2
    settled = await runner.reconcile(result.receipt.action_id, fixed_verifier(confirmed()))
    assert settled.receipt.version == 3


async def test_receipts_are_immutable_snapshots() -> None:
    runner = ActionRunner(InMemoryLedger())
    result = await runner.execute("a", lambda: 1, request={}, idempotency_key="k")
    try:
        result.receipt.attempts = 9  # type: ignore[misc]
    except dataclasses.FrozenInstanceError:
        pass
    else:
        raise AssertionError("receipt was mutable")
    assert (await runner.receipt(result.receipt.action_id)).attempts == 1
