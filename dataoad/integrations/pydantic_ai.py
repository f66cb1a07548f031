"""Pydantic AI: a guarded tool. Needs the ``pydantic-ai`` extra.

Build one ``dataoad.GuardedTool`` (the runner, the action name, and the
callables that derive key, request and reference from the tool's
arguments), then ``Agent(model, tools=[guarded_tool(charge_order, guard)])``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from dataoad._tool import GuardedTool
from dataoad.integrations._common import require, tool_function

_pydantic_ai = require("pydantic_ai", "pydantic-ai")

__all__ = ["guarded_tool"]


def guarded_tool(fn: Callable[..., Any], guard: GuardedTool, *, name: str | None = None) -> Any:
    """A ``pydantic_ai.Tool`` running ``fn`` under ``guard``; the model reads the evidence message."""
    return _pydantic_ai.Tool(
        tool_function(guard, fn, framework="Pydantic AI"), takes_ctx=False, name=name
    )
