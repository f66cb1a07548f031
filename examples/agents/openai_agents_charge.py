"""OpenAI Agents SDK, offline: the model retries a timed-out charge; it happens once.

Run: python examples/agents/openai_agents_charge.py (needs the openai-agents extra: pip install -e ".[openai-agents]")

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
import json
from typing import Any

from _shop import GUARD, ORDER, charge_order, settle, show
from agents import Agent, ModelResponse, Runner, Usage, set_tracing_disabled
from agents.models.interface import Model
from openai.types.responses import (
    ResponseFunctionToolCall,
    ResponseOutputMessage,
    ResponseOutputText,
)

from dataoad.integrations.openai_agents import guarded_function_tool


class ScriptedModel(Model):
    """Stands in for an LLM: calls the tool, calls it again, then answers."""

    turns = 0

    async def get_response(self, system_instructions: Any, input: Any, *a: Any, **k: Any) -> Any:
        self.turns += 1
        returns = [
            str(item["output"])
            for item in (input if isinstance(input, list) else [])
            if isinstance(item, dict) and item.get("type") == "function_call_output"
        ]
        if len(returns) < 2:
            call = ResponseFunctionToolCall(
                type="function_call",
                id=f"fc_{self.turns}",
                call_id=f"call_{self.turns}",
                name="charge_order",
                arguments=json.dumps(ORDER),
                status="completed",
            )
            return ModelResponse(output=[call], usage=Usage(), response_id=None)
        for n, text in enumerate(returns, start=1):
            show(f"tool result {n}", text)
        answer = ResponseOutputText(
            type="output_text",
            text="I could not confirm the charge yet; it is being checked.",
            annotations=[],
        )
        message = ResponseOutputMessage(
            id="msg_1", type="message", role="assistant", status="completed", content=[answer]
        )
        return ModelResponse(output=[message], usage=Usage(), response_id=None)

    def stream_response(self, *args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError


async def main() -> None:
    set_tracing_disabled(True)  # no network: nothing to export traces to
    tool = guarded_function_tool(charge_order, GUARD)
    agent = Agent(name="billing", model=ScriptedModel(), tools=[tool])
    result = await Runner.run(agent, "Charge order-7 for 25 EUR")
    print(f"agent: {result.final_output}")
    await settle()


if __name__ == "__main__":
    asyncio.run(main())
