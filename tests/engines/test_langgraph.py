"""LangGraph (the real ``langgraph`` and ``langgraph-checkpoint-sqlite``): guarded nodes and
tools under ``invoke``/``stream`` and ``ainvoke``/``astream``, the default key from the
thread and the task, and a worker killed at every point then resumed from its checkpoint."""

from __future__ import annotations

import asyncio
import functools
import re
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any, TypedDict

import pytest
from langchain_core.messages import AIMessage, HumanMessage, ToolMessage
from langchain_core.tools import InjectedToolCallId
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.graph import END, START, MessagesState, StateGraph
from langgraph.prebuilt import ToolNode, ToolRuntime

from dataoad import (
    ActionRunner,
    ActionStatus,
    DataoadError,
    GuardedTool,
    InMemoryLedger,
    InvalidArgumentError,
    InvalidRequestError,
    LedgerClosedError,
    NothingInvokedError,
    NotInStepError,
    SQLiteLedger,
    SyncActionRunner,
    UnresolvedActionError,
    intent_key,
)
from dataoad.integrations.langgraph import guarded_node, guarded_tool, task_key
from tests.engines.crash_harness import crash_scenarios, run_crash
from tests.engines.ledger_view import stored_receipts

WORKER = "tests.engines.langgraph_worker"


class Order(TypedDict, total=False):
    order_id: str
    charge: dict[str, Any]


def order_graph(node: Any) -> Any:
    graph = StateGraph(Order)
    graph.add_node("charge", node)
    graph.add_edge(START, "charge")
    graph.add_edge("charge", END)
    return graph


def charge_node(ledger: InMemoryLedger, calls: list[str], *, asynchronous: bool) -> Any:
    if asynchronous:

        async def operation(state: Order) -> str:
            calls.append(state["order_id"])
            return f"ch-{state['order_id']}"

    else:

        def operation(state: Order) -> str:  # type: ignore[misc]
            calls.append(state["order_id"])
            return f"ch-{state['order_id']}"

    return guarded_node(
        operation,
        runner=ActionRunner(ledger),
        action_name="charge",
        request=lambda state: {"order": state["order_id"]},
        output_key="charge",
    )


def run_graph(app: Any, given: Any, config: Any, how: str) -> dict[str, Any]:
    if how == "invoke":
        return app.invoke(given, config)  # type: ignore[no-any-return]
    if how == "ainvoke":
        return asyncio.run(app.ainvoke(given, config))
    if how == "stream":
        return list(app.stream(given, config, stream_mode="values"))[-1]  # type: ignore[no-any-return]

    async def astream() -> Any:
        return [chunk async for chunk in app.astream(given, config, stream_mode="values")][-1]

    return asyncio.run(astream())


def flaky_after(node: Any, *, asynchronous: bool) -> Any:
    """A node that runs ``node`` and then fails once, so LangGraph re-runs the whole task."""
    failures = [ConnectionError("the confirmation e-mail failed after the charge")]
    if asynchronous:

        async def task(state: Order) -> Any:
            update = await node(state)
            if failures:
                raise failures.pop()
            return update

        return task

    def sync_task(state: Order) -> Any:
        update = node.invoke(state)
        if failures:
            raise failures.pop()
        return update

    return sync_task


@pytest.mark.parametrize("how", ["invoke", "ainvoke", "stream", "astream"])
@pytest.mark.parametrize("asynchronous", [False, True], ids=["sync-fn", "async-fn"])
def test_a_node_runs_every_way_and_its_task_rerun_on_resume_replays(
    how: str, asynchronous: bool
) -> None:
    ledger = InMemoryLedger()
    calls: list[str] = []
    node = charge_node(ledger, calls, asynchronous=asynchronous)
    task = flaky_after(node, asynchronous=how in ("ainvoke", "astream"))
    app = order_graph(task).compile(checkpointer=InMemorySaver())
    config = {"configurable": {"thread_id": "t-1"}}
    with pytest.raises(ConnectionError):
        run_graph(app, {"order_id": "o1"}, config, how)
    # Resume: LangGraph runs the failed task again from its start.
    final = run_graph(app, None, config, how)
    assert final["charge"]["status"] == "CONFIRMED"
    assert final["charge"]["replayed"] is True
    assert calls == ["o1"]
    (receipt,) = ledger.snapshot()
    assert receipt.idempotency_key == "langgraph:t-1:1:__pregel_pull/charge"
    # Another thread is another run: its own key.
    fresh = order_graph(node).compile(checkpointer=InMemorySaver())
    run_graph(fresh, {"order_id": "o1"}, {"configurable": {"thread_id": "t-2"}}, how)
    assert calls == ["o1", "o1"]


