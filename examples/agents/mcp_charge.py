"""MCP, in memory: a client repeats a timed-out tools/call; the charge happens once.

Run: python examples/agents/mcp_charge.py (needs the mcp extra: pip install -e ".[mcp]")

Expected output:

    tool result 1: UNKNOWN: charge_order may have happened (action id <action-id>); the provider did not confirm it. Do NOT call this tool again for the same request: that could do it twice. It will be verified read-only; tell the user the outcome is being checked.
    tool result 2: UNKNOWN: charge_order may have happened (action id <action-id>); the provider did not confirm it. Do NOT call this tool again for the same request: that could do it twice. It will be verified read-only; tell the user the outcome is being checked.
    later, read-only verification: CONFIRMED
    charges at the provider: 1
    see the receipt: dataoad receipts show <action-id> --ledger sqlite://<ledger>
"""

from __future__ import annotations

import asyncio
import logging

from _shop import GUARD, ORDER, charge_order, settle, show
from mcp import Client
from mcp.server.mcpserver import MCPServer

from dataoad.integrations.mcp import add_guarded_tool


async def main() -> None:
    # The MCP SDK turns on INFO logging for the whole process; Dataoad's own
    # per-transition records would interleave with this example's output.
    logging.getLogger("dataoad").setLevel(logging.WARNING)
    server = MCPServer("billing")
    add_guarded_tool(server, charge_order, GUARD)
    async with Client(server) as client:
        for n in (1, 2):  # the client (its model) repeats the call after a timeout
            result = await client.call_tool("charge_order", dict(ORDER))
            show(f"tool result {n}", "".join(getattr(p, "text", "") for p in result.content))
    await settle()


if __name__ == "__main__":
    asyncio.run(main())
