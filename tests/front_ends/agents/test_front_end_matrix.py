"""Every agent front end, with sync and async tools: duplicates, replays and evidence.

``run_tool``, ``GuardedTool.call`` and each framework adapter (LangGraph's
tool and node, MCP, the OpenAI Agents SDK, Pydantic AI) play the same
scenarios through the framework's own way of calling a tool. Each checks
what the model reads and how many times the provider was asked to charge:
a repeated call replays, a concurrent duplicate is told the call is in
progress, a reused key with another request is a conflict, a lost answer
is UNKNOWN until read-only verification settles it, and a normal return is
no proof when a verifier is configured.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import threading
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from dataoad import (
    ActionInProgressError,
    ActionPersistenceError,
    ActionRunner,
    GuardedTool,
    IdempotencyConflictError,
    InMemoryLedger,
    InvalidArgumentError,
    RetryPolicy,
    UnresolvedActionError,
    run_tool,
)
from dataoad._tool import describe_error
from dataoad.testing import ChargeFault, FakePaymentProvider, LookupFault, PaymentVerifier
from suite_support.agents import framework

ARGS = {"order_id": "order-7", "amount_cents": 2500}
#: Every front end is given this policy: a failure the provider says is safe
#: to retry is retried once; nothing else is.
POLICY = RetryPolicy(max_attempts=2, retry_on_failed=True)
Invoke = Callable[[dict[str, Any]], Awaitable[str]]


def request_of(order_id: str, amount_cents: int) -> dict[str, Any]:
    """The request every front end records for a charge: one mapping, used by all."""
    return {"order": order_id, "amount": amount_cents}


class Shop:
    """One provider, one verifier, one runner, and a charge tool (sync or async)."""

    def __init__(self, kind: str, charge_faults: list[ChargeFault], lookups: list[Any]) -> None:
        self.provider = FakePaymentProvider(charge_faults=charge_faults, lookup_faults=lookups)
        self.runner = ActionRunner(InMemoryLedger())
        self.entered = threading.Event()  # the tool is running
        self.hold: threading.Event | None = None  # set: let a held tool finish
        self.tool = self._async_tool() if kind == "async" else self._sync_tool()
        #: The guard's key function (the order id, unless a test says otherwise).
        self.key_of: Callable[..., str] = lambda order_id, amount_cents: order_id

    async def _charge(self, order_id: str, amount_cents: int) -> dict[str, Any]:
        charge = await self.provider.charge(
            customer_id=f"cus_{order_id}", amount_cents=amount_cents, client_reference=order_id
        )
        return {"charge_id": charge.charge_id}

    def _async_tool(self) -> Callable[..., Any]:
        async def charge_order(order_id: str, amount_cents: int) -> dict[str, Any]:
            """Charge the customer of an order."""
            self.entered.set()
            if self.hold is not None:
                await asyncio.to_thread(self.hold.wait, 10)
            return await self._charge(order_id, amount_cents)

        return charge_order

    def _sync_tool(self) -> Callable[..., Any]:
        def charge_order(order_id: str, amount_cents: int) -> dict[str, Any]:
            """Charge the customer of an order."""
            assert _no_running_loop(), "a sync tool ran on the event loop"
            self.entered.set()
            if self.hold is not None:
                self.hold.wait(10)
            return asyncio.run(self._charge(order_id, amount_cents))

        return charge_order

    def guard(self) -> GuardedTool:
        return GuardedTool(
            self.runner,
            "charge_order",
            idempotency_key=self.key_of,
            request=request_of,
            provider_reference=lambda order_id, amount_cents: order_id,
            verifier=PaymentVerifier(self.provider),
            policy=POLICY,
        )


def _no_running_loop() -> bool:
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return True
    return False


# -- how each front end calls the tool: arguments in, the model's text out ----------------


def via_run_tool(shop: Shop) -> Invoke:
    async def invoke(args: dict[str, Any]) -> str:
        outcome = await run_tool(
            shop.runner,
            "charge_order",
            functools.partial(shop.tool, **args),
            request=request_of(**args),
            idempotency_key=args["order_id"],
            provider_reference=args["order_id"],
            verifier=PaymentVerifier(shop.provider),
            policy=POLICY,
        )
        return outcome.message

    return invoke


def via_guarded_tool(shop: Shop) -> Invoke:
    guard = shop.guard()

    async def invoke(args: dict[str, Any]) -> str:
        return (await guard.call(shop.tool, args)).message

    return invoke


def via_langgraph_tool(shop: Shop) -> Invoke:
    framework("langgraph", "langgraph")
    from dataoad.integrations.langgraph import guarded_tool

    tool = guarded_tool(shop.tool, shop.guard())

    async def invoke(args: dict[str, Any]) -> str:
        return str(await tool.ainvoke(dict(args)))

    return invoke


def via_langgraph_node(shop: Shop) -> Invoke:
    framework("langgraph", "langgraph")
    from dataoad.integrations.langgraph import guarded_node

    node = guarded_node(
        lambda state: shop.tool(**state),
        runner=shop.runner,
        action_name="charge_order",
        idempotency_key=lambda state: state["order_id"],
        request=lambda state: request_of(**state),
        provider_reference=lambda state: state["order_id"],
        verifier=PaymentVerifier(shop.provider),
        policy=POLICY,
        wait_in_progress=0,  # tell a concurrent duplicate at once, as a tool would
    )

    async def invoke(args: dict[str, Any]) -> str:
        try:
            return str((await node.ainvoke(dict(args)))["dataoad"]["message"])
        except (ActionInProgressError, IdempotencyConflictError, ActionPersistenceError) as exc:
            # An engine step raises what a tool would tell the model.
            return describe_error(exc, "charge_order").message
        except UnresolvedActionError as exc:
            # A node's UNKNOWN is raised, with the receipt and the same words.
            if exc.receipt is None:
                raise AssertionError("an UNKNOWN node outcome came without its receipt") from exc
            return str(exc)

    return invoke


def via_mcp(shop: Shop) -> Invoke:
    framework("mcp", "mcp")
    from mcp import Client
    from mcp.server.mcpserver import MCPServer

    from dataoad.integrations.mcp import add_guarded_tool

    server = MCPServer("billing")
    add_guarded_tool(server, shop.tool, shop.guard())

    async def invoke(args: dict[str, Any]) -> str:
        async with Client(server) as client:
            result = await client.call_tool("charge_order", dict(args))
        return "".join(getattr(part, "text", "") for part in result.content)

    return invoke


def via_openai_agents(shop: Shop) -> Invoke:
    framework("agents", "openai-agents")
    from agents.tool_context import ToolContext

    from dataoad.integrations.openai_agents import guarded_function_tool

    tool = guarded_function_tool(shop.tool, shop.guard())
    calls = iter(range(1, 100))

    async def invoke(args: dict[str, Any]) -> str:
        # A new tool-call id every time, as a model's retry has: the key is the order.
        text = json.dumps(args)
        context = ToolContext(
            context=None,
            tool_name="charge_order",
            tool_call_id=f"call_{next(calls)}",
            tool_arguments=text,
        )
        return str(await tool.on_invoke_tool(context, text))

    return invoke


def via_pydantic_ai(shop: Shop) -> Invoke:
    framework("pydantic_ai", "pydantic-ai")
    from pydantic_ai import Agent, ModelResponse, TextPart, ToolCallPart
    from pydantic_ai.messages import ToolReturnPart
    from pydantic_ai.models.function import FunctionModel

    from dataoad.integrations.pydantic_ai import guarded_tool

    tool = guarded_tool(shop.tool, shop.guard())

    async def invoke(args: dict[str, Any]) -> str:
        def model(messages: list[Any], info: Any) -> ModelResponse:
            returns = [
                str(part.content)
                for message in messages
                for part in getattr(message, "parts", [])
                if isinstance(part, ToolReturnPart)
            ]
            if not returns:
                return ModelResponse(parts=[ToolCallPart("charge_order", dict(args))])
            return ModelResponse(parts=[TextPart(returns[0])])  # the model repeats what it read

        result = await Agent(FunctionModel(model), tools=[tool]).run("Charge order-7")
        return str(result.output)

    return invoke


FRONT_ENDS: dict[str, Callable[[Shop], Invoke]] = {
    "run_tool": via_run_tool,
    "GuardedTool.call": via_guarded_tool,
    "langgraph tool": via_langgraph_tool,
    "langgraph node": via_langgraph_node,
    "mcp": via_mcp,
    "openai-agents": via_openai_agents,
    "pydantic-ai": via_pydantic_ai,
}

matrix = pytest.mark.parametrize(
    ("front", "kind"), [(front, kind) for front in FRONT_ENDS for kind in ("async", "sync")]
)


def in_turn(invoke: Invoke, *calls: dict[str, Any]) -> list[str]:
    """What the model reads for each call, made one after another on one loop."""

    async def run() -> list[str]:
        return [await invoke(args) for args in calls]

    return asyncio.run(run())


def status_of(message: str) -> str:
    return message.split(":", 1)[0]


def play(
    front: str,
    kind: str,
    charge_faults: list[ChargeFault],
    lookups: tuple[Any, ...] = (),
    key_of: Callable[..., str] | None = None,
) -> tuple[Shop, Invoke]:
    shop = Shop(kind, list(charge_faults), list(lookups))
    if key_of is not None:
        shop.key_of = key_of
    return shop, FRONT_ENDS[front](shop)


@matrix
def test_a_repeated_call_replays_and_charges_once(front: str, kind: str) -> None:
    shop, invoke = play(front, kind, [])

    first, second = in_turn(invoke, ARGS, ARGS)
    assert first.startswith("CONFIRMED: charge_order happened"), first
    assert second.startswith("CONFIRMED: charge_order already happened earlier"), second
    assert "This call did not repeat it" in second
    assert shop.provider.charge_calls == 1


@matrix
def test_a_lost_answer_is_unknown_until_verified_and_never_repeated(front: str, kind: str) -> None:
    unavailable = (LookupFault.UNAVAILABLE, LookupFault.UNAVAILABLE)
    shop, invoke = play(front, kind, [ChargeFault.TIMEOUT_AFTER_COMMIT], unavailable)

    first, second, third = in_turn(invoke, ARGS, ARGS, ARGS)
    assert first.startswith("UNKNOWN: charge_order may have happened"), first
    assert "Do NOT call this tool again" in first
    assert status_of(second) == "UNKNOWN", second
    # The third look finds the read path up: the replay's read-only check settles it.
    assert status_of(third) == "CONFIRMED", third
    assert shop.provider.charge_calls == 1
    assert len(shop.provider.charges) == 1


@matrix
def test_a_lost_answer_the_verifier_finds_is_confirmed(front: str, kind: str) -> None:
    shop, invoke = play(front, kind, [ChargeFault.TIMEOUT_AFTER_COMMIT])
    (first,) = in_turn(invoke, ARGS)
    assert first.startswith("CONFIRMED: charge_order happened"), first
    assert shop.provider.charge_calls == 1


@matrix
def test_a_decline_is_failed_and_replays_failed(front: str, kind: str) -> None:
    shop, invoke = play(front, kind, [ChargeFault.DECLINED])

    first, second = in_turn(invoke, ARGS, ARGS)
    assert first.startswith("FAILED: charge_order did not happen"), first
    assert "card declined" in first
    assert status_of(second) == "FAILED", second
    assert shop.provider.charge_calls == 1


@matrix
def test_the_guards_policy_retries_a_retry_safe_rejection(front: str, kind: str) -> None:
    shop, invoke = play(front, kind, [ChargeFault.TRANSIENT_REJECT])
    (first,) = in_turn(invoke, ARGS)
    assert first.startswith("CONFIRMED: charge_order happened"), first
    assert shop.provider.charge_calls == 2
    assert len(shop.provider.charges) == 1


@matrix
@pytest.mark.parametrize(
    "fault",
    [
        ChargeFault.ACCEPTED_THEN_REVERSED,
        ChargeFault.DECLINED_LATER,
        ChargeFault.ANSWERS_FOR_ANOTHER_REQUEST,
    ],
)
def test_a_normal_return_the_verifier_cannot_find_is_not_confirmed(
    front: str, kind: str, fault: ChargeFault
) -> None:
    shop, invoke = play(front, kind, [fault])
    (first,) = in_turn(invoke, ARGS)
    # The first answer proved nothing; the verifier's fenced absence let the
    # policy retry, and the second charge is the one that stands.
    assert shop.provider.charge_calls == 2
    assert [c.charge_id for c in shop.provider.charges_for("order-7")] == ["ch_2"]
    assert first.startswith("CONFIRMED: charge_order happened"), first
    assert '"ch_2"' in first, first


@matrix
def test_a_reused_key_with_another_request_is_a_conflict(front: str, kind: str) -> None:
    shop, invoke = play(front, kind, [])

    first, second = in_turn(invoke, ARGS, {**ARGS, "amount_cents": 9900})
    assert status_of(first) == "CONFIRMED", first
    assert second.startswith("CONFLICT:"), second
    assert "Nothing was done" in second
    assert shop.provider.charge_calls == 1


@matrix
def test_a_concurrent_duplicate_is_told_it_is_in_progress(front: str, kind: str) -> None:
    shop, invoke = play(front, kind, [])
    shop.hold = threading.Event()

    async def calls() -> tuple[str, str]:
        first = asyncio.ensure_future(invoke(ARGS))
        entered = await asyncio.to_thread(shop.entered.wait, 10)
        assert entered, "the first call never reached the tool"
        try:
            second = await invoke(ARGS)
        finally:
            shop.hold.set()  # type: ignore[union-attr]
        return await first, second

    first, second = asyncio.run(calls())
    assert second.startswith("IN PROGRESS: charge_order is already running"), second
    assert "Do NOT call again" in second
    assert first.startswith("CONFIRMED: charge_order happened"), first
    assert shop.provider.charge_calls == 1


@pytest.mark.parametrize(
    ("front", "kind"),
    [
        (front, kind)
        for front in FRONT_ENDS
        if front not in ("run_tool", "langgraph node")  # given a key, not a key function
        for kind in ("async", "sync")
    ],
)
def test_a_key_drawn_at_random_is_refused_before_anything_on_every_front_end(
    front: str, kind: str
) -> None:
    # New on every call, so a retry of the same intent would charge again.
    shop, invoke = play(
        front, kind, [], key_of=lambda order_id, amount_cents: f"{order_id}-{uuid.uuid4().hex}"
    )
    # What the model reads of the refusal is each framework's own; some raise it.
    with contextlib.suppress(InvalidArgumentError):
        in_turn(invoke, ARGS)
    assert shop.provider.charge_calls == 0
    assert shop.runner.ledger.snapshot() == []  # type: ignore[attr-defined]
