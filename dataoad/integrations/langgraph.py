"""LangGraph: a guarded tool for ``ToolNode`` and a guarded node. Needs ``dataoad[langgraph]``.

LangGraph re-runs a whole node after an interrupt is resumed, and again
under a node ``RetryPolicy``; a side effect inside the node would repeat.
Inside ``guarded_node`` (or a ``guarded_tool`` run by ``ToolNode``) the
re-run finds the stored receipt and replays it instead of acting again.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Awaitable, Callable
from typing import Any

from dataoad._policy import RetryPolicy
from dataoad._runner import ActionRunner
from dataoad._tool import GuardedTool, run_tool
from dataoad._verification import AnyVerifier
from dataoad.integrations._common import require, tool_function

_tools = require("langchain_core.tools", "langgraph")

__all__ = ["guarded_node", "guarded_tool"]


def guarded_tool(fn: Callable[..., Any], guard: GuardedTool, *, name: str | None = None) -> Any:
    """A LangChain ``StructuredTool`` (for ``ToolNode``) running ``fn`` under ``guard``."""
    tool = tool_function(guard, fn)
    return _tools.StructuredTool.from_function(
        coroutine=tool,
        name=name or fn.__name__,
        description=inspect.getdoc(fn) or fn.__name__,
    )


def guarded_node(
    operation: Callable[[Any], Any],
    *,
    runner: ActionRunner,
    action_name: str,
    idempotency_key: Callable[[Any], str],
    request: Callable[[Any], dict[str, Any]],
    provider_reference: Callable[[Any], str | None] | None = None,
    verifier: AnyVerifier | None = None,
    policy: RetryPolicy | None = None,
    output_key: str = "dataoad",
) -> Callable[[Any], Awaitable[dict[str, Any]]]:
    """A graph node running ``operation(state)`` under ``runner``.

    The key, request and reference are derived from the state by the given
    callables; the node's update is ``{output_key: {"status", "message",
    "action_id", "replayed"}}``.
    """

    async def node(state: Any) -> dict[str, Any]:
        outcome = await run_tool(
            runner,
            action_name,
            functools.partial(operation, state),
            request=request(state),
            idempotency_key=idempotency_key(state),
            provider_reference=None if provider_reference is None else provider_reference(state),
            verifier=verifier,
            policy=policy,
        )
        return {
            output_key: {
                "status": outcome.status,
                "message": outcome.message,
                "action_id": outcome.action_id,
                "replayed": outcome.replayed,
            }
        }

    node.__name__ = action_name
    return node
