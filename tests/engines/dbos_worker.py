"""A DBOS worker for the crash tests: start a checkout workflow, or recover it.

``python -m tests.engines.dbos_worker CONFIG.json start|recover``. The
workflow charges the file-backed provider in one step: guarded by Dataoad
(``mode: guarded``) or a plain DBOS step (``mode: plain``). ``start`` runs
the workflow (and may die at ``DATAOAD_CRASH_AT``); ``recover`` launches
DBOS, whose own recovery runs the workflow again, and prints its outcome as
one JSON line.
"""

from __future__ import annotations

import asyncio
import json
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from dbos import DBOS, SetWorkflowID

from dataoad import ActionResult, SQLiteLedger, UnresolvedActionError
from dataoad.integrations.dbos import guarded_step
from tests.engines.checkout import Checkout


def build(config: dict[str, Any]) -> tuple[Any, SQLiteLedger]:
    shop = Checkout(config)
    DBOS(config={"name": "dataoad-crash", "system_database_url": config["system_database"]})
    charge = shop.charge_function()
    charge_step: Callable[[str, int], Awaitable[ActionResult[str] | str]]
    if shop.guarded:
        charge_step = guarded_step(shop.runner, "charge", name="charge", **shop.guard_options())(
            charge
        )
    else:
        charge_step = DBOS.step(name="charge")(charge)

    @DBOS.workflow(name="checkout")
    async def checkout(order_id: str, cents: int) -> dict[str, Any]:
        try:
            result = await charge_step(order_id, cents)
        except UnresolvedActionError as exc:
            receipt = exc.receipt
            status = None
            if receipt is not None:
                assert receipt.final_status is not None
                status = receipt.final_status.value
            return {"outcome": "unresolved", "receipt": status}
        if config["mode"] == "plain":
            return {"outcome": "value", "charge": result}
        assert isinstance(result, ActionResult)
        assert result.receipt.final_status is not None
        return {
            "outcome": result.status.value,
            "replayed": result.replayed,
            "taken_over": result.taken_over,
            "receipt": result.receipt.final_status.value,
        }

    return checkout, shop.ledger


async def main(config_path: str, phase: str) -> None:
    config = json.loads(Path(config_path).read_text())
    checkout, ledger = build(config)
    DBOS.launch()  # from inside the loop: recovered workflows run on it
    try:
        if phase == "start":
            with SetWorkflowID(config["workflow_id"]):
                handle = await DBOS.start_workflow_async(checkout, config["order"], 1250)
        else:
            handle = await DBOS.retrieve_workflow_async(config["workflow_id"])
        outcome = await handle.get_result()
        print(json.dumps(outcome), flush=True)
    finally:
        await ledger.close()
        DBOS.destroy()


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2]))
