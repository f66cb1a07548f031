"""One declared set of ``execute`` options: every front end takes each one, or says why not.

``EXECUTE_OPTIONS`` (``dataoad/_arguments.py``) must be exactly the options of
``ActionRunner.execute``; each front end must accept every one of them but
those ``NOT_OFFERED`` names with a reason, and must hand each one to
``execute`` unchanged. An option added to ``execute`` fails here until every
front end passes it on.
"""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Callable
from typing import Any

import pytest

from dataoad import (
    ActionRunner,
    GuardedTool,
    InMemoryLedger,
    SyncActionRunner,
    guarded,
    run_tool,
)
from dataoad._arguments import EXECUTE_OPTIONS
from dataoad.integrations._engine import EngineStep
from suite_support.options import VALUES, recording_runner

_RERUN = (
    "an engine runs a step at least once: a step re-run after its receipt expired would run "
    "the operation again, so a re-run always replays"
)
#: What a front end does not offer, and why: the only exceptions.
NOT_OFFERED: dict[str, dict[str, str]] = {
    "EngineStep": {"expires_after": _RERUN},
    "dbos.guarded_step": {"expires_after": _RERUN},
    "temporal.guarded_activity": {"expires_after": _RERUN},
    "langgraph.guarded_node": {"expires_after": _RERUN},
}


def front_ends() -> dict[str, Callable[..., Any]]:
    from dataoad.integrations import dbos, langgraph, temporal

    return {
        "SyncActionRunner.execute": SyncActionRunner.execute,
        "guarded": guarded,
        "run_tool": run_tool,
        "GuardedTool": GuardedTool,
        "EngineStep": EngineStep,
        "dbos.guarded_step": dbos.guarded_step,
        "temporal.guarded_activity": temporal.guarded_activity,
        "langgraph.guarded_node": langgraph.guarded_node,
    }


def accepted(front_end: Callable[..., Any]) -> set[str]:
    if dataclasses.is_dataclass(front_end):
        return {f.name for f in dataclasses.fields(front_end)}
    return set(inspect.signature(front_end).parameters)


def test_the_declared_set_is_exactly_executes_options() -> None:
    parameters = inspect.signature(ActionRunner.execute).parameters.values()
    optional = [p.name for p in parameters if p.kind is p.KEYWORD_ONLY and p.default is None]
    assert tuple(optional) == EXECUTE_OPTIONS
    assert set(VALUES) == set(EXECUTE_OPTIONS)


@pytest.mark.parametrize("name", sorted(front_ends()))
def test_every_front_end_takes_every_option_or_says_why_not(name: str) -> None:
    declined = NOT_OFFERED.get(name, {})
    assert all(reason for reason in declined.values())
    missing = set(EXECUTE_OPTIONS) - accepted(front_ends()[name]) - set(declined)
    assert missing == set(), f"{name} does not take {sorted(missing)}"
    # An exception that the front end does offer after all is stale: remove it.
    assert not set(declined) & accepted(front_ends()[name])


def test_the_check_sees_a_front_end_that_misses_an_option() -> None:
    def front_end(*, provider_reference: str | None = None) -> None: ...

    assert set(EXECUTE_OPTIONS) - accepted(front_end) == set(EXECUTE_OPTIONS) - {
        "provider_reference"
    }


async def _charge() -> str:
    return "ch_1"


async def test_guarded_passes_every_option_on() -> None:
    runner = recording_runner()
    options = {k: v for k, v in VALUES.items() if k != "provider_reference"}

    @guarded(
        "charge",
        runner=runner,
        idempotency_key=lambda n: f"k{n}",
        request=lambda n: {"n": n},
        provider_reference=lambda n: VALUES["provider_reference"],
        **options,
    )
    async def charge(n: int) -> str:
        return "ch_1"

    await charge(1)
    assert runner.seen == [VALUES]


async def test_run_tool_and_guarded_tool_pass_every_option_on() -> None:
    runner = recording_runner()
    await run_tool(runner, "charge", _charge, request={"n": 1}, idempotency_key="k1", **VALUES)
    tool = GuardedTool(
        runner,
        "charge",
        idempotency_key=lambda n: f"k{n}",
        request=lambda n: {"n": n},
        provider_reference=lambda n: VALUES["provider_reference"],
        **{k: v for k, v in VALUES.items() if k != "provider_reference"},
    )

    async def charge(n: int) -> str:
        return "ch_1"

    await tool.call(charge, {"n": 2})
    assert runner.seen == [VALUES, VALUES]


async def test_an_engine_step_passes_every_option_it_offers_on() -> None:
    offered = {k: v for k, v in VALUES.items() if k not in NOT_OFFERED["EngineStep"]}
    step = EngineStep(
        "DBOS",
        ActionRunner(InMemoryLedger()),
        "charge",
        request={"n": 1},
        **offered,
    )
    arguments = step.arguments("k1", _charge, (), {})
    assert {k: arguments.get(k) for k in offered} == offered
