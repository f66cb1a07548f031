"""Write the ledgers that the schema-migration tests open (run with v0.1's code).

Run once, from a checkout of the release before leases (``git worktree add
/tmp/v01 3a9e181``), so the files are exactly what that release wrote::

    PYTHONPATH=/tmp/v01 python tests/data/make_v01_ledgers.py tests/data

It writes ``ledger-v0.1.sqlite3``: receipts in every state v0.1 can leave
(CONFIRMED, FAILED, UNKNOWN, a PENDING claim that never started and one
stranded after its attempt started).
"""

from __future__ import annotations

import asyncio
import contextlib
import sys
from pathlib import Path

import dataoad
from dataoad import ActionRunner, DefinitiveFailure, SQLiteLedger


async def main(folder: Path) -> None:
    path = folder / "ledger-v0.1.sqlite3"
    path.unlink(missing_ok=True)
    async with SQLiteLedger(path) as ledger:
        runner = ActionRunner(ledger)

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

        with contextlib.suppress(Crash):
            await runner.execute("charge", crash, request={"n": 4}, idempotency_key="stranded")
    # A claim whose worker died before starting its attempt.
    async with SQLiteLedger(path) as ledger:
        import uuid

        from dataoad._attempts import Call  # noqa: F401  (v0.1 layout check)
        from dataoad._receipt import ActionReceipt, utc_now
        from dataoad._status import ClaimState

        now = utc_now()
        await ledger.claim(
            ActionReceipt(
                action_id=uuid.uuid4().hex,
                action_name="charge",
                idempotency_key="unstarted",
                request_hash="0" * 64,
                provider_reference=None,
                risk=None,
                claim_state=ClaimState.PENDING,
                attempts=0,
                execution_status=None,
                verification_status=None,
                final_status=None,
                provider_request_id=None,
                error=None,
                metadata={},
                attempt_records=(),
                version=1,
                created_at=now,
                updated_at=now,
            )
        )
    print(f"wrote {path} with dataoad from {dataoad.__file__}")


if __name__ == "__main__":
    asyncio.run(main(Path(sys.argv[1])))
