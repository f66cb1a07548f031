"""A Pydantic AI agent made durable by DBOS (``DBOSAgent``), for the crash tests.

``python -m tests.engines.pydantic_dbos_worker CONFIG.json start|recover``.
A scripted model (``FunctionModel``) asks for one ``charge`` tool call, then
answers with the tool's result. The tool runs a Dataoad ``guarded_step``
(``mode: guarded``) or charges directly (``mode: plain``). ``start`` runs the
agent as a DBOS workflow (and may die at ``DATAOAD_CRASH_AT``); ``recover``
launches DBOS, whose recovery runs the agent's workflow again (the model's
answers are replayed from DBOS's checkpoints), and prints one JSON line.
"""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path
from typing import Any

from dbos import DBOS, SetWorkflowID, WorkflowHandleAsync
from pydantic_ai import Agent, AgentRunResult
from pydantic_ai.durable_exec.dbos import DBOSAgent
from pydantic_ai.messages import ModelMessage, ModelResponse, TextPart, ToolCallPart, ToolReturnPart
from pydantic_ai.models.function import AgentInfo, FunctionModel

from dataoad import NotInStepError, UnresolvedActionError, describe_result
from dataoad.integrations.dbos import guarded_step
from tests.engines.checkout import Checkout


def scripted_model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
    """Ask for the charge once; then report what the tool said."""
    returns = [
        part
        for message in messages
        for part in getattr(message, "parts", [])
        if isinstance(part, ToolReturnPart)
    ]
    if not returns:
        return ModelResponse(
            parts=[ToolCallPart("charge", {"order_id": "o-1", "cents": 1250}, "call-1")]
        )
    return ModelResponse(parts=[TextPart(f"tool said: {returns[-1].content}")])


def build(config: dict[str, Any]) -> tuple[DBOSAgent[None, str], Checkout]:
    shop = Checkout(config)
    DBOS(config={"name": "dataoad-agent", "system_database_url": config["system_database"]})
    charge = shop.charge_function()
    step = (
        guarded_step(shop.runner, "charge", name="charge", **shop.guard_options())(charge)
        if shop.guarded
        else None
    )

    async def charge_tool(order_id: str, cents: int) -> str:
        """Charge the customer of an order."""
        if step is None:
            return await charge(order_id, cents)
        # An UNKNOWN raises UnresolvedActionError out of the agent's workflow.
        return describe_result(await step(order_id, cents), "charge").message

    agent = Agent(FunctionModel(scripted_model), name="checkout", tools=[])
    agent.tool_plain(name="charge")(charge_tool)
    # DBOS numbers steps as they start: a guarded step needs the agent's tool
    # calls run one at a time (``parallel: true`` tries the default, refused).
    if config.get("parallel"):
        return DBOSAgent(agent, parallel_execution_mode="parallel_ordered_events"), shop
    return DBOSAgent(agent, parallel_execution_mode="sequential"), shop


async def main(config_path: str, phase: str) -> None:
    config = json.loads(Path(config_path).read_text())
    durable, shop = build(config)
    DBOS.launch()
    try:
        if phase == "start":
            with SetWorkflowID(config["workflow_id"]):
                result = await durable.run("charge order o-1")
            output = result.output
        else:
            handle: WorkflowHandleAsync[AgentRunResult[str]]
            handle = await DBOS.retrieve_workflow_async(config["workflow_id"])
            output = (await handle.get_result()).output
        outcome: dict[str, Any] = {"outcome": "answered", "answer": output}
    except NotInStepError as exc:
        outcome = {"outcome": "refused", "error": str(exc)}
    except UnresolvedActionError as exc:
        receipt = exc.receipt
        status = None
        if receipt is not None:
            assert receipt.final_status is not None
            status = receipt.final_status.value
        outcome = {"outcome": "unresolved", "receipt": status}
    finally:
        await shop.ledger.close()
        DBOS.destroy()
    print(json.dumps(outcome), flush=True)


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2]))
