"""The tutorial's worker: it charges an order, and dies before it can record the outcome."""

from __future__ import annotations

import asyncio
import os
import signal

from shop import FOLDER, charge

from dataoad import ActionRunner, SQLiteLedger


def charge_then_die() -> str:
    charge_id = charge("order-1001", 4_200)  # the provider has charged the card
    os.kill(os.getpid(), signal.SIGKILL)  # ...and the worker is killed right now
    return charge_id


async def main() -> None:
    FOLDER.mkdir(exist_ok=True)
    # One hour: long enough that the tutorial reads the same at any pace (with
    # the default 30 s, a retry after the lease ran out would take the claim over).
    runner = ActionRunner(SQLiteLedger(FOLDER / "ledger.sqlite3"), lease=3600)
    await runner.execute(
        "charge_order",
        charge_then_die,
        request={"order_id": "order-1001", "amount_cents": 4_200},
        idempotency_key="order-1001",
        provider_reference="order-1001",
    )


if __name__ == "__main__":
    asyncio.run(main())
