"""MCP: a client repeats a timed-out tools/call in memory; one charge happens."""

from __future__ import annotations

import asyncio

from suite_support.agents import framework

framework("mcp", "mcp")

from mcp import Client
from mcp.server.mcpserver import MCPServer

from dataoad.integrations.mcp import add_guarded_tool
from suite_support.agents import ARGS, ChargeScenario


def text_of(result: object) -> str:
    return "".join(getattr(part, "text", "") for part in getattr(result, "content", []))


def test_repeated_tools_call_replays_and_the_client_reads_unknown() -> None:
    scenario = ChargeScenario()
    server = MCPServer("billing")
    add_guarded_tool(server, scenario.charge_order, scenario.guard())

    async def session() -> tuple[str, str, list[str]]:
        async with Client(server) as client:
            tools = [tool.name for tool in (await client.list_tools()).tools]
            first = text_of(await client.call_tool("charge_order", dict(ARGS)))
            second = text_of(await client.call_tool("charge_order", dict(ARGS)))
            return first, second, tools

    first, second, tools = asyncio.run(session())
    assert tools == ["charge_order"]
    assert len(scenario.provider.charges) == 1, "the repeated call charged again"
    assert first.startswith("UNKNOWN: charge_order may have happened")
    assert second.startswith("UNKNOWN:")
    assert asyncio.run(scenario.settle_later(first)) == "CONFIRMED"
    assert len(scenario.provider.charges) == 1
