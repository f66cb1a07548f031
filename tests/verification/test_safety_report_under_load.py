"""The main job's verdict does not depend on the machine's speed (issue: UNSAFE under load).

On a loaded machine the event loop's thread loses the CPU at any moment.
The concurrent-duplicate check once trusted a 10 ms head start; when the
SQLite ledger's first open took longer, late contenders replayed the
finished receipt and were counted as second winners. Here the loop thread
is stalled on purpose right after the first claim is queued to the SQLite
connection thread (what a loaded 2-core machine does at random), at several
lengths: the verdict must stay PASS, and the runner must still charge once.
``scripts/verdict_under_load.py`` runs the whole command hundreds of times
beside busy processes.
"""

from __future__ import annotations

import importlib.util
import time
from pathlib import Path
from typing import Any

import pytest

import dataoad.ledgers._sqlite_live as sqlite_live
from dataoad import SQLiteLedger

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "payment_timeout_after_commit.py"


def _example() -> Any:
    spec = importlib.util.spec_from_file_location("payment_example_under_load", EXAMPLE)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("stall", [0.0, 0.0005, 0.002, 0.02])
async def test_concurrent_duplicate_check_passes_whatever_the_loop_stalls(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, stall: float
) -> None:
    example = _example()
    armed = {"claim": True}

    real_queue_on_thread = sqlite_live.queue_on_thread

    def stalling_queue_on_thread(conn: Any, fn: Any) -> Any:
        # The hand-off of a group's flush to aiosqlite's thread (a claim's look-up
        # and insert run in it): queue the job...
        queued = real_queue_on_thread(conn, fn)
        if armed["claim"]:  # the first write of a fresh ledger is the first claim
            armed["claim"] = False
            time.sleep(stall)  # ...but the loop's thread loses the CPU right after queueing
        return queued

    monkeypatch.setattr(sqlite_live, "queue_on_thread", stalling_queue_on_thread)

    for run in range(3):
        armed["claim"] = True
        # Opened lazily by the check's first call, as the report's ledgers are.
        ledger = SQLiteLedger(tmp_path / f"ledger-{run}.sqlite3")
        try:
            check = await example.concurrent_duplicate_safety(ledger)
        finally:
            await ledger.close()
        assert not armed["claim"], "the claim never went through the stalled hand-off"
        assert check.passed, check
