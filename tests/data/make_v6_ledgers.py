"""Write the schema-6 ledger the receipt-records migration tests open (run with that code).

Run once, from a checkout of the last commit before receipts kept their own
operator records (``git worktree add /tmp/v6 35b65e5``), so the file is
exactly what it wrote::

    PYTHONPATH=/tmp/v6 python tests/data/make_v6_ledgers.py tests/data

It writes ``ledger-schema6.sqlite3``: the receipts of the schema-5 file and
an audit naming them: a reopened FAILED receipt, an UNKNOWN one whose reopen
was refused, a stranded claim recovered, a receipt of namespace ``tenant``
named by a refused reopen and then pruned, and the prune itself (no action id).
"""

from __future__ import annotations

import asyncio
import contextlib
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path

from dataoad import ActionRunner, DefinitiveFailure, RecoveryRefusedError, SQLiteLedger
from dataoad.testing import FaultyLedger, LedgerFault


async def main(folder: Path) -> None:
    path = folder / "ledger-schema6.sqlite3"
    path.unlink(missing_ok=True)
    async with SQLiteLedger(path) as ledger:
        runner = ActionRunner(ledger, owner="worker-a")
        tenant = ActionRunner(ledger, owner="worker-a", namespace="tenant")
        await runner.execute("charge", lambda: "ch_1", request={"n": 1}, idempotency_key="done")

        def declined() -> None:
            raise DefinitiveFailure("card declined")

        failed = await runner.execute(
            "charge", declined, request={"n": 2}, idempotency_key="declined"
        )

        def lost() -> None:
            raise TimeoutError("no answer")

        unknown = await runner.execute(
            "charge", lost, request={"n": 3}, idempotency_key="lost", provider_reference="ref-3"
        )
        done = await tenant.execute(
            "charge", lambda: "ch_4", request={"n": 4}, idempotency_key="done"
        )
        faulty = FaultyLedger(ledger)
        faulty.inject("record", LedgerFault.FAIL_BEFORE_WRITE)
        stranded = None
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
        (stranded,) = await ledger.receipts(pending=True)
        await runner.reopen(failed.receipt.action_id, operator="ana", reason="card replaced")
        with contextlib.suppress(RecoveryRefusedError):
            await runner.reopen(unknown.receipt.action_id, operator="bo", reason="try again")
        with contextlib.suppress(RecoveryRefusedError):
            await tenant.reopen(done.receipt.action_id, operator="bo", reason="wrong tenant")
        await asyncio.sleep(1.2)  # the stranded claim's lease runs out
        # A verifier that returns no VerificationResult is no evidence: recovered as UNKNOWN.
        await runner.recover_pending(
            stranded.action_id,
            lambda ref: None,  # type: ignore[arg-type, return-value]
            operator="ana",
            reason="worker-b died",
        )
        future = datetime.now(UTC) + timedelta(days=1)
        pruned = await ledger.prune(completed_before=future, namespace="tenant")
        print(f"pruned {pruned}", file=sys.stderr)
        from dataoad._operator import OperatorRecord, this_host

        await ledger.append_audit(
            OperatorRecord("cy", this_host(), "prune", None, "tenant", "retention", "deleted 1")
        )
    print(f"wrote {path} (schema 6)", file=sys.stderr)


if __name__ == "__main__":
    asyncio.run(main(Path(sys.argv[1])))
