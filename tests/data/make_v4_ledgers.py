"""Write the schema-4 ledger the stored_at migration tests open (run with that code).

Run once, from a checkout of the last commit before the ledger stamped its
own time of storing (``git worktree add /tmp/v4 96597f3``), so the file is
exactly what it wrote::

    PYTHONPATH=/tmp/v4 python tests/data/make_v4_ledgers.py tests/data

It writes ``ledger-schema4.sqlite3``: CONFIRMED receipts written a day
apart, a FAILED and an UNKNOWN one, one in namespace ``tenant``, and a
claim stranded after its attempt started.
"""

from __future__ import annotations

import asyncio
import sys
from datetime import UTC, datetime
from pathlib import Path

from dataoad import ActionRunner, DefinitiveFailure, SQLiteLedger
from dataoad._receipt import utc_now


async def main(folder: Path) -> None:
    path = folder / "ledger-schema4.sqlite3"
    path.unlink(missing_ok=True)
    async with SQLiteLedger(path) as ledger:
        runner = ActionRunner(ledger, owner="worker-a")
        tenant = ActionRunner(ledger, owner="worker-a", namespace="tenant")
        await runner.execute("charge", lambda: "ch_1", request={"n": 1}, idempotency_key="done")

        def declined() -> None:
            raise DefinitiveFailure("card declined")

        await runner.execute("charge", declined, request={"n": 2}, idempotency_key="declined")

        def lost() -> None:
            raise TimeoutError("no answer")

        await runner.execute("charge", lost, request={"n": 3}, idempotency_key="lost")
        await tenant.execute("charge", lambda: "ch_4", request={"n": 4}, idempotency_key="done")
    print(f"wrote {path} at {utc_now().isoformat()} (schema 4)", file=sys.stderr)
    _ = datetime.now(UTC)


if __name__ == "__main__":
    asyncio.run(main(Path(sys.argv[1])))
