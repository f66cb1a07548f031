"""A worker SIGKILLed at each protocol point is settled by another process, unattended.

The child runs one action with a short lease and kills itself at the named
point. After one lease, a sweep in a second process (``recover_stale`` with
a verifier reading the effects log) must leave no PENDING claim, invoke
nothing, and state what the effects show; on SQLite and on PostgreSQL.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from dataoad import ActionStatus, PostgresLedger
from suite_support import unstarted
from suite_support.ledger_child import CRASH_POINTS, open_ledger
from suite_support.services import postgres_dsn, unique_table

ROOT = Path(__file__).resolve().parents[2]
LEASE = 0.5
#: A sweep process starts, opens the ledger and settles one claim well within this.
SWEEP_BOUND = 20.0

CASES = [("sqlite", p) for p in CRASH_POINTS] + [
    # Killing a worker inside the completion statement needs SQLite's progress hook.
    ("postgres", p)
    for p in CRASH_POINTS
    if p != "during_completion"
]


def child(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "suite_support.ledger_child", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        env={**os.environ, "DATAOAD_CHILD_LEASE": str(LEASE)},
    )


def ledger_spec(tmp_path: Path, backend: str) -> str:
    """A fresh ledger of ``backend`` for the children: a SQLite file, or a migrated table."""
    if backend == "sqlite":
        return str(tmp_path / "ledger.sqlite3")
    spec = f"{postgres_dsn()}#{unique_table()}"

    async def create() -> None:
        async with PostgresLedger(spec.rsplit("#", 1)[0], table=spec.rsplit("#", 1)[1]) as pg:
            await pg.migrate()

    asyncio.run(create())
    return spec


@pytest.mark.parametrize(("backend", "point"), CASES, ids=[f"{b}-{p}" for b, p in CASES])
def test_a_killed_worker_is_settled_by_another_process(
    tmp_path: Path, backend: str, point: str
) -> None:
    effects = tmp_path / "effects.log"
    spec = ledger_spec(tmp_path, backend)
    killed = child("crash", spec, str(effects), point)
    assert killed.returncode == -9, f"child was not killed: {killed.returncode} {killed.stderr}"
    effects_before = effects.read_text().split() if effects.exists() else []
    started = time.monotonic()
    time.sleep(LEASE)
    swept = child("sweep", spec, str(effects))
    elapsed = time.monotonic() - started
    assert swept.returncode == 0, swept.stderr
    summary = json.loads(swept.stdout)
    assert summary["pending"] == 0, "a stranded claim outlived one lease and one sweep"
    assert elapsed <= LEASE + SWEEP_BOUND

    async def stored() -> object:
        async with open_ledger(spec) as ledger:
            return await ledger.find("charge", "order-1")

    receipt = asyncio.run(stored())
    assert (effects.read_text().split() if effects.exists() else []) == effects_before
    if point == "after_claim":
        # The claim counts attempt 1 (one write with its start): settled read-only, never released.
        assert effects_before == []
    assert receipt is not None
    expected = ActionStatus.CONFIRMED if effects_before else ActionStatus.FAILED
    assert receipt.final_status is expected  # type: ignore[attr-defined]
    if point != "during_completion":
        assert summary["settled"] == [["order-1", expected.value]]
        assert receipt.fencing_token == 2  # type: ignore[attr-defined]
        assert receipt.owner == "sweeper"  # type: ignore[attr-defined]


@pytest.mark.parametrize("backend", ["sqlite", "postgres"])
def test_an_unstarted_claim_of_a_dead_v0_1_worker_is_released_by_another_process(
    tmp_path: Path, backend: str
) -> None:
    """Only a v0.1 runner left a claim with no attempt counted; a sweep frees its key."""
    effects = tmp_path / "effects.log"
    spec = ledger_spec(tmp_path, backend)

    async def leave_unstarted() -> None:
        async with open_ledger(spec) as ledger:
            await unstarted(
                ledger,
                "order-1",
                request={"amount": 1},
                provider_reference="order-1",
                owner="worker",
                lease=LEASE,
            )

    asyncio.run(leave_unstarted())
    started = time.monotonic()
    time.sleep(LEASE)
    swept = child("sweep", spec, str(effects))
    elapsed = time.monotonic() - started
    assert swept.returncode == 0, swept.stderr
    assert json.loads(swept.stdout) == {"settled": [], "pending": 0}
    assert elapsed <= LEASE + SWEEP_BOUND

    async def stored() -> object:
        async with open_ledger(spec) as ledger:
            return await ledger.find("charge", "order-1")

    assert asyncio.run(stored()) is None  # never started: released, the key is free
    assert not effects.exists()  # nothing was invoked
