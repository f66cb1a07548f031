"""DBOS: a step guarded by Dataoad, keyed by the step's own identity. Needs ``dataoad[dbos]``.

DBOS runs steps at least once: a process killed after a step's side effect
but before DBOS checkpointed its output runs the step again on recovery.
``guarded_step`` makes that re-execution meet its own receipt:

    @DBOS.workflow()
    async def checkout(order_id: str, cents: int) -> str:
        result = await charge(order_id, cents)
        ...

    @guarded_step(runner, "charge", request=lambda order_id, cents: {...},
                  provider_reference=lambda order_id, cents: f"order-{order_id}",
                  verifier=payments_lookup)
    async def charge(order_id: str, cents: int) -> str:
        return await payments.charge(...)

The key is ``step_key()``: the workflow id and the step's function id, which
DBOS keeps across recovery. The step returns the ``ActionResult`` (a replay's
value is not available: Dataoad never stores provider values); an UNKNOWN
outcome raises ``UnresolvedActionError`` with the receipt. DBOS's own step
retries stay off: an ambiguous charge must not be run again because it
raised, and Dataoad's ``RetryPolicy`` retries what evidence allows.

Launch DBOS inside your event loop (``DBOS.launch()`` from async code) so
recovered workflows run their steps on the loop the runner's ledger uses.
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Awaitable, Callable
from typing import Any, ParamSpec, TypeVar

from dataoad._errors import NotInStepError
from dataoad._policy import RetryPolicy
from dataoad._result import ActionResult
from dataoad._verification import AnyVerifier
from dataoad.integrations._common import require
from dataoad.integrations._engine import (
    LEASE_WAIT,
    EngineStep,
    ReferenceSpec,
    RequestSpec,
    engine_key,
)

_dbos = require("dbos", "dbos")

__all__ = ["guarded_step", "step_key"]

P = ParamSpec("P")
T = TypeVar("T")


def step_key() -> str:
    """The running DBOS step's idempotency key: ``dbos:<workflow id>:<step id>``.

    Stable across DBOS recovery (the re-executed workflow gives the step the
    same function id). Raises ``NotInStepError`` outside a step of a workflow.
    """
    workflow_id = _dbos.DBOS.workflow_id
    step_id = _dbos.DBOS.step_id
    if workflow_id is None or step_id is None:
        raise NotInStepError(
            "no DBOS step is running: a guarded step has a key only as a step of a workflow "
            "(call it from a @DBOS.workflow function); nothing was recorded or invoked"
        )
    return engine_key("dbos", workflow_id, str(step_id))


def _beside_other_tool_calls() -> bool:
    """Whether this is a Pydantic AI agent run's tool call, and its run's calls run in parallel.

    Read from Pydantic AI's own context (its run context and its run-scoped
    parallel mode; both pinned by a test on every version the suite runs):
    nothing is imported, so without Pydantic AI loaded no agent is running.
    """
    run_context = sys.modules.get("pydantic_ai._run_context")
    tool_manager = sys.modules.get("pydantic_ai.tool_manager")
    if run_context is None or tool_manager is None:
        return False
    current = getattr(run_context, "get_current_run_context", None)
    mode = getattr(tool_manager, "_parallel_execution_mode_ctx_var", None)
    if current is None or mode is None:
        return False
    return current() is not None and mode.get() != "sequential"


def guarded_step(
    runner: Any,
    action_name: str,
    *,
    request: RequestSpec,
    provider_reference: ReferenceSpec = None,
    verifier: AnyVerifier | None = None,
    policy: RetryPolicy | None = None,
    risk: str | None = None,
    metadata: dict[str, Any] | None = None,
    wait_in_progress: float | str | None = LEASE_WAIT,
    name: str | None = None,
) -> Callable[[Callable[P, Awaitable[T]]], Callable[P, Awaitable[ActionResult[T]]]]:
    """Decorate an async function as a DBOS step guarded by ``runner`` under ``step_key()``.

    ``request`` and ``provider_reference`` are values or callables of the
    step's arguments. The step returns the ``ActionResult`` (CONFIRMED or
    FAILED) and raises ``UnresolvedActionError`` for UNKNOWN. DBOS step
    retries are off. ``wait_in_progress`` (default: long enough for a dead
    worker's lease to run out) is how long a re-executed step waits for the
    claim its previous run left. ``name`` is the DBOS step name.
    """
    step = EngineStep(
        "DBOS",
        runner,
        action_name,
        request=request,
        provider_reference=provider_reference,
        verifier=verifier,
        policy=policy,
        risk=risk,
        metadata=metadata,
        wait_in_progress=wait_in_progress,
    )

    def decorate(fn: Callable[P, Awaitable[T]]) -> Callable[P, Awaitable[ActionResult[T]]]:
        EngineStep.check_function(fn, "DBOS")

        @functools.wraps(fn)
        async def guarded(*args: P.args, **kwargs: P.kwargs) -> ActionResult[T]:
            return await step.run(step_key(), fn, args, kwargs)

        dbos_step = _dbos.DBOS.step(
            name=name or getattr(fn, "__qualname__", action_name), retries_allowed=False
        )
        stepped = dbos_step(guarded)

        @functools.wraps(fn)
        async def entered(*args: P.args, **kwargs: P.kwargs) -> ActionResult[T]:
            outer = _dbos.DBOS.step_id
            if outer is not None:
                # DBOS runs a step called from inside another step as part of
                # it, with no step id of its own: every guarded call in that
                # step would share one key (the second unit of a cart replayed
                # the first's receipt, a second item was refused).
                raise NotInStepError(
                    f"{action_name!r} was called inside step {outer} of workflow "
                    f"{_dbos.DBOS.workflow_id!r}: DBOS runs it as part of that step, so it has "
                    "no key of its own. Call the guarded step from the workflow; nothing was "
                    "recorded or invoked"
                )
            if _beside_other_tool_calls():
                raise NotInStepError(
                    f"{action_name!r} was called from a Pydantic AI tool that runs beside the "
                    "run's other tool calls: DBOS numbers steps in the order they start, and "
                    "parallel tool calls start theirs in an order set by timing, so on recovery "
                    "a step's key could pass to another call and a charge be made twice. Run "
                    "the agent's tools one at a time (DBOSAgent(..., "
                    "parallel_execution_mode='sequential')); nothing was recorded or invoked"
                )
            result: ActionResult[T] = await stepped(*args, **kwargs)
            return result

        return entered

    return decorate
