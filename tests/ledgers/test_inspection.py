"""The read-only listing (the Inspection protocol) is the same on every backend."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import pytest

from dataoad import ActionRunner, ActionStatus, DefinitiveFailure
from dataoad._ledger import InspectableLedger
from dataoad.testing import FaultyLedger, LedgerFault, make_receipt
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


async def test_receipts_written_in_any_zone_list_in_the_order_of_their_times(
    new_ledger: Any,
) -> None:
    # A receipt written through the Ledger protocol (not the runner) at +05:00:
    # 10:00 UTC, before b's 12:00 UTC although its clock reads 15:00.
    ledger: InspectableLedger = new_ledger()
    east = timezone(timedelta(hours=5))
    early = datetime(2026, 1, 1, 15, 0, tzinfo=east)
    later = datetime(2026, 1, 1, 12, 0, tzinfo=UTC)
    try:
        for key, at in (("a", early), ("b", later)):
            await ledger.claim(make_receipt(idempotency_key=key, created_at=at, updated_at=at))
        assert [r.idempotency_key for r in await ledger.receipts()] == ["a", "b"]
        assert [r.idempotency_key for r in await ledger.receipts(newest_first=True)] == ["b", "a"]
        between = datetime(2026, 1, 1, 11, 0, tzinfo=UTC)
        assert [r.idempotency_key for r in await ledger.receipts(since=between)] == ["b"]
        assert [r.idempotency_key for r in await ledger.receipts(since=early)] == ["a", "b"]
        (stored,) = await ledger.receipts(idempotency_key="a")
        assert stored.created_at == early  # the same instant, whatever zone it reads in
    finally:
        await closing(ledger)