@pytest.mark.parametrize("how", ["invoke", "ainvoke"])
@pytest.mark.parametrize("asynchronous", [False, True], ids=["sync-fn", "async-fn"])
def test_a_tool_runs_under_invoke_and_ainvoke_and_a_repeated_intent_replays(
    how: str, asynchronous: bool
) -> None:
    ledger = InMemoryLedger()
    charged: list[str] = []

    if asynchronous:

        async def charge_order(order_id: str) -> str:
            """Charge an order."""
            charged.append(order_id)
            return f"ch-{order_id}"

    else:

        def charge_order(order_id: str) -> str:  # type: ignore[misc]
            """Charge an order."""
            charged.append(order_id)
            return f"ch-{order_id}"

    guard = GuardedTool(
        ActionRunner(ledger), "charge_order", None, request=lambda order_id: {"order": order_id}
    )
    tool = guarded_tool(charge_order, guard)
    turns: list[int] = []

    def agent(state: MessagesState) -> dict[str, Any]:
        turns.append(1)
        if len(turns) <= 2:  # the model asks again in a later turn, with a new call id
            call = {"name": "charge_order", "args": {"order_id": "o7"}, "id": f"call_{len(turns)}"}
            return {"messages": [AIMessage(content="", tool_calls=[call])]}
        return {"messages": [AIMessage(content="done")]}

    graph = StateGraph(MessagesState)
    graph.add_node("agent", agent)
    graph.add_node("tools", ToolNode([tool]))
    graph.add_edge(START, "agent")
    graph.add_conditional_edges(
        "agent", lambda s: "tools" if s["messages"][-1].tool_calls else END, ["tools", END]
    )
    graph.add_edge("tools", "agent")
    app = graph.compile(checkpointer=InMemorySaver())
    final = run_graph(
        app, {"messages": [HumanMessage("charge o7")]}, {"configurable": {"thread_id": "t"}}, how
    )
    replies = [str(m.content) for m in final["messages"] if isinstance(m, ToolMessage)]
    assert charged == ["o7"]
    assert replies[0].startswith("CONFIRMED: charge_order happened")
    assert "already happened earlier" in replies[1]
    (receipt,) = ledger.snapshot()
    assert receipt.idempotency_key == intent_key("langgraph:t", "charge_order", {"order": "o7"})


def test_no_checkpointer_means_no_default_key_and_nothing_happens() -> None:
    ledger = InMemoryLedger()
    calls: list[str] = []
    app = order_graph(charge_node(ledger, calls, asynchronous=False)).compile()
    with pytest.raises(NotInStepError, match="no thread_id"):
        app.invoke({"order_id": "o1"})
    # A thread id without a checkpointer: every invoke starts at the first step
    # again, so a second, separate order on the thread would have taken the
    # first one's key and replayed its receipt, charging nothing.
    for _ in range(2):
        with pytest.raises(NotInStepError, match="no checkpointer"):
            app.invoke({"order_id": "o1"}, {"configurable": {"thread_id": "t"}})
    assert calls == []
    assert ledger.snapshot() == []


def test_a_run_from_a_named_checkpoint_gets_no_default_key() -> None:
    """Time travel (a config naming a checkpoint, such as ``get_state(config).config``)
    forks first, so the node re-runs a step later: its default key would be new and an
    UNKNOWN charge made again. Refused, before anything is recorded."""
    ledger = InMemoryLedger()
    calls: list[str] = []
    lost = [TimeoutError("no answer")]

    def charge(state: Order) -> str:
        calls.append(state["order_id"])
        if lost:
            raise lost.pop()  # the provider committed; its answer was lost
        return "ch"

    node = guarded_node(
        charge,
        runner=ActionRunner(ledger),
        action_name="charge",
        request=lambda state: {"order": state["order_id"]},
    )
    graph = StateGraph(Order)
    graph.add_node("prep", lambda state: {})
    graph.add_node("charge", node)
    graph.add_edge(START, "prep")
    graph.add_edge("prep", "charge")
    graph.add_edge("charge", END)
    app = graph.compile(checkpointer=InMemorySaver())
    thread: Any = {"configurable": {"thread_id": "t"}}
    with pytest.raises(UnresolvedActionError):
        app.invoke(Order(order_id="o1"), thread)
    with pytest.raises(NotInStepError, match="started from a named checkpoint"):
        app.invoke(None, app.get_state(thread).config)
    assert calls == ["o1"]
    (receipt,) = ledger.snapshot()
    assert receipt.final_status is ActionStatus.UNKNOWN


