"""LangGraph: a checkout graph with the SQLite checkpointer; its charge node is guarded.

Run: python -m examples.engines.langgraph_checkout (needs the langgraph extra and langgraph-checkpoint-sqlite)

The charge commits at the provider and then the node fails (the process
could as well have died there). LangGraph resumes the thread from its last
checkpoint and runs the node again from its start: with the default key
(the thread and the task) the second run finds the receipt and does not
charge again. Works the same under ``invoke`` and ``ainvoke``.

Expected output:

    first run: the node failed after the charge (ConnectionError)
    resumed: CONFIRMED, replayed, key langgraph:checkout-order-1:1:__pregel_pull/charge
    charges at the provider: 1
"""

from __future__ import annotations

import asyncio
import sqlite3
from typing import Any, TypedDict

from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.sqlite import SqliteSaver
from langgraph.graph import END, START, StateGraph

from dataoad.integrations.langgraph import guarded_node
from examples.engines._shop import ORDER, PaymentAdapter, Shop

__all__ = ["PaymentAdapter", "main"]


class Order(TypedDict, total=False):
    order: str
    charge: dict[str, Any]


def main() -> None:
    shop = Shop()
    charge = guarded_node(
        lambda state: shop.adapter.perform(ORDER, state["order"]),
        runner=shop.runner,
        action_name="charge_customer",
        request=lambda state: ORDER,
        provider_reference=lambda state: state["order"],
        verifier=shop.adapter.verify,
        output_key="charge",
    )
    failures = [ConnectionError("the confirmation e-mail failed after the charge")]

    def charge_then_confirm(state: Order) -> Any:
        update = charge.invoke(state)
        if failures:
            raise failures.pop()
        return update

    graph = StateGraph(Order)
    graph.add_node("charge", charge_then_confirm)
    graph.add_edge(START, "charge")
    graph.add_edge("charge", END)
    checkpoints = sqlite3.connect(shop.folder / "checkpoints.sqlite", check_same_thread=False)
    app = graph.compile(checkpointer=SqliteSaver(checkpoints))
    thread: RunnableConfig = {"configurable": {"thread_id": "checkout-order-1"}}
    try:
        app.invoke({"order": "order-1"}, thread)
    except ConnectionError as exc:
        print(f"first run: the node failed after the charge ({type(exc).__name__})")
    final = app.invoke(None, thread)  # resume from the last checkpoint
    (receipt,) = asyncio.run(shop.ledger.receipts())
    state = "replayed" if final["charge"]["replayed"] else "ran again"
    print(f"resumed: {final['charge']['status']}, {state}, key {receipt.idempotency_key}")
    print(f"charges at the provider: {shop.charges('order-1')}")
    checkpoints.close()
    asyncio.run(shop.ledger.close())


if __name__ == "__main__":
    main()
