"""DBOS: a checkout workflow whose charge step is guarded by Dataoad.

Run: python -m examples.engines.dbos_checkout (needs the dbos extra: pip install -e ".[dbos]")

The provider commits the first charge and then times out. DBOS would record
that timeout as the step's error (or, with step retries, charge again);
inside ``guarded_step`` the verifier reads the provider and finds the charge.
A second order's verifier cannot reach the provider: the step raises
``UnresolvedActionError`` with the receipt, and nothing charges it again.

Expected output:

    order-1: CONFIRMED (key dbos:checkout-order-1:1), charges at the provider: 1
    order-2: UNKNOWN, raised as UnresolvedActionError (action id <action-id>), charges at the provider: 1
"""

from __future__ import annotations

import asyncio
from typing import Any

from dbos import DBOS, SetWorkflowID

from dataoad import UnresolvedActionError
from dataoad.integrations.dbos import guarded_step
from examples.engines._shop import ORDER, PaymentAdapter, Shop

__all__ = ["PaymentAdapter", "main"]


async def checkout(shop: Shop, order: str) -> None:
    @guarded_step(shop.runner, "charge_customer", name=f"charge-{order}", **shop.options())
    async def charge(request: dict[str, Any], reference: str) -> Any:
        return await shop.adapter.perform(request, reference)

    @DBOS.workflow(name=f"checkout-{order}")
    async def workflow() -> str:
        try:
            result = await charge(ORDER, order)
        except UnresolvedActionError as exc:
            return f"UNKNOWN, raised as UnresolvedActionError (action id {exc.action_id})"
        return f"{result.status.value} (key {result.receipt.idempotency_key})"

    DBOS.launch()
    with SetWorkflowID(f"checkout-{order}"):
        handle = await DBOS.start_workflow_async(workflow)
    said = await handle.get_result()
    print(f"{order}: {said}, charges at the provider: {shop.charges(order)}")


async def main() -> None:
    for order, lookup_down in (("order-1", 0), ("order-2", 5)):
        shop = Shop(lookup_down=lookup_down)
        DBOS(
            config={
                "name": "dataoad-example",
                "system_database_url": shop.dbos_system_database(),
            }
        )
        try:
            await checkout(shop, order)
        finally:
            DBOS.destroy(destroy_registry=True)
            await shop.ledger.close()


if __name__ == "__main__":
    asyncio.run(main())