def in_a_subgraph(inner: Any) -> Any:
    """``inner`` as the one node ("inner") of a checkpointed outer graph."""
    outer = StateGraph(Order)
    outer.add_node("inner", inner)
    outer.add_edge(START, "inner")
    outer.add_edge("inner", END)
    return outer.compile(checkpointer=InMemorySaver())


def test_inside_a_subgraph_the_default_key_is_refused() -> None:
    ledger = InMemoryLedger()
    calls: list[str] = []
    inner = order_graph(charge_node(ledger, calls, asynchronous=False)).compile()
    app = in_a_subgraph(inner)
    with pytest.raises(NotInStepError, match="subgraph"):
        app.invoke({"order_id": "o1"}, {"configurable": {"thread_id": "t"}})
    assert calls == []
    assert ledger.snapshot() == []


def test_outside_a_graph_there_is_no_task_key() -> None:
    with pytest.raises(NotInStepError, match="no LangGraph task"):
        task_key()


@pytest.mark.parametrize(
    "metadata",
    [{"langgraph_step": 1}, {"langgraph_path": ["__pregel_pull", "charge"]}, {}],
    ids=["no path", "no step", "neither"],
)
def test_a_task_without_its_step_or_its_path_has_no_task_key(metadata: dict[str, Any]) -> None:
    # What LangGraph gives every task; a run that lacked either (another
    # runtime, a later LangGraph) must not get a key missing half its place.
    from langchain_core.runnables.config import var_child_runnable_config

    token = var_child_runnable_config.set(
        {
            "configurable": {"thread_id": "t", "__pregel_checkpointer": InMemorySaver()},
            "metadata": metadata,
        }
    )
    try:
        with pytest.raises(NotInStepError) as info:
            task_key()
    finally:
        var_child_runnable_config.reset(token)
    assert str(info.value) == "LangGraph gave this task no step and path; pass idempotency_key"


def test_a_sync_call_from_inside_an_event_loop_is_refused() -> None:
    ledger = InMemoryLedger()
    node = charge_node(ledger, [], asynchronous=False)

    async def inside_a_loop() -> None:
        node.invoke({"order_id": "o1"})

    with pytest.raises(DataoadError, match="block that loop"):
        asyncio.run(inside_a_loop())
    assert ledger.snapshot() == []


@pytest.mark.parametrize("adapter", ["pydantic_ai", "openai_agents", "mcp"])
def test_frameworks_that_derive_no_key_refuse_a_guard_without_one(adapter: str) -> None:
    guard = GuardedTool(ActionRunner(InMemoryLedger()), "charge", None, request=dict)

    def charge() -> str:
        return "ch"

    with pytest.raises(InvalidArgumentError, match="need an idempotency_key"):
        build_adapter(adapter, charge, guard)


def build_adapter(adapter: str, fn: Callable[..., Any], guard: GuardedTool) -> None:
    """Build ``fn`` as a tool of ``adapter`` with ``guard``."""
    if adapter == "pydantic_ai":
        from dataoad.integrations.pydantic_ai import guarded_tool as pydantic_tool

        pydantic_tool(fn, guard)
    elif adapter == "openai_agents":
        from dataoad.integrations.openai_agents import guarded_function_tool

        guarded_function_tool(fn, guard)
    else:
        from mcp.server.mcpserver import MCPServer

        from dataoad.integrations.mcp import add_guarded_tool

        add_guarded_tool(MCPServer("billing"), fn, guard)


