"""LangGraph, no LLM: a scripted agent node retries a timed-out charge; it happens once.

Run: python examples/agents/langgraph_charge.py (needs the langgraph extra: pip install -e ".[langgraph]")

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
from typing import Any

from _shop import GUARD, ORDER, charge_order, settle, show
from langchain_core.messages import AIMessage, HumanMessage, ToolMessage
from langgraph.graph import END, START, MessagesState, StateGraph
from langgraph.prebuilt import ToolNode

from dataoad.integrations.langgraph import guarded_tool


def agent(state: MessagesState) -> dict[str, Any]:
    """Stands in for an LLM: calls the tool, calls it again, then answers."""
    returns = [str(m.content) for m in state["messages"] if isinstance(m, ToolMessage)]
    if len(returns) < 2:
        call = {"name": "charge_order", "args": dict(ORDER), "id": f"call_{len(returns)}"}
        return {"messages": [AIMessage(content="", tool_calls=[call])]}
    for n, text in enumerate(returns, start=1):
        show(f"tool result {n}", text)
    return {"messages": [AIMessage("I could not confirm the charge yet; it is being checked.")]}


def route(state: MessagesState) -> str:
    return "tools" if getattr(state["messages"][-1], "tool_calls", None) else END


async def main() -> None:
    graph = StateGraph(MessagesState)
    graph.add_node("agent", agent)
    graph.add_node("tools", ToolNode([guarded_tool(charge_order, GUARD)]))
    graph.add_edge(START, "agent")
    graph.add_conditional_edges("agent", route, ["tools", END])
    graph.add_edge("tools", "agent")
    final = await graph.compile().ainvoke({"messages": [HumanMessage("Charge order-7")]})
    print(f"agent: {final['messages'][-1].content}")
    await settle()


if __name__ == "__main__":
    asyncio.run(main())
