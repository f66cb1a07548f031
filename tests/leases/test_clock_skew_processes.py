"""V2 with real processes: a writer an hour slow, a caller an hour fast, one charge.

Two processes share a ledger (a SQLite file, or a PostgreSQL table). The
first runs with every clock of its own an hour behind and charges; the
second, a second later, with every clock of its own an hour ahead, asks
for ``expires_after=600``. Comparing the two hosts' clocks, the receipt
would look two hours old and the charge would run again; judged by the
ledger's own clock it is a second old, so it replays. A third process with
its clock a month ahead prunes "older than 30 days": nothing goes.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from suite_support.services import PostgresTestTable

_CHILD = """
import asyncio, json, sys
from datetime import timedelta
skew = timedelta(seconds=float(sys.argv[2]))
import dataoad._clock as clock_module
real = clock_module.utc_now
def skewed():
    return real() + skew
# Every clock this process reads for a time of day is off by the skew.
import dataoad._receipt, dataoad._ledger_rules, dataoad._attempts, dataoad._completing
import dataoad._retiring, dataoad._leases, dataoad._recovery, dataoad._settled
for module in (clock_module, dataoad._receipt, dataoad._ledger_rules, dataoad._attempts,
               dataoad._completing, dataoad._retiring, dataoad._leases, dataoad._recovery,
               dataoad._settled):
    module.utc_now = skewed
clock_module.SystemClock.wall_time = lambda self: skewed()
# And Python's own time of day, as freezegun or time-machine would move it.
import time
real_time, real_time_ns, real_clock, real_clock_ns = (
    time.time, time.time_ns, time.clock_gettime, time.clock_gettime_ns)
time.time = lambda: real_time() + skew.total_seconds()
time.time_ns = lambda: real_time_ns() + int(skew.total_seconds() * 1e9)
time.clock_gettime = lambda clock: real_clock(clock) + (
    skew.total_seconds() if clock == time.CLOCK_REALTIME else 0.0)
time.clock_gettime_ns = lambda clock: real_clock_ns(clock) + (
    int(skew.total_seconds() * 1e9) if clock == time.CLOCK_REALTIME else 0)
from dataoad import ActionRunner, PostgresLedger, SQLiteLedger

spec = json.loads(sys.argv[1])
charges = sys.argv[3]

def charge():
    with open(charges, "a") as out:
        out.write("charge\\n")
    return "ch"

async def main():
    if spec["kind"] == "sqlite":
        ledger = SQLiteLedger(spec["path"])
    else:
        ledger = PostgresLedger(spec["dsn"], table=spec["table"])
    async with ledger:
        if sys.argv[4] == "prune":
            print(json.dumps({"pruned": await ledger.prune(older_than=30 * 86400)}))
            return
        result = await ActionRunner(ledger).execute(
            "charge", charge, request={"amount": 100}, idempotency_key="order-1",
            expires_after=None if sys.argv[4] == "first" else 600,
        )
        print(json.dumps({"replayed": result.replayed, "status": result.status.value}))

asyncio.run(main())
"""


@pytest.fixture(params=["sqlite", "postgres"])
def shared(request: pytest.FixtureRequest, tmp_path: Path) -> Any:
    if request.param == "sqlite":
        yield {"kind": "sqlite", "path": str(tmp_path / "ledger.sqlite3")}
        return
    table = PostgresTestTable()
    asyncio.run(table.create())
    yield {"kind": "postgres", "dsn": table.dsn, "table": table.table}
    asyncio.run(table.drop())


def _run(tmp_path: Path, spec: Any, skew_seconds: float, what: str) -> Any:
    program = tmp_path / "child.py"
    program.write_text(textwrap.dedent(_CHILD))
    done = subprocess.run(
        [
            sys.executable,
            str(program),
            json.dumps(spec),
            str(skew_seconds),
            str(tmp_path / "charges.txt"),
            what,
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_skewed_hosts_never_expire_a_fresh_receipt_nor_prune_it(
    tmp_path: Path, shared: Any
) -> None:
    hour = 3600.0
    first = _run(tmp_path, shared, -hour, "first")
    assert first == {"replayed": False, "status": "CONFIRMED"}
    again = _run(tmp_path, shared, +hour, "again")
    assert again == {"replayed": True, "status": "CONFIRMED"}
    assert (tmp_path / "charges.txt").read_text().splitlines() == ["charge"]
    pruned = _run(tmp_path, shared, 31 * 86_400.0, "prune")
    assert pruned == {"pruned": 0}
    replay = _run(tmp_path, shared, 0.0, "again")
    assert replay == {"replayed": True, "status": "CONFIRMED"}
    assert (tmp_path / "charges.txt").read_text().splitlines() == ["charge"]
