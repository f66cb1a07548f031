"""Pydantic AI's DBOS-durable agent (``DBOSAgent``) with a Dataoad-guarded tool.

Run: python -m examples.engines.pydantic_ai_dbos_checkout (needs the pydantic-ai and dbos extras)

A scripted model (no LLM) asks for the charge. The tool runs a DBOS step
guarded by Dataoad: the provider commits and times out, the verifier finds
the charge, and the model reads the evidence. Were the worker killed
between the charge and DBOS's checkpoint, DBOS would run the agent's
workflow again (the model's answers replayed from its checkpoints) and the
step would meet its receipt instead of charging again.

Expected output:

    agent: the charge is done: CONFIRMED: charge_customer happened (action id <action-id>). Result: "Charge(charge_id='ch_1', customer_id='cus_7', amount_cents=2500, client_reference='order-1')"
    charges at the provider: 1
"""

from __future__ import annotations

import asyncio
from typing import Any

from dbos import DBOS, SetWorkflowID
from pydantic_ai import Agent
from pydantic_ai.durable_exec.dbos import DBOSAgent
from pydantic_ai.messages import ModelMessage, ModelResponse, TextPart, ToolCallPart, ToolReturnPart
from pydantic_ai.models.function import AgentInfo, FunctionModel

from dataoad import describe_result
from dataoad.integrations.dbos import guarded_step
from examples.engines._shop import ORDER, PaymentAdapter, Shop

__all__ = ["PaymentAdapter", "main"]


def scripted_model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
    """Stands in for an LLM: ask for the charge, then report what the tool said."""
    said = [
        part.content
        for message in messages
        for part in getattr(message, "parts", [])
        if isinstance(part, ToolReturnPart)
    ]
    if not said:
        return ModelResponse(parts=[ToolCallPart("charge_order", {"order": "order-1"}, "c1")])
    return ModelResponse(parts=[TextPart(f"the charge is done: {said[-1]}")])


async def main() -> None:
    shop = Shop()
    DBOS(
        config={
            "name": "dataoad-agent-example",
            "system_database_url": shop.dbos_system_database(),
        }
    )

    @guarded_step(shop.runner, "charge_customer", name="charge", **shop.options())
    async def charge(request: dict[str, Any], reference: str) -> Any:
        return await shop.adapter.perform(request, reference)

    agent = Agent(FunctionModel(scripted_model), name="checkout")

    @agent.tool_plain
    async def charge_order(order: str) -> str:
        """Charge the customer of an order."""
        return describe_result(await charge(ORDER, order), "charge_customer").message

    # One tool call at a time: DBOS numbers steps as they start (see the docs).
    durable = DBOSAgent(agent, parallel_execution_mode="sequential")
    DBOS.launch()
    try:
        with SetWorkflowID("agent-order-1"):
            result = await durable.run("charge order-1")
        print(f"agent: {result.output}")
        print(f"charges at the provider: {shop.charges('order-1')}")
    finally:
        DBOS.destroy(destroy_registry=True)
        await shop.ledger.close()


if __name__ == "__main__":
    asyncio.run(main())
