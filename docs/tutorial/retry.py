"""The tutorial's retry: the same order again, as a restarted worker or an agent would."""

from __future__ import annotations

import asyncio

from shop import FOLDER, charge, charges

from dataoad import ActionInProgressError, ActionRunner, SQLiteLedger


async def main() -> None:
    async with SQLiteLedger(FOLDER / "ledger.sqlite3") as ledger:
        try:
            result = await ActionRunner(ledger).execute(
                "charge_order",
                lambda: charge("order-1001", 4_200),
                request={"order_id": "order-1001", "amount_cents": 4_200},
                idempotency_key="order-1001",
                provider_reference="order-1001",
            )
        except ActionInProgressError as exc:
            print(f"not charged again: {exc}")
        else:
            print(f"{result.status.value}, replayed={result.replayed}")
        print(f"charges at the provider: {len(charges())}")


if __name__ == "__main__":
    asyncio.run(main())
