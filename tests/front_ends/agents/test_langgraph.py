"""LangGraph without an LLM: a scripted agent node, a ToolNode, interrupts and retries."""

from __future__ import annotations

import asyncio
import inspect
from typing import Any, TypedDict

import pytest

from suite_support.agents import framework

framework("langgraph", "langgraph")

from langchain_core.messages import AIMessage, HumanMessage, ToolMessage
from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.graph import END, START, MessagesState, StateGraph
from langgraph.prebuilt import ToolNode
from langgraph.types import Command, RetryPolicy, interrupt

from dataoad import UnresolvedActionError
from dataoad.integrations.langgraph import guarded_node, guarded_tool
from suite_support.agents import ARGS, ChargeScenario


def test_retried_tool_call_replays_and_the_model_reads_unknown() -> None:
    scenario = ChargeScenario()
    tool = guarded_tool(scenario.charge_order, scenario.guard())
    seen: list[list[str]] = []

    def agent(state: MessagesState) -> dict[str, Any]:
        returns = [str(m.content) for m in state["messages"] if isinstance(m, ToolMessage)]
        seen.append(returns)
        if len(returns) < 2:
            call = {"name": "charge_order", "args": dict(ARGS), "id": f"call_{len(seen)}"}
            return {"messages": [AIMessage(content="", tool_calls=[call])]}
        return {"messages": [AIMessage(content="The charge is being checked.")]}

    def route(state: MessagesState) -> str:
        last = state["messages"][-1]
        return "tools" if getattr(last, "tool_calls", None) else END

    graph = StateGraph(MessagesState)
    graph.add_node("agent", agent)
    graph.add_node("tools", ToolNode([tool]))
    graph.add_edge(START, "agent")
    graph.add_conditional_edges("agent", route, ["tools", END])
    graph.add_edge("tools", "agent")
    final = asyncio.run(
        graph.compile().ainvoke({"messages": [HumanMessage("Charge order-7 for 25 EUR")]})
    )

    assert len(scenario.provider.charges) == 1, "the retried call charged again"
    first, second = seen[1][0], seen[2][1]
    assert first.startswith("UNKNOWN: charge_order may have happened")
    assert second.startswith("UNKNOWN:")
    assert final["messages"][-1].content == "The charge is being checked."
    assert asyncio.run(scenario.settle_later(first)) == "CONFIRMED"
    assert len(scenario.provider.charges) == 1


class OrderState(TypedDict, total=False):
    order_id: str
    amount_cents: int
    charge: dict[str, Any]
    approved: bool


def charge_node(scenario: ChargeScenario) -> Any:
    return guarded_node(
        lambda state: scenario.charge_order(state["order_id"], state["amount_cents"]),
        runner=scenario.runner,
        action_name="charge_order",
        idempotency_key=lambda state: state["order_id"],
        request=lambda state: {"order_id": state["order_id"], "amount": state["amount_cents"]},
        provider_reference=lambda state: state["order_id"],
        verifier=scenario.verifier,
        output_key="charge",
    )


def test_a_node_rerun_after_interrupt_and_resume_replays() -> None:
    scenario = ChargeScenario(lookup_down=0)  # the lost answer is found: CONFIRMED
    charge = charge_node(scenario)

    async def charge_then_ask(state: OrderState) -> dict[str, Any]:
        update = await charge(state)
        # LangGraph resumes by running this whole node again from the top.
        approved = interrupt({"question": "send the receipt?", **update["charge"]})
        return {**update, "approved": approved}

    graph = StateGraph(OrderState)
    graph.add_node("charge", charge_then_ask)
    graph.add_edge(START, "charge")
    graph.add_edge("charge", END)
    app = graph.compile(checkpointer=InMemorySaver())
    config: RunnableConfig = {"configurable": {"thread_id": "order-7"}}

    async def run() -> dict[str, Any]:
        await app.ainvoke({"order_id": "order-7", "amount_cents": 2500}, config)
        resumed: dict[str, Any] = await app.ainvoke(Command(resume=True), config)
        return resumed

    final = asyncio.run(run())
    assert scenario.provider.charge_calls == 1
    assert len(scenario.provider.charges) == 1
    assert final["approved"] is True
    assert final["charge"]["replayed"] is True
    assert final["charge"]["status"] == "CONFIRMED"


def test_an_unknown_node_raises_and_its_rerun_raises_again_without_charging() -> None:
    scenario = ChargeScenario()
    charge = charge_node(scenario)
    graph = StateGraph(OrderState)
    graph.add_node("charge", charge)
    graph.add_edge(START, "charge")
    graph.add_edge("charge", END)
    app = graph.compile(checkpointer=InMemorySaver())
    config: RunnableConfig = {"configurable": {"thread_id": "order-7"}}
    errors = []
    inputs: tuple[OrderState | None, ...] = ({"order_id": "order-7", "amount_cents": 2500}, None)
    # The second call resumes: LangGraph runs the failed node again.
    for given in inputs:
        with pytest.raises(UnresolvedActionError) as info:
            app.invoke(given, config)
        errors.append(info.value)
    assert scenario.provider.charge_calls == 1
    assert errors[0].receipt is not None
    assert errors[0].action_id == errors[1].action_id
    assert errors[0].receipt.final_status is not None
    assert errors[0].receipt.final_status.value == "UNKNOWN"


def test_a_node_rerun_by_retry_policy_replays() -> None:
    scenario = ChargeScenario(lookup_down=0)
    charge = charge_node(scenario)
    runs = 0

    async def charge_then_flaky(state: OrderState) -> dict[str, Any]:
        nonlocal runs
        runs += 1
        update: dict[str, Any] = await charge(state)
        if runs == 1:
            raise ConnectionError("the notification service blinked after the charge")
        return update

    graph = StateGraph(OrderState)
    graph.add_node(
        "charge",
        charge_then_flaky,
        retry_policy=RetryPolicy(max_attempts=3, initial_interval=0.01, jitter=False),
    )
    graph.add_edge(START, "charge")
    graph.add_edge("charge", END)
    final = asyncio.run(graph.compile().ainvoke({"order_id": "order-7", "amount_cents": 2500}))
    assert runs == 2
    assert scenario.provider.charge_calls == 1
    assert final["charge"]["replayed"] is True
    assert final["charge"]["status"] == "CONFIRMED"


def test_a_guarded_tool_is_named_described_and_awaited_as_given() -> None:
    scenario = ChargeScenario()

    async def undocumented(order_id: str, amount_cents: int) -> str:
        return order_id

    default = guarded_tool(scenario.charge_order, scenario.guard())
    named = guarded_tool(scenario.charge_order, scenario.guard(), name="charge")
    bare = guarded_tool(undocumented, scenario.guard())
    # The model sees the function's name and docstring unless told otherwise.
    assert (default.name, default.description) == (
        "charge_order",
        "Charge the customer of an order.",
    )
    assert named.name == "charge"
    assert bare.description == "undocumented"
    # Under ainvoke the tool is awaited on the graph's loop, not run on a thread.
    assert asyncio.iscoroutinefunction(default.coroutine)
    # Called without a loop (invoke), it takes the function's own parameters.
    assert default.func is not None
    assert list(inspect.signature(default.func).parameters) == ["order_id", "amount_cents"]