def check_guarded(run: Any, ledger: Path, *, verifier: bool) -> None:
    assert run.killed, f"the worker never reached {run.point}"
    assert len(run.charges) <= 1, f"charged {len(run.charges)} times: {run.charges}"
    (receipt,) = stored_receipts(ledger)
    assert receipt.idempotency_key == "langgraph:checkout-1:2:__pregel_pull/charge"
    assert not receipt.is_pending
    assert receipt.final_status is not None
    status = receipt.final_status.value
    if verifier or run.point in ("before_claim", "after_outcome"):
        assert run.outcome["outcome"] == status == "CONFIRMED"
        assert run.outcome["confirmed"] is True
        assert len(run.charges) == 1
    else:
        assert run.outcome == {"outcome": "unresolved", "receipt": "UNKNOWN"}
        assert status == "UNKNOWN"


@pytest.mark.parametrize(
    ("point", "verifier", "asynchronous"),
    [
        pytest.param(
            p,
            v,
            a,
            marks=[] if (p, v, a) == ("after_commit", True, False) else [pytest.mark.slow],
            id=f"{p}-{'verifier' if v else 'no-verifier'}-{'ainvoke' if a else 'invoke'}",
        )
        for p, v in crash_scenarios()
        for a in (False, True)
    ],
)
def test_worker_killed_then_resumed_from_the_sqlite_checkpoint(
    tmp_path: Path, point: str, verifier: bool, asynchronous: bool
) -> None:
    run = run_crash(
        WORKER,
        tmp_path,
        point,
        mode="guarded",
        verifier=verifier,
        checkpoints=str(tmp_path / "checkpoints.sqlite"),
        **{"async": asynchronous},
    )
    check_guarded(run, tmp_path / "ledger.sqlite3", verifier=verifier)


@pytest.mark.slow
@pytest.mark.parametrize("verifier", [True, False])
def test_a_checkpoint_lost_in_the_crash_leaves_the_key_unchanged(
    tmp_path: Path, verifier: bool
) -> None:
    """With durability="exit" the killed run wrote no checkpoint: the recovery sends the
    order again, and the charge runs as a task with a new id, at the same step and path."""
    run = run_crash(
        WORKER,
        tmp_path,
        "after_commit",
        mode="guarded",
        verifier=verifier,
        checkpoints=str(tmp_path / "checkpoints.sqlite"),
        durability="exit",
    )
    check_guarded(run, tmp_path / "ledger.sqlite3", verifier=verifier)


@pytest.mark.parametrize("asynchronous", [False, True], ids=["invoke", "ainvoke"])
def test_without_dataoad_langgraph_charges_twice(
    tmp_path: Path, asynchronous: bool, record_property: Callable[[str, object], None]
) -> None:
    run = run_crash(
        WORKER,
        tmp_path,
        "after_commit",
        mode="plain",
        verifier=False,
        checkpoints=str(tmp_path / "checkpoints.sqlite"),
        **{"async": asynchronous},
    )
    assert run.killed
    assert len(run.charges) == 2, run.charges
    record_property(
        "without_dataoad",
        f"LangGraph ({'ainvoke' if asynchronous else 'invoke'}), plain node, killed after the "
        f"provider committed, resumed from its SQLite checkpoint: {len(run.charges)} charges",
    )


def _call_id_tools() -> dict[str, tuple[Callable[..., str], GuardedTool, str]]:
    """Three ways a tool's key or request takes the model's call id, each refused."""

    def injected(order_id: str, tool_call_id: Annotated[str, InjectedToolCallId]) -> str:
        """Charge an order."""
        return "ch"

    def with_runtime(order_id: str, runtime: ToolRuntime) -> str:
        """Charge an order."""
        return "ch"

    def guard(key: Callable[..., str] | None, request: Callable[..., Any]) -> GuardedTool:
        return GuardedTool(ActionRunner(InMemoryLedger()), "charge_order", key, request=request)

    return {
        "key from the injected id": (
            injected,
            guard(lambda order_id, tool_call_id: f"c-{tool_call_id}", lambda order_id, **_: {}),
            "idempotency key contains the model's tool-call id",
        ),
        # The default key hashes the request: one holding the id is new every time.
        "request holding the injected id": (
            injected,
            guard(None, lambda order_id, tool_call_id: {"call": tool_call_id}),
            "request contains the model's tool-call id",
        ),
        "key from a ToolRuntime": (
            with_runtime,
            guard(lambda order_id, runtime: f"{order_id}:{runtime.tool_call_id}", lambda **_: {}),
            "idempotency key contains the model's tool-call id (runtime.tool_call_id)",
        ),
    }


