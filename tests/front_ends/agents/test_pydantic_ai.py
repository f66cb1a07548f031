"""Pydantic AI: a model retries a timed-out charge; the provider sees one charge."""

from __future__ import annotations

import asyncio

from suite_support.agents import framework

framework("pydantic_ai", "pydantic-ai")

from pydantic_ai import Agent, ModelMessage, ModelResponse, TextPart, ToolCallPart
from pydantic_ai.messages import ToolReturnPart
from pydantic_ai.models.function import AgentInfo, FunctionModel

from dataoad.integrations.pydantic_ai import guarded_tool
from suite_support.agents import ARGS, ChargeScenario


def tool_returns(messages: list[ModelMessage]) -> list[str]:
    return [
        str(part.content)
        for message in messages
        for part in getattr(message, "parts", [])
        if isinstance(part, ToolReturnPart)
    ]


def test_retried_tool_call_replays_and_the_model_reads_unknown() -> None:
    scenario = ChargeScenario()
    seen: list[list[str]] = []

    def model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        returns = tool_returns(messages)
        seen.append(returns)
        if len(returns) < 2:  # first call, then the same call again (a new tool-call id)
            return ModelResponse(parts=[ToolCallPart("charge_order", dict(ARGS))])
        return ModelResponse(
            parts=[TextPart("I could not confirm the charge; it is being checked.")]
        )

    tool = guarded_tool(scenario.charge_order, scenario.guard())
    agent = Agent(FunctionModel(model), tools=[tool])
    result = asyncio.run(agent.run("Charge order-7 for 25 EUR"))

    assert len(scenario.provider.charges) == 1, "the retried call charged again"
    assert scenario.provider.charge_calls == 1
    first, second = seen[1][0], seen[2][1]
    assert first.startswith("UNKNOWN: charge_order may have happened")
    assert "Do NOT call this tool again" in first
    assert second.startswith("UNKNOWN:")  # the retry is a replay, still unverified
    assert "being checked" in result.output
    assert asyncio.run(scenario.settle_later(first)) == "CONFIRMED"
    assert len(scenario.provider.charges) == 1


def test_the_tool_schema_is_the_functions_own() -> None:
    scenario = ChargeScenario()
    tool = guarded_tool(scenario.charge_order, scenario.guard())
    assert tool.name == "charge_order"
    assert tool.description == "Charge the customer of an order."
    schema = tool.function_schema.json_schema
    assert set(schema["properties"]) == {"order_id", "amount_cents"}
