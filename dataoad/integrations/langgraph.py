"""LangGraph: a guarded tool for ``ToolNode`` and a guarded node. Needs ``dataoad[langgraph]``.

LangGraph runs a node again from its start: when a run is resumed from a
checkpoint (after an interrupt, or after the process died), and under a
node ``RetryPolicy``. A side effect inside the node would repeat. Inside
``guarded_node`` (or a ``guarded_tool`` run by ``ToolNode``) the re-run
finds the stored receipt and replays it instead of acting again.

Both work under ``invoke``/``stream`` and ``ainvoke``/``astream``, with a
sync or an async function. A sync call runs the runner on Dataoad's own
event loop thread (``_bridge``), so it never needs one of the caller's.

A node's default key is ``task_key()``: the thread and the task's place in
the run (its step and path), which LangGraph gives the task again when it
re-executes it from a checkpoint, whether or not the last checkpoint before
the crash was written (``durability="async"``, the default, may lose it; the
graph then re-runs from the one before, through the same steps). A task's
``checkpoint_ns`` id is not used: it changes when that happens. Resume with
``invoke(None, config)``: sending the input again on a thread that has a
checkpoint starts a new run, whose tasks are new. A tool's default key is
``thread_intent_key``: the request within the thread, so a model that asks
again for the same thing replays, whichever turn it asks in.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import typing
from collections.abc import Callable
from typing import Any

from dataoad._bridge import run_blocking
from dataoad._errors import InvalidArgumentError, NotInStepError, UnresolvedActionError
from dataoad._intent import intent_key
from dataoad._policy import RetryPolicy
from dataoad._result import ActionResult
from dataoad._runner import ActionRunner
from dataoad._sync import SyncActionRunner
from dataoad._tool import GuardedTool, describe_result
from dataoad._verification import AnyVerifier
from dataoad._volatile import call_ids_of, stable_key
from dataoad.integrations._common import require, tool_function, tool_signature, with_signature
from dataoad.integrations._engine import LEASE_WAIT, EngineStep, engine_key

_tools = require("langchain_core.tools", "langgraph")
_runnables = require("langchain_core.runnables", "langgraph")
_config = require("langgraph.config", "langgraph")
_runnable_config = require("langchain_core.runnables.config", "langgraph")

#: Where LangGraph keeps a task's runtime in its config.
_RUNTIME_KEY = "__pregel_runtime"
#: Where it keeps the graph's checkpointer (None when it was compiled without one).
_CHECKPOINTER_KEY = "__pregel_checkpointer"
#: Set (not None) in a run started from a named checkpoint: a replay, forked.
_REPLAY_KEY = "__pregel_replay_state"

__all__ = ["GuardedNode", "guarded_node", "guarded_tool", "task_key", "thread_intent_key"]


def _graph_config() -> tuple[str, dict[str, Any]]:
    """The running graph's thread id and the task's metadata; NotInStepError without them."""
    try:
        config = _config.get_config()
    except RuntimeError:
        config = None
    if not config:
        raise NotInStepError(
            "no LangGraph task is running: the default key comes from the graph's thread and "
            "task; call this inside a node, or pass idempotency_key. Nothing was recorded"
        )
    thread = (config.get("configurable") or {}).get("thread_id")
    if thread is None:
        raise NotInStepError(
            "this graph run has no thread_id (no checkpointer): a re-run would be a new run, so "
            "there is no stable default key; compile with a checkpointer and pass a thread_id, "
            "or pass idempotency_key. Nothing was recorded"
        )
    return str(thread), dict(config.get("metadata") or {})


def task_key() -> str:
    """The running LangGraph task's key: ``langgraph:<thread>:<step>:<path>``.

    Raises ``NotInStepError`` outside a graph run, in a graph without a
    checkpointer (no thread: a re-run is a new run), and inside a subgraph
    (whose place depends on its parent task's id): pass an explicit key there.
    """
    thread, metadata = _graph_config()
    configurable = _config.get_config().get("configurable") or {}
    if configurable.get(_CHECKPOINTER_KEY) is None:
        # Without one every invoke starts again at the first step: a second,
        # separate run on the thread would take the first run's keys and
        # replay its receipts instead of acting.
        raise NotInStepError(
            "this graph has no checkpointer: each invoke on the thread is a new run whose "
            "tasks take the same steps, so there is no stable default key; compile with a "
            "checkpointer, or pass idempotency_key. Nothing was recorded"
        )
    if configurable.get(_REPLAY_KEY) is not None:
        # Time travel: LangGraph first writes a fork, so every task of the run
        # runs a step later than it did, under another default key.
        raise NotInStepError(
            "this run started from a named checkpoint (LangGraph's time travel: a config "
            "with a checkpoint_id, such as get_state(config).config), which forks: its tasks "
            "run at new steps, so the default key would differ from the first run's and the "
            "node would act again. Resume with the thread's config only, or pass "
            "idempotency_key. Nothing was recorded"
        )
    namespace = str(metadata.get("langgraph_checkpoint_ns") or "")
    if "|" in namespace:
        raise NotInStepError(
            "inside a subgraph the task's place depends on its parent task's id, which changes "
            "when a lost checkpoint is re-run: pass idempotency_key (for example "
            "dataoad.intent_key(thread, action, request)). Nothing was recorded"
        )
    step = metadata.get("langgraph_step")
    path = metadata.get("langgraph_path")
    if step is None or not path:
        raise NotInStepError("LangGraph gave this task no step and path; pass idempotency_key")
    return engine_key("langgraph", thread, str(step), "/".join(str(p) for p in path))


def _volatile_ids() -> dict[str, object]:
    """This execution's own identifiers: a key holding one is new when the task runs again."""
    try:
        config = _config.get_config()
    except RuntimeError:
        return {}
    metadata = config.get("metadata") or {}
    configurable = config.get("configurable") or {}
    namespace = str(metadata.get("langgraph_checkpoint_ns") or "")
    volatile: dict[str, object] = {
        "task id": namespace.rpartition(":")[2] or None,
        "run id": config.get("run_id"),
        "checkpoint id": configurable.get("checkpoint_id"),
    }
    # Inside a task LangGraph gives no run id or checkpoint id, but the
    # checkpoints it runs from, by graph: kept when a failed task is resumed,
    # new when a lost checkpoint is re-run or the thread replayed from an
    # earlier one.
    for graph, checkpoint in dict(configurable.get("checkpoint_map") or {}).items():
        volatile[f"checkpoint id of {f'subgraph {graph!r}' if graph else 'the graph'}"] = checkpoint
    return volatile


def _injected_call_ids(fn: Callable[..., Any]) -> tuple[str, ...]:
    """The parameters of ``fn`` LangChain fills with the model's tool-call id."""
    try:
        hints = typing.get_type_hints(fn, include_extras=True)
    except Exception:  # an unresolvable annotation: no injected id can be found either
        return ()
    injected = _tools.InjectedToolCallId
    return tuple(
        name
        for name, hint in hints.items()
        if typing.get_origin(hint) is typing.Annotated
        and any(m is injected or isinstance(m, injected) for m in hint.__metadata__)
    )


def _as_next_attempt(derive: Callable[[], str]) -> str | None:
    """``derive()`` as LangGraph's next attempt of this task would run it (None: no way to).

    A node ``RetryPolicy`` runs the task again with ``node_attempt`` + 1 in
    its runtime; a key that reads it would change.
    """
    try:
        config = _config.get_config()
    except RuntimeError:
        return None
    configurable = config.get("configurable") or {}
    runtime: Any = configurable.get(_RUNTIME_KEY)
    info = getattr(runtime, "execution_info", None)
    if info is None or not callable(getattr(runtime, "patch_execution_info", None)):
        return None
    patched = runtime.patch_execution_info(node_attempt=info.node_attempt + 1)
    token = _runnable_config.var_child_runnable_config.set(
        {**config, "configurable": {**configurable, _RUNTIME_KEY: patched}}
    )
    try:
        return derive()
    finally:
        _runnable_config.var_child_runnable_config.reset(token)


def _checker(
    fn: Callable[..., Any] | None,
) -> Callable[[Callable[[], str], dict[str, Any], object], str]:
    """Derive a caller's key, refusing one that would differ when the task runs again."""
    call_ids = () if fn is None else _injected_call_ids(fn)

    def check(derive: Callable[[], str], arguments: dict[str, Any], request: object) -> str:
        volatile = _volatile_ids()
        for name in call_ids:
            volatile[f"model's tool-call id ({name})"] = arguments.get(name)
        volatile.update(call_ids_of(arguments))  # a ToolRuntime's tool_call_id
        key = stable_key(derive, request, volatile)
        if _as_next_attempt(derive) not in (None, key):
            raise InvalidArgumentError(
                f"the idempotency key {key!r} depends on the attempt number: LangGraph's next "
                "attempt of this task would get another key and act twice. Derive it from the "
                "business intent. Nothing was recorded or invoked"
            )
        return key

    return check


def thread_intent_key(action_name: str, request: dict[str, Any]) -> str:
    """A tool call's default key: ``intent_key("langgraph:<thread>", action, request)``.

    A model that asks again for the same thing in the same conversation (a
    new tool-call id, a later turn, a re-run after a crash) gets a replay.
    """
    thread, _ = _graph_config()
    return intent_key(engine_key("langgraph", thread), action_name, request)


def guarded_tool(fn: Callable[..., Any], guard: GuardedTool, *, name: str | None = None) -> Any:
    """A LangChain ``StructuredTool`` (for ``ToolNode``) running ``fn`` under ``guard``.

    Sync and async both: ``invoke`` and ``ainvoke`` of the graph. Without an
    ``idempotency_key`` in ``guard`` the key is ``thread_intent_key``: the
    same request in the same thread (conversation) replays.
    """
    action_name = guard.action_name

    def default_key(request: dict[str, Any]) -> str:
        return thread_intent_key(action_name, request)

    coroutine = tool_function(
        guard, fn, framework="LangGraph", default_key=default_key, check_key=_checker(fn)
    )
    signature = tool_signature(fn)
    label = name or fn.__name__

    @functools.wraps(fn)
    def sync_tool(*args: Any, **kwargs: Any) -> str:
        return run_blocking(lambda: coroutine(*args, **kwargs), caller=f"tool {label!r}")

    return _tools.StructuredTool.from_function(
        func=with_signature(sync_tool, fn, signature),
        coroutine=coroutine,
        name=label,
        description=inspect.getdoc(fn) or fn.__name__,
    )


def guarded_node(
    operation: Callable[[Any], Any],
    *,
    runner: ActionRunner | SyncActionRunner,
    action_name: str,
    request: Callable[[Any], dict[str, Any]],
    idempotency_key: Callable[[Any], str] | None = None,
    provider_reference: Callable[[Any], str | None] | None = None,
    verifier: AnyVerifier | None = None,
    policy: RetryPolicy | None = None,
    risk: str | None = None,
    metadata: dict[str, Any] | None = None,
    output_key: str = "dataoad",
    wait_in_progress: float | str | None = LEASE_WAIT,
) -> Any:
    """A graph node (a LangChain ``Runnable``) running ``operation(state)`` under ``runner``.

    ``operation`` may be sync or async; the graph may be run with ``invoke``
    or ``ainvoke`` (and their streams). The key is ``idempotency_key(state)``
    or, by default, ``task_key()``; request and reference are derived from
    the state. The node's update is ``{output_key: {"status", "message",
    "action_id", "replayed"}}`` for CONFIRMED and FAILED; an UNKNOWN outcome
    raises ``UnresolvedActionError`` with the receipt (add it to a node
    ``RetryPolicy``'s exclusions: a retry only replays it). A claim another
    run holds is waited for (``wait_in_progress``, by default long enough for
    a dead worker's lease to run out), then ``ActionInProgressError``; a
    conflict or a ledger that cannot be written raises as from ``execute``.
    Inside another node, ``await node(state)`` or ``node.invoke(state)``:
    the default key is that task's, so one such call per task, or an
    ``idempotency_key`` for each (a second call would meet the first's receipt).
    ``runner`` may be a ``SyncActionRunner`` too (it then runs on its own loop).
    """
    sync_runner = runner if isinstance(runner, SyncActionRunner) else None
    step = EngineStep(
        "LangGraph",
        runner if sync_runner is None else sync_runner.runner,
        action_name,
        request=request,
        provider_reference=provider_reference,
        verifier=verifier,
        policy=policy,
        risk=risk,
        metadata=metadata,
        wait_in_progress=wait_in_progress,
    )
    check = _checker(None)

    def arguments(state: Any) -> dict[str, Any]:
        if idempotency_key is None:
            key = task_key()
        else:
            given = idempotency_key
            key = check(lambda: given(state), {}, None)
        return step.arguments(key, operation, (state,), {})

    def update(result: ActionResult[Any]) -> dict[str, Any]:
        outcome = describe_result(result, action_name, verifier_set=verifier is not None)
        if outcome.status == "UNKNOWN":
            raise UnresolvedActionError(outcome.message, receipt=result.receipt)
        return {
            output_key: {
                "status": outcome.status,
                "message": outcome.message,
                "action_id": outcome.action_id,
                "replayed": outcome.replayed,
            }
        }

    if sync_runner is None:

        async def node(state: Any) -> dict[str, Any]:
            return update(await step.runner.execute(**arguments(state)))

        def sync_node(state: Any) -> dict[str, Any]:
            return run_blocking(lambda: node(state), caller=f"node {action_name!r}")

    else:
        # A SyncActionRunner runs on its own loop: called directly from sync
        # code, and from a worker thread under ainvoke (never blocking the loop).
        blocking = sync_runner

        def sync_node(state: Any) -> dict[str, Any]:
            return update(blocking.execute(**arguments(state)))

        async def node(state: Any) -> dict[str, Any]:
            execute_arguments = arguments(state)
            result: ActionResult[Any] = await asyncio.to_thread(
                lambda: blocking.execute(**execute_arguments)
            )
            return update(result)

    return GuardedNode(sync_node, afunc=node, name=action_name)


_RunnableLambda: Any = _runnables.RunnableLambda


class GuardedNode(_RunnableLambda):  # type: ignore[misc]
    """A node runnable both ways by LangGraph; ``await node(state)`` still works (v0.2)."""

    async def __call__(self, state: Any) -> Any:
        return await self.ainvoke(state)
