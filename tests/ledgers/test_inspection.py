"""The read-only listing (the Inspection protocol) is the same on every backend."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest

from dataoad import ActionRunner, ActionStatus, DefinitiveFailure
from dataoad._ledger import InspectableLedger
from dataoad.testing import FaultyLedger, LedgerFault
from suite_support import REQUEST, CountingOperation, closing

pytestmark = pytest.mark.asyncio


async def test_every_backend_lists_and_filters_alike(new_ledger: Any) -> None:
    ledger: InspectableLedger = new_ledger()
    runner = ActionRunner(ledger)
    try:
        ok = await runner.execute(
            "charge", CountingOperation(), request=REQUEST, idempotency_key="a"
        )
        failed = await runner.execute(
            "charge",
            CountingOperation(DefinitiveFailure("declined")),
            request=REQUEST,
            idempotency_key="b",
        )
        unknown = await runner.execute(
            "refund", CountingOperation(TimeoutError("lost")), request=REQUEST, idempotency_key="c"
        )
        stuck = FaultyLedger(ledger)
        stuck.inject("record", LedgerFault.FAIL_BEFORE_WRITE)
        stuck.inject("get", LedgerFault.FAIL_BEFORE_WRITE)
        with pytest.raises(Exception, match="could not be recorded"):
            await ActionRunner(stuck).execute(
                "charge", CountingOperation(), request=REQUEST, idempotency_key="d"
            )
        ids = {"a": ok.receipt.action_id, "b": failed.receipt.action_id}
        ids["c"] = unknown.receipt.action_id

        def keys(receipts: list[Any]) -> list[str]:
            return [r.idempotency_key for r in receipts]

        everything = await ledger.receipts()
        assert keys(everything) == ["a", "b", "c", "d"]  # oldest first
        assert keys(await ledger.receipts(final_status=ActionStatus.FAILED)) == ["b"]
        assert keys(await ledger.receipts(pending=True)) == ["d"]
        assert keys(await ledger.receipts(pending=False)) == ["a", "b", "c"]
        assert keys(await ledger.receipts(action_name="refund")) == ["c"]
        assert keys(await ledger.receipts(limit=2)) == ["a", "b"]
        third = everything[2].created_at
        assert keys(await ledger.receipts(since=third)) == ["c", "d"]
        # Inclusive, to the microsecond: the newest is listed from its own instant, not after.
        newest = everything[-1].created_at
        assert keys(await ledger.receipts(since=newest))[-1:] == ["d"]
        assert await ledger.receipts(since=newest + timedelta(microseconds=1)) == []
        assert await ledger.get(ids["b"]) == everything[1]
        assert keys(await ledger.receipts(idempotency_key="c")) == ["c"]
        assert keys(await ledger.receipts(idempotency_key="c", action_name="charge")) == []
        for key, action_id in ids.items():
            for length in (1, 6, 32):
                found = await ledger.receipts(action_id_prefix=action_id[:length])
                assert key in keys(found)
                assert all(r.action_id.startswith(action_id[:length]) for r in found)
        assert await ledger.receipts(action_id_prefix="%") == []  # no wildcard widens it
        assert await ledger.receipts(action_id_prefix="_") == []
    finally:
        await closing(ledger)
