"""Temporal: a checkout workflow whose charge activity is guarded by Dataoad.

Run: python -m examples.engines.temporal_checkout (needs the temporal extra: pip install -e ".[temporal]")

With no server, the activity runs as Temporal's worker would run it, in
``temporalio.testing.ActivityEnvironment``: attempt 1 commits the charge and
times out; Temporal retries the activity (attempt 2, same workflow and
activity id, so the same key). With a Temporal server, ``--server
host:port`` runs ``CheckoutWorkflow`` on a real worker instead.

Expected output:

    attempt 1: UNKNOWN, non-retryable (UnresolvedActionError), action id <action-id>
    attempt 2: CONFIRMED by the verifier, not charged again
    charges at the provider: 1
"""

from __future__ import annotations

import asyncio
import dataclasses
import sys
from datetime import timedelta
from typing import Any

from temporalio import workflow
from temporalio.exceptions import ApplicationError

from dataoad.integrations.temporal import guarded_activity, unresolved
from examples.engines._shop import ORDER, PaymentAdapter, Shop

__all__ = ["CheckoutWorkflow", "PaymentAdapter", "charge_activity", "main"]

# The provider's read path is down for attempt 1's check, up for attempt 2's.
shop = Shop(lookup_down=1)


@guarded_activity(shop.runner, "charge_customer", name="charge", **shop.options())
async def charge_activity(request: dict[str, Any], reference: str) -> Any:
    """Charge the customer: the adapter's provider call."""
    return await shop.adapter.perform(request, reference)


@workflow.defn
class CheckoutWorkflow:
    """Charge once per order; an UNKNOWN charge waits for a person, never a retry."""

    @workflow.run
    async def run(self, order: str) -> str:
        try:
            await workflow.execute_activity(
                charge_activity, args=[ORDER, order], start_to_close_timeout=timedelta(seconds=30)
            )
        except Exception as exc:
            error = unresolved(exc)
            if error is None:
                raise
            return f"UNKNOWN: {error.action_id}"
        return "CONFIRMED"


async def without_server() -> None:
    from temporalio.testing import ActivityEnvironment

    env = ActivityEnvironment()
    for attempt in (1, 2):
        env.info = dataclasses.replace(
            env.info, workflow_id="checkout-order-1", activity_id="1", attempt=attempt
        )
        try:
            await env.run(charge_activity, ORDER, "order-1")
        except ApplicationError as exc:
            action_id = exc.details[0]["action_id"]
            print(f"attempt {attempt}: UNKNOWN, non-retryable ({exc.type}), action id {action_id}")
        else:
            print(f"attempt {attempt}: CONFIRMED by the verifier, not charged again")
    print(f"charges at the provider: {shop.charges('order-1')}")


async def with_server(address: str) -> None:  # pragma: no cover - needs a Temporal server
    from temporalio.client import Client
    from temporalio.worker import Worker

    client = await Client.connect(address)
    async with Worker(
        client, task_queue="checkout", workflows=[CheckoutWorkflow], activities=[charge_activity]
    ):
        said = await client.execute_workflow(
            CheckoutWorkflow.run, "order-1", id="checkout-order-1", task_queue="checkout"
        )
    print(f"order-1: {said}; charges at the provider: {shop.charges('order-1')}")


async def main() -> None:
    try:
        if "--server" in sys.argv:
            await with_server(sys.argv[sys.argv.index("--server") + 1])
        else:
            await without_server()
    finally:
        await shop.ledger.close()


if __name__ == "__main__":
    asyncio.run(main())
