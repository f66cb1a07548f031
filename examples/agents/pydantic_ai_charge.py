"""Pydantic AI, offline: the model retries a timed-out charge; it happens once.

Run: python examples/agents/pydantic_ai_charge.py (needs the pydantic-ai extra: pip install -e ".[pydantic-ai]")

Expected output:

    tool result 1: UNKNOWN: charge_order may have happened (action id <action-id>); the provider did not confirm it. Do NOT call this tool again for the same request: that could do it twice. It will be verified read-only; tell the user the outcome is being checked.
    tool result 2: UNKNOWN: charge_order may have happened (action id <action-id>); the provider did not confirm it. Do NOT call this tool again for the same request: that could do it twice. It will be verified read-only; tell the user the outcome is being checked.
    agent: I could not confirm the charge yet; it is being checked.
    later, read-only verification: CONFIRMED
    charges at the provider: 1
    see the receipt: dataoad receipts show <action-id> --ledger sqlite://<ledger>
"""

from __future__ import annotations

import asyncio

from _shop import GUARD, ORDER, charge_order, settle, show
from pydantic_ai import Agent, ModelMessage, ModelResponse, TextPart, ToolCallPart
from pydantic_ai.messages import ToolReturnPart
from pydantic_ai.models.function import AgentInfo, FunctionModel

from dataoad.integrations.pydantic_ai import guarded_tool


def scripted_model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
    """Stands in for an LLM: calls the tool, calls it again, then answers."""
    returns = [
        str(part.content)
        for message in messages
        for part in getattr(message, "parts", [])
        if isinstance(part, ToolReturnPart)
    ]
    if len(returns) < 2:
        return ModelResponse(parts=[ToolCallPart("charge_order", dict(ORDER))])
    for n, text in enumerate(returns, start=1):
        show(f"tool result {n}", text)
    return ModelResponse(
        parts=[TextPart("I could not confirm the charge yet; it is being checked.")]
    )


async def main() -> None:
    agent = Agent(FunctionModel(scripted_model), tools=[guarded_tool(charge_order, GUARD)])
    result = await agent.run("Charge order-7 for 25 EUR")
    print(f"agent: {result.output}")
    await settle()


if __name__ == "__main__":
    asyncio.run(main())
