"""Write the schema-5 ledger the audit migration tests open (run with that code).

Run once, from a checkout of the last commit before the operator audit
(``git worktree add /tmp/v5 00ea33e``), so the file is exactly what it
wrote::

    PYTHONPATH=/tmp/v5 python tests/data/make_v5_ledgers.py tests/data

It writes ``ledger-schema5.sqlite3``: a CONFIRMED, a FAILED and an UNKNOWN
receipt, one in namespace ``tenant``, and a claim stranded after its
attempt started (its owner's lease long gone).
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

from dataoad import ActionRunner, DefinitiveFailure, SQLiteLedger
from dataoad.testing import FaultyLedger, LedgerFault


async def main(folder: Path) -> None:
    path = folder / "ledger-schema5.sqlite3"
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

        await runner.execute(
            "charge", lost, request={"n": 3}, idempotency_key="lost", provider_reference="ref-3"
        )
        await tenant.execute("charge", lambda: "ch_4", request={"n": 4}, idempotency_key="done")
        faulty = FaultyLedger(ledger)
        faulty.inject("record", LedgerFault.FAIL_BEFORE_WRITE)
        try:
            await ActionRunner(faulty, owner="worker-b", lease=1.0).execute(
                "charge",
                lambda: "ch_5",
                request={"n": 5},
                idempotency_key="stranded",
                provider_reference="ref-5",
            )
        except Exception as exc:  # the outcome could not be recorded: PENDING, attempt 1
            print(f"stranded: {type(exc).__name__}", file=sys.stderr)
    print(f"wrote {path} (schema 5)", file=sys.stderr)


if __name__ == "__main__":
    asyncio.run(main(Path(sys.argv[1])))
