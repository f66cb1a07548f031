"""The dataoad logger: one structured record per transition, and no secrets in it."""

from __future__ import annotations

import asyncio
import logging

import pytest

from dataoad import ActionRunner, InMemoryLedger
from tests.support import REF, CountingOperation, confirmed, fixed_verifier


def test_one_record_per_transition_without_request_or_values(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="dataoad")

    async def scenario() -> None:
        runner = ActionRunner(InMemoryLedger())
        op = CountingOperation(TimeoutError("lost"), "SECRET-VALUE")
        request = {"card": "SECRET-REQUEST"}
        first = await runner.execute(
            "charge", op, request=request, idempotency_key="k", provider_reference=REF
        )
        await runner.execute(
            "charge", op, request=request, idempotency_key="k", provider_reference=REF
        )
        await runner.reconcile(
            first.receipt.action_id, fixed_verifier(confirmed(value="SECRET-VALUE"))
        )

    asyncio.run(scenario())
    events = [r.dataoad["event"] for r in caplog.records if hasattr(r, "dataoad")]  # type: ignore[attr-defined]
    assert events == ["claimed", "attempt_started", "completed", "replayed", "reconciled"]
    completed = next(r for r in caplog.records if r.dataoad["event"] == "completed")  # type: ignore[attr-defined]
    assert completed.dataoad["final_status"] == "UNKNOWN"  # type: ignore[attr-defined]
    assert completed.dataoad["attempt"] == 1  # type: ignore[attr-defined]
    assert completed.dataoad["action_name"] == "charge"  # type: ignore[attr-defined]
    text = "\n".join(r.getMessage() + repr(getattr(r, "dataoad", "")) for r in caplog.records)
    assert "SECRET" not in text
