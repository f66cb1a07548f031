"""OpenAI Agents SDK: a guarded function tool. Needs ``dataoad[openai-agents]``.

Build one ``dataoad.GuardedTool``, then
``Agent(name=..., tools=[guarded_function_tool(charge_order, guard)])``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from dataoad._tool import GuardedTool
from dataoad.integrations._common import require, tool_function

_agents = require("agents", "openai-agents")

__all__ = ["guarded_function_tool"]


def guarded_function_tool(
    fn: Callable[..., Any], guard: GuardedTool, *, name: str | None = None
) -> Any:
    """A ``FunctionTool`` running ``fn`` under ``guard``; the model reads the evidence message."""
    return _agents.function_tool(
        tool_function(guard, fn, framework="OpenAI Agents"), name_override=name
    )