@pytest.mark.parametrize(
    "way", ["key from the injected id", "request holding the injected id", "key from a ToolRuntime"]
)
def test_a_tool_key_drawn_from_the_model_s_call_id_is_refused_before_anything(way: str) -> None:
    fn, guard, says = _call_id_tools()[way]
    charged: list[str] = []

    def charging(*args: Any, **kwargs: Any) -> str:
        charged.append("o7")
        return fn(*args, **kwargs)

    functools.update_wrapper(charging, fn)
    call = {"name": fn.__name__, "args": {"order_id": "o7"}, "id": "call_Zk3pQ9xY"}
    graph = StateGraph(MessagesState)
    graph.add_node("agent", lambda state: {"messages": [AIMessage("", tool_calls=[call])]})
    graph.add_node("tools", ToolNode([guarded_tool(charging, guard, name=fn.__name__)]))
    graph.add_edge(START, "agent")
    graph.add_edge("agent", "tools")
    graph.add_edge("tools", END)
    app = graph.compile(checkpointer=InMemorySaver())
    with pytest.raises(InvalidArgumentError, match=re.escape(says)):
        app.invoke({"messages": [HumanMessage("charge o7")]}, {"configurable": {"thread_id": "t"}})
    assert charged == []
    assert guard.runner.ledger.snapshot() == []  # type: ignore[attr-defined]


def test_a_node_key_drawn_from_the_task_id_is_refused_before_anything() -> None:
    from langgraph.config import get_config

    ledger = InMemoryLedger()
    calls: list[str] = []

    def from_the_task(state: Order) -> str:
        return str(get_config()["metadata"]["langgraph_checkpoint_ns"])

    node = keyed_node(ledger, calls, from_the_task)
    app = order_graph(node).compile(checkpointer=InMemorySaver())
    with pytest.raises(InvalidArgumentError, match="task id"):
        app.invoke({"order_id": "o1"}, {"configurable": {"thread_id": "t"}})
    assert calls == []
    assert ledger.snapshot() == []
    # A key from the business intent is taken.
    fine = keyed_node(ledger, calls, lambda state: f"order-{state['order_id']}")
    order_graph(fine).compile().invoke({"order_id": "o1"})
    assert calls == ["o1"]


@pytest.mark.parametrize("key", [42, None, b"o1"], ids=["int", "None", "bytes"])
def test_a_node_key_that_is_not_text_is_refused_with_a_typed_error(key: object) -> None:
    ledger = InMemoryLedger()
    calls: list[str] = []
    node = keyed_node(ledger, calls, lambda state: key)  # type: ignore[arg-type,return-value]
    app = order_graph(node).compile(checkpointer=InMemorySaver())
    with pytest.raises(InvalidArgumentError, match="idempotency_key must be a str"):
        app.invoke({"order_id": "o1"}, {"configurable": {"thread_id": "t"}})
    assert calls == []
    assert ledger.snapshot() == []


def test_a_node_key_drawn_from_its_checkpoint_is_refused_before_anything() -> None:
    # The checkpoint a task runs from is kept when the task is resumed after a
    # failure, but is new when a lost checkpoint is re-run (durability="async")
    # or the thread is replayed from an earlier one: a key holding it acts twice.
    from langgraph.config import get_config

    ledger = InMemoryLedger()
    calls: list[str] = []

    def from_the_checkpoint(state: Order) -> str:
        checkpoints = get_config()["configurable"]["checkpoint_map"]
        return f"order-{state['order_id']}-{checkpoints['']}"

    node = keyed_node(ledger, calls, from_the_checkpoint)
    app = order_graph(node).compile(checkpointer=InMemorySaver())
    with pytest.raises(InvalidArgumentError, match="the checkpoint id of the graph"):
        app.invoke({"order_id": "o1"}, {"configurable": {"thread_id": "t"}})
    assert calls == []
    assert ledger.snapshot() == []


def test_a_key_drawn_from_a_subgraph_task_s_own_id_is_refused_before_anything() -> None:
    from langgraph.config import get_config

    ledger = InMemoryLedger()
    calls: list[str] = []

    def from_the_inner_task(state: Order) -> str:
        # "inner:<the outer task's id>|charge:<this task's id>"
        namespace = str(get_config()["metadata"]["langgraph_checkpoint_ns"])
        return f"order-{state['order_id']}-{namespace.rpartition(':')[2]}"

    inner = order_graph(keyed_node(ledger, calls, from_the_inner_task)).compile()
    app = in_a_subgraph(inner)
    with pytest.raises(InvalidArgumentError, match="task id"):
        app.invoke({"order_id": "o1"}, {"configurable": {"thread_id": "t"}})
    assert calls == []
    assert ledger.snapshot() == []


