"""Multi-host simulation: OS processes, each with its own pool, contend through one server."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

from dataoad import ActionStatus, ClaimState
from suite_support.ledger_child import contend_in_processes
from suite_support.services import PostgresTestTable


def test_eight_processes_contending_for_the_same_keys(tmp_path: Path) -> None:
    table = PostgresTestTable()
    keys, processes = 400, 8
    effects = tmp_path / "effects.log"
    asyncio.run(table.create())
    spec = f"{table.dsn}#{table.table}"
    started = time.monotonic()
    summaries = contend_in_processes(spec, effects, keys, processes)
    elapsed = time.monotonic() - started
    calls = keys * processes
    print(
        f"\n{processes} processes, {keys} shared keys: {calls} execute calls in {elapsed:.2f} s "
        f"({calls / elapsed:.0f} calls/s, {keys / elapsed:.0f} actions/s including start-up)"
    )
    # Exactly one effect per key: one winner each, nothing invoked twice.
    lines = effects.read_text().split()
    assert sorted(lines) == sorted(f"k{n}" for n in range(keys))
    assert sum(s["won"] for s in summaries) == keys
    for summary in summaries:
        assert summary["won"] + summary["replayed"] + summary["in_progress"] == keys

    async def check() -> None:
        ledger = table.client()
        try:
            receipts = await ledger.receipts()
        finally:
            await ledger.close()
            await table.drop()
        # No receipt lost: every key settled CONFIRMED with exactly one attempt.
        assert sorted(r.idempotency_key for r in receipts) == sorted(f"k{n}" for n in range(keys))
        for receipt in receipts:
            assert receipt.claim_state is ClaimState.COMPLETED
            assert receipt.final_status is ActionStatus.CONFIRMED
            assert receipt.attempts == 1

    asyncio.run(check())
