"""OpenAI Agents SDK: a scripted model retries a timed-out charge; one charge happens."""

from __future__ import annotations

import asyncio
import json
from typing import Any

from suite_support.agents import framework

framework("agents", "openai-agents")

from agents import Agent, ModelResponse, Runner, Usage, set_tracing_disabled
from agents.models.interface import Model
from agents.tool_context import ToolContext
from openai.types.responses import (
    ResponseFunctionToolCall,
    ResponseOutputMessage,
    ResponseOutputText,
)

from dataoad import ActionRunner, GuardedTool, InMemoryLedger
from dataoad.integrations.openai_agents import guarded_function_tool
from suite_support.agents import ARGS, ChargeScenario

set_tracing_disabled(True)


class ScriptedModel(Model):
    """Calls the charge tool, calls it again after reading the result, then answers."""

    def __init__(self) -> None:
        self.inputs: list[list[str]] = []

    async def get_response(
        self, system_instructions: Any, input: Any, *args: Any, **kw: Any
    ) -> Any:
        outputs = [
            str(item.get("output"))
            for item in (input if isinstance(input, list) else [])
            if isinstance(item, dict) and item.get("type") == "function_call_output"
        ]
        self.inputs.append(outputs)
        turn = len(self.inputs)
        if len(outputs) < 2:
            call = ResponseFunctionToolCall(
                type="function_call",
                id=f"fc_{turn}",
                call_id=f"call_{turn}",  # a new tool-call id for the same intent
                name="charge_order",
                arguments=json.dumps(ARGS),
                status="completed",
            )
            return ModelResponse(output=[call], usage=Usage(), response_id=None)
        text = ResponseOutputText(
            type="output_text", text="The charge is being checked.", annotations=[]
        )
        message = ResponseOutputMessage(
            id="msg_1", type="message", role="assistant", status="completed", content=[text]
        )
        return ModelResponse(output=[message], usage=Usage(), response_id=None)

    def stream_response(self, *args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError


def test_retried_tool_call_replays_and_the_model_reads_unknown() -> None:
    scenario = ChargeScenario()
    model = ScriptedModel()
    tool = guarded_function_tool(scenario.charge_order, scenario.guard())
    agent = Agent(name="billing", model=model, tools=[tool])
    result = asyncio.run(Runner.run(agent, "Charge order-7 for 25 EUR"))

    assert len(scenario.provider.charges) == 1, "the retried call charged again"
    first, second = model.inputs[1][0], model.inputs[2][1]
    assert first.startswith("UNKNOWN: charge_order may have happened")
    assert "Do NOT call this tool again" in first
    assert second.startswith("UNKNOWN:")
    assert result.final_output == "The charge is being checked."
    assert asyncio.run(scenario.settle_later(first)) == "CONFIRMED"
    assert len(scenario.provider.charges) == 1


def test_the_tool_schema_is_the_functions_own() -> None:
    scenario = ChargeScenario()
    tool = guarded_function_tool(scenario.charge_order, scenario.guard())
    assert tool.name == "charge_order"
    assert set(tool.params_json_schema["properties"]) == {"order_id", "amount_cents"}
    assert "Charge the customer" in tool.description


def test_a_key_drawn_from_the_tool_context_s_call_id_is_refused_before_anything() -> None:
    charged: list[str] = []

    async def charge_order(ctx: ToolContext[Any], order_id: str, amount_cents: int) -> str:
        """Charge an order."""
        charged.append(order_id)
        return "ch"

    ledger = InMemoryLedger()
    guard = GuardedTool(
        ActionRunner(ledger),
        "charge_order",
        # New with every call id: the model's retry would charge again.
        idempotency_key=lambda ctx, order_id, amount_cents: f"{order_id}:{ctx.tool_call_id}",
        request=lambda ctx, order_id, amount_cents: {"order": order_id, "amount": amount_cents},
    )
    tool = guarded_function_tool(charge_order, guard)
    args = json.dumps({"order_id": "o7", "amount_cents": 2500})

    async def calls() -> list[str]:
        said = []
        for n in (1, 2):
            ctx = ToolContext(
                context=None,
                tool_name="charge_order",
                tool_call_id=f"call_retry_{n:04d}",
                tool_arguments=args,
            )
            said.append(str(await tool.on_invoke_tool(ctx, args)))
        return said

    said = asyncio.run(calls())
    assert charged == []
    assert ledger.snapshot() == []
    assert all("error" in text.lower() for text in said), said
