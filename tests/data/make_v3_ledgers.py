"""Write the schema-3 ledger the namespace migration tests open (run with that code).

Run once, from a checkout of the last commit before namespaces (``git
worktree add /tmp/v3 3c32558``), so the file is exactly what it wrote::

    PYTHONPATH=/tmp/v3 python tests/data/make_v3_ledgers.py tests/data

It writes ``ledger-schema3.sqlite3``: CONFIRMED, FAILED and UNKNOWN
receipts, a leased claim stranded after its attempt started, one that never
started, and a claim taken over by a second worker (fencing token 2).
"""

from __future__ import annotations

import asyncio
import contextlib
import sys
from datetime import UTC, datetime
from pathlib import Path

import dataoad
from dataoad import ActionRunner, DefinitiveFailure, SQLiteLedger
from dataoad.testing import ManualClock


async def main(folder: Path) -> None:
    path = folder / "ledger-schema3.sqlite3"
    path.unlink(missing_ok=True)
    clock = ManualClock(datetime(2026, 11, 30, 12, 0, tzinfo=UTC))
    async with SQLiteLedger(path, clock=clock) as ledger:
        runner = ActionRunner(ledger, owner="worker-a", lease=30.0)

        async def decline() -> None:
            raise DefinitiveFailure("card declined")

        async def timeout() -> None:
            raise TimeoutError("no answer")

        await runner.execute("charge", lambda: "ch_1", request={"n": 1}, idempotency_key="done")
        await runner.execute("charge", decline, request={"n": 2}, idempotency_key="declined")
        await runner.execute("charge", timeout, request={"n": 3}, idempotency_key="lost")

        class Crash(BaseException):
            pass

        async def crash() -> None:
            raise Crash

        for key in ("stranded", "taken"):
            with contextlib.suppress(Crash):
                await runner.execute("charge", crash, request={"n": 4}, idempotency_key=key)
        # A second worker takes one stranded claim over once its lease ran out.
        clock.advance(60)
        other = ActionRunner(ledger, owner="worker-b", lease=30.0)
        stale = [r for r in await ledger.receipts(stale=True) if r.idempotency_key == "taken"]
        taken = stale[0].evolve(owner="worker-b", fencing_token=2, version=stale[0].version + 1)
        assert await ledger.take_over(taken, lease=30.0)
        assert other.owner == "worker-b"
        # A claim whose worker died before starting its attempt.
        from dataoad._attempts import Call  # noqa: F401  (layout check)
        from dataoad.testing import make_receipt

        await ledger.claim(make_receipt(idempotency_key="unstarted", owner="worker-a"), lease=30.0)
    print(f"wrote {path} with dataoad from {dataoad.__file__}")


if __name__ == "__main__":
    asyncio.run(main(Path(sys.argv[1])))
