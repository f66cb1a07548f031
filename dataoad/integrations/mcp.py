"""MCP: guarded tools on a server of the official Python SDK. Needs ``dataoad[mcp]``.

A client (and the model behind it) may send the same ``tools/call`` again
after a timeout; with a key derived from the business arguments, the
repeated call replays the stored receipt instead of acting again:
``add_guarded_tool(MCPServer("billing"), charge_order, guard)``.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

from dataoad._tool import GuardedTool
from dataoad.integrations._common import require, tool_function

require("mcp", "mcp")

__all__ = ["add_guarded_tool"]


def add_guarded_tool(
    server: Any, fn: Callable[..., Any], guard: GuardedTool, *, name: str | None = None
) -> None:
    """Register ``fn`` on ``server`` (``MCPServer`` or ``FastMCP``) as a guarded tool.

    The tool's result is the evidence message (CONFIRMED / FAILED / UNKNOWN
    with the action id), as text content.
    """
    if not callable(getattr(server, "add_tool", None)):
        raise TypeError("server must be an MCP SDK server with add_tool (MCPServer or FastMCP)")
    server.add_tool(
        tool_function(guard, fn, framework="MCP"),
        name=name or fn.__name__,
        description=inspect.getdoc(fn) or fn.__name__,
    )