@pytest.mark.parametrize("how", ["invoke", "ainvoke"])
def test_a_node_key_drawn_from_the_attempt_number_is_refused_before_anything(how: str) -> None:
    from langgraph.runtime import get_runtime

    ledger = InMemoryLedger()
    calls: list[str] = []

    def from_the_attempt(state: Order) -> str:
        info = get_runtime().execution_info
        assert info is not None
        return f"order-{state['order_id']}-try-{info.node_attempt}"

    node = keyed_node(ledger, calls, from_the_attempt)
    app = order_graph(node).compile(checkpointer=InMemorySaver())
    with pytest.raises(InvalidArgumentError, match="attempt number"):
        run_graph(app, {"order_id": "o1"}, {"configurable": {"thread_id": "t"}}, how)
    assert calls == []
    assert ledger.snapshot() == []


def test_a_key_drawn_at_random_is_refused_before_anything() -> None:
    import uuid

    ledger = InMemoryLedger()
    calls: list[str] = []
    node = keyed_node(ledger, calls, lambda state: f"order-{uuid.uuid4().hex}")
    with pytest.raises(InvalidArgumentError, match="changed between two derivations"):
        order_graph(node).compile().invoke({"order_id": "o1"})
    assert calls == []
    assert ledger.snapshot() == []


def keyed_node(ledger: InMemoryLedger, calls: list[str], key: Callable[[Order], str]) -> Any:
    """A node that records the order it charges, under the caller's ``key``."""
    return guarded_node(
        lambda state: calls.append(state["order_id"]),
        runner=ActionRunner(ledger),
        action_name="charge",
        request=lambda state: {"order": state["order_id"]},
        idempotency_key=key,
    )


@pytest.mark.parametrize("how", ["invoke", "ainvoke"])
def test_a_node_on_a_sync_action_runner_runs_both_ways_and_replays(how: str) -> None:
    runner = SyncActionRunner(InMemoryLedger())
    calls: list[str] = []

    def charge(state: Order) -> str:
        calls.append(state["order_id"])
        return "ch"

    try:
        node = guarded_node(
            charge,
            runner=runner,
            action_name="charge",
            request=lambda state: {"order": state["order_id"]},
            output_key="charge",
        )
        task = flaky_after(node, asynchronous=how == "ainvoke")
        app = order_graph(task).compile(checkpointer=InMemorySaver())
        config = {"configurable": {"thread_id": "t"}}
        with pytest.raises(ConnectionError):
            run_graph(app, {"order_id": "o1"}, config, how)
        final = run_graph(app, None, config, how)
        assert final["charge"]["replayed"] is True
        assert calls == ["o1"]
    finally:
        runner.close()


@pytest.mark.parametrize("how", ["invoke", "ainvoke"])
def test_a_node_refuses_a_request_that_is_not_json_and_a_closed_ledger_first(
    how: str, tmp_path: Path
) -> None:
    ledger = InMemoryLedger()
    calls: list[str] = []
    nan = guarded_node(
        lambda state: calls.append("nan"),
        runner=ActionRunner(ledger),
        action_name="charge",
        request=lambda state: {"amount": float("nan")},
    )
    config = {"configurable": {"thread_id": "t"}}
    with pytest.raises(InvalidRequestError):
        run_graph(
            order_graph(nan).compile(checkpointer=InMemorySaver()), {"order_id": "o1"}, config, how
        )
    closed = SQLiteLedger(tmp_path / "ledger.sqlite3")
    runner = ActionRunner(closed)
    asyncio.run(closed.close())
    shut = guarded_node(
        lambda state: calls.append("closed"),
        runner=runner,
        action_name="charge",
        request=lambda state: {"order": state["order_id"]},
    )
    with pytest.raises(NothingInvokedError) as info:
        run_graph(
            order_graph(shut).compile(checkpointer=InMemorySaver()), {"order_id": "o1"}, config, how
        )
    assert isinstance(info.value.__cause__, LedgerClosedError)
    assert calls == []
    assert ledger.snapshot() == []
