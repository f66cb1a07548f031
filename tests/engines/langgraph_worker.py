"""A LangGraph worker for the crash tests: a checkout graph with the real SQLite checkpointer.

``python -m tests.engines.langgraph_worker CONFIG.json start|recover``. The
graph is ``prepare -> charge -> confirm``; ``charge`` is a ``guarded_node``
with the default key (``mode: guarded``) or a plain node (``mode: plain``).
``start`` invokes it on thread ``checkout-1`` (and may die at
``DATAOAD_CRASH_AT``); ``recover`` resumes the thread from its last
checkpoint (``invoke(None)``), as LangGraph's durable execution does (or
sends the order again when no checkpoint was written), and prints the
outcome as one JSON line. Run with ``invoke`` (sync) unless the
config says ``"async": true``.
"""

from __future__ import annotations

import asyncio
import json
import sqlite3
import sys
from pathlib import Path
from typing import Any, TypedDict

from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.sqlite import SqliteSaver
from langgraph.checkpoint.sqlite.aio import AsyncSqliteSaver
from langgraph.graph import END, START, StateGraph

from dataoad import UnresolvedActionError
from dataoad.integrations.langgraph import guarded_node
from tests.engines.checkout import Checkout


class Order(TypedDict, total=False):
    order_id: str
    cents: int
    prepared: bool
    charge: Any
    confirmed: bool


def main(config_path: str, phase: str) -> None:
    config = json.loads(Path(config_path).read_text())
    shop = Checkout(config)
    charge = shop.charge_function()
    options = shop.guard_options()

    if shop.guarded:
        charge_node: Any = guarded_node(
            lambda state: charge(state["order_id"], state["cents"]),
            runner=shop.runner,
            action_name="charge",
            request=lambda state: options["request"](state["order_id"], state["cents"]),
            provider_reference=lambda state: options["provider_reference"](
                state["order_id"], state["cents"]
            ),
            verifier=options["verifier"],
            policy=options["policy"],
            output_key="charge",
        )
    elif config.get("async"):

        async def charge_node(state: Order) -> Order:
            return {"charge": await charge(state["order_id"], state["cents"])}

    else:

        def charge_node(state: Order) -> Order:
            return {"charge": asyncio.run(charge(state["order_id"], state["cents"]))}

    graph = StateGraph(Order)
    graph.add_node("prepare", lambda state: {"prepared": True})
    graph.add_node("charge", charge_node)
    graph.add_node("confirm", lambda state: {"confirmed": True})
    graph.add_edge(START, "prepare")
    graph.add_edge("prepare", "charge")
    graph.add_edge("charge", "confirm")
    graph.add_edge("confirm", END)
    thread: RunnableConfig = {"configurable": {"thread_id": config["workflow_id"]}}
    # "async" is LangGraph's default; "exit" writes no checkpoint until the run ends.
    durability = config.get("durability", "async")
    order = {"order_id": config["order"], "cents": 1250}

    def given(saved: Any) -> Any:
        # Resume from the last checkpoint; a worker that died before the
        # first one was written left nothing to resume: the caller sends the
        # same order on the same thread again. (Sending it again on a thread
        # that has a checkpoint would start a second run, with new tasks.)
        return order if phase == "start" or saved.created_at is None else None

    async def run_async() -> Any:
        async with AsyncSqliteSaver.from_conn_string(config["checkpoints"]) as saver:
            app = graph.compile(checkpointer=saver)
            return await app.ainvoke(
                given(await app.aget_state(thread)), thread, durability=durability
            )

    try:
        if config.get("async"):
            final = asyncio.run(run_async())
        else:
            db = sqlite3.connect(config["checkpoints"], check_same_thread=False)
            try:
                app = graph.compile(checkpointer=SqliteSaver(db))
                final = app.invoke(given(app.get_state(thread)), thread, durability=durability)
            finally:
                db.close()
        charged = final["charge"]
        outcome: dict[str, Any] = (
            {"outcome": "value", "charge": charged}
            if isinstance(charged, str)
            else {"outcome": charged["status"], "replayed": charged["replayed"]}
        )
        outcome["confirmed"] = final.get("confirmed", False)
    except UnresolvedActionError as exc:
        receipt = exc.receipt
        status = None
        if receipt is not None:
            assert receipt.final_status is not None
            status = receipt.final_status.value
        outcome = {"outcome": "unresolved", "receipt": status}
    print(json.dumps(outcome), flush=True)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
