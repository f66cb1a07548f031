"""A Temporal activity for the crash tests, run as Temporal's worker would run it.

``python -m tests.engines.temporal_worker CONFIG.json start|recover``:
``start`` runs attempt 1 of the checkout's charge activity (and may die at
``DATAOAD_CRASH_AT``); ``recover`` runs attempt 2, as Temporal does once
the first attempt's start-to-close or heartbeat timeout passes. Both run in
``temporalio.testing.ActivityEnvironment`` with the same workflow and
activity ids. Prints the outcome as one JSON line.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import sys
from pathlib import Path
from typing import Any

from temporalio import activity
from temporalio.exceptions import ApplicationError
from temporalio.testing import ActivityEnvironment

from dataoad.integrations.temporal import guarded_activity
from tests.engines.checkout import Checkout


async def main(config_path: str, phase: str) -> None:
    config = json.loads(Path(config_path).read_text())
    shop = Checkout(config)
    charge = shop.charge_function()
    if shop.guarded:
        charge_activity: Any = guarded_activity(shop.runner, "charge", **shop.guard_options())(
            charge
        )
    else:
        charge_activity = activity.defn(name="charge")(charge)

    env = ActivityEnvironment()
    env.info = dataclasses.replace(
        env.info,
        workflow_id=config["workflow_id"],
        activity_id="1",
        attempt=1 if phase == "start" else 2,
    )
    try:
        value = await env.run(charge_activity, config["order"], 1250)
        outcome: dict[str, Any] = {"outcome": "returned", "value": value}
    except ApplicationError as exc:
        outcome = {
            "outcome": "error",
            "type": exc.type,
            "non_retryable": exc.non_retryable,
            "details": exc.details[0] if exc.details else None,
        }
    finally:
        await shop.ledger.close()
    print(json.dumps(outcome), flush=True)


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2]))
