"""Each engine's own decorator hands every option it offers to ``execute`` unchanged.

``tests/front_ends/test_execute_options.py`` holds that each front end *takes*
every option and that ``EngineStep`` passes them on. Here each engine runs its
step for real (a DBOS workflow, a Temporal activity environment, a LangGraph
node) under a runner that records what ``execute`` was given: a decorator that
dropped the caller's retry policy, risk or metadata on the way to its step
passed every other test. So did one that ignored the step's ``name``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from dbos import DBOS, SetWorkflowID
from temporalio import activity
from temporalio.exceptions import ApplicationError

from dataoad import (
    ActionRunner,
    ActionStatus,
    DefinitiveFailure,
    InMemoryLedger,
    InvalidArgumentError,
    NotInStepError,
    SyncActionRunner,
    UnresolvedActionError,
)
from dataoad.integrations.dbos import guarded_step, step_key
from dataoad.integrations.langgraph import guarded_node
from dataoad.integrations.temporal import (
    FAILED_TYPE,
    RUN_METADATA_KEY,
    UNRESOLVED_TYPE,
    guarded_activity,
    unresolved,
)
from suite_support.options import ENGINE_EXPECTED, VALUES, RecordingRunner, recording_runner
from tests.engines.test_temporal import environment

#: Every option an engine step offers (all but ``expires_after``).
OFFERED = {k: v for k, v in VALUES.items() if k != "expires_after"}


async def test_a_dbos_step_hands_every_option_on_under_its_name(
    dbos_app: Callable[[], None],
) -> None:
    runner = recording_runner()

    @guarded_step(runner, "charge", request=lambda order: {"order": order}, name="pay", **OFFERED)
    async def charge(order: str) -> str:
        return f"ch-{order}"

    @guarded_step(runner, "refund", request=lambda order: {"order": order})
    async def refund(order: str) -> str:
        return f"re-{order}"

    @DBOS.workflow()
    async def checkout(order: str) -> list[Any]:
        try:
            await charge(order)
        except UnresolvedActionError as exc:  # the verifier given could not tell
            charged = exc.action_id
        else:
            charged = None
        refunded = await refund(order)
        return [charged is not None, refunded.value]

    dbos_app()
    with SetWorkflowID("wf-options"):
        handle = await DBOS.start_workflow_async(checkout, "o1")
    assert await handle.get_result() == [True, "re-o1"]
    defaults = dict.fromkeys(ENGINE_EXPECTED)
    # The engine steps' own default: twice the runner's lease (30 s), plus 5 s.
    defaults["wait_in_progress"] = 65.0
    assert runner.seen == [ENGINE_EXPECTED, defaults]
    steps = await DBOS.list_workflow_steps_async("wf-options")
    names = [step["function_name"] for step in steps]
    # The given name, else the function's own (never the action's).
    assert names == ["pay", refund.__qualname__]


async def test_a_temporal_activity_hands_every_option_on_under_its_name() -> None:
    runner = recording_runner()

    @guarded_activity(runner, "charge", request={"order": "o1"}, name="pay", **OFFERED)
    async def charge() -> str:
        return "ch_1"

    @guarded_activity(runner, "refund", request={"order": "o1"})
    async def give_back() -> str:
        return "re_1"

    with pytest.raises(ApplicationError) as info:  # the verifier given could not tell
        await environment().run(charge)
    assert info.value.type == UNRESOLVED_TYPE
    # The caller's metadata, with the run the activity belongs to noted beside it.
    run = environment().info.workflow_run_id
    noted = {**ENGINE_EXPECTED["metadata"], RUN_METADATA_KEY: run}
    assert runner.seen == [{**ENGINE_EXPECTED, "metadata": noted}]
    assert activity._Definition.must_from_callable(charge).name == "pay"
    # The function's own name by default, never the action's.
    assert activity._Definition.must_from_callable(give_back).name == "give_back"
    assert await environment(activity_id="2").run(give_back) == "re_1"


async def test_a_temporal_failure_carries_the_receipt_to_the_workflow() -> None:
    ledger = InMemoryLedger()

    @guarded_activity(ActionRunner(ledger), "charge", request={"order": "o1"})
    async def declined() -> str:
        raise DefinitiveFailure("card declined")

    with pytest.raises(ApplicationError) as info:
        await environment().run(declined)
    (receipt,) = ledger.snapshot()
    assert receipt.final_status is ActionStatus.FAILED
    assert info.value.type == FAILED_TYPE
    assert info.value.details[0] == {
        "action_id": receipt.action_id,
        "action_name": "charge",
        "idempotency_key": "temporal:default:wf-1:1",
        "status": "FAILED",
        "error": "DefinitiveFailure: card declined",
    }


def test_the_workflow_reads_an_unresolved_activity_whatever_its_details() -> None:
    def failure(*details: Any) -> RuntimeError:
        error = ApplicationError("charge is UNKNOWN", *details, type=UNRESOLVED_TYPE)
        wrapped = RuntimeError("activity failed")
        wrapped.__cause__ = error
        return wrapped

    found = unresolved(failure({"action_id": "a1"}))
    assert found is not None
    assert (str(found), found.action_id) == ("charge is UNKNOWN", "a1")
    for odd in (failure(), failure("not a mapping"), failure({"other": 1})):
        found = unresolved(odd)
        assert found is not None
        assert (str(found), found.action_id) == ("charge is UNKNOWN", None)
    assert unresolved(ApplicationError("declined", type=FAILED_TYPE)) is None


def _node_with_every_option(runner: ActionRunner | SyncActionRunner) -> Any:
    """A guarded node given every option (a node derives the reference from the state)."""
    reference = OFFERED["provider_reference"]
    return guarded_node(
        lambda state: f"ch-{state['order']}",
        runner=runner,
        action_name="charge",
        request=lambda state: {"order": state["order"]},
        idempotency_key=lambda state: f"order-{state['order']}",
        **{**OFFERED, "provider_reference": lambda state: reference},
    )


async def test_a_langgraph_node_hands_every_option_on() -> None:
    runner = recording_runner()
    node = _node_with_every_option(runner)
    with pytest.raises(UnresolvedActionError) as info:  # the verifier given could not tell
        await node({"order": "o1"})
    assert runner.seen == [ENGINE_EXPECTED]
    # Named by its action, and told the verifier will look again.
    assert str(info.value).startswith("UNKNOWN: charge may have happened (action id ")
    assert str(info.value).endswith(
        "It will be verified read-only; tell the user the outcome is being checked."
    )
    assert info.value.receipt == runner.ledger.snapshot()[0]  # type: ignore[attr-defined]


async def test_a_langgraph_node_without_a_verifier_says_nothing_will_check_it() -> None:
    ledger = InMemoryLedger()

    async def lost(state: Any) -> str:
        raise TimeoutError("the response was lost")

    node = guarded_node(
        lost,
        runner=ActionRunner(ledger),
        action_name="payout",
        request=lambda state: {"o": 1},
        idempotency_key=lambda state: "payout-1",
    )
    with pytest.raises(UnresolvedActionError) as info:
        await node({})
    (receipt,) = ledger.snapshot()
    assert info.value.receipt == receipt
    assert str(info.value) == (
        f"UNKNOWN: payout may have happened (action id {receipt.action_id}); the provider "
        "did not confirm it. Do NOT call this tool again for the same request: that could "
        "do it twice. Nothing will check it automatically (no verifier is set): an operator "
        "must check it with the provider. Tell the user the outcome is not known yet."
    )


def test_a_langgraph_node_on_a_sync_runner_hands_every_option_on(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The sync runner builds its own ActionRunner: a recording one.
    monkeypatch.setattr("dataoad._sync.ActionRunner", RecordingRunner)
    sync_runner = SyncActionRunner(InMemoryLedger())
    runner = sync_runner.runner
    assert isinstance(runner, RecordingRunner)
    try:
        node = _node_with_every_option(sync_runner)
        with pytest.raises(UnresolvedActionError):  # the verifier given could not tell
            node.invoke({"order": "o1"})
        assert runner.seen == [ENGINE_EXPECTED]
    finally:
        sync_runner.close()


def _sync_charge() -> str:
    return "ch"


@pytest.mark.parametrize(
    ("engine", "decorate"),
    [
        ("DBOS", lambda runner: guarded_step(runner, "charge", request={"o": 1})),
        ("Temporal", lambda runner: guarded_activity(runner, "charge", request={"o": 1})),
    ],
)
def test_each_engine_names_itself_when_refusing_a_sync_function(
    engine: str, decorate: Callable[[ActionRunner], Callable[[Any], Any]]
) -> None:
    with pytest.raises(InvalidArgumentError) as info:
        decorate(ActionRunner(InMemoryLedger()))(_sync_charge)
    assert str(info.value) == (
        f"{_sync_charge.__qualname__!r} is not async: a guarded {engine} step is an async "
        "function (ActionRunner awaits it on the step's event loop)"
    )


async def test_dbos_and_temporal_name_themselves_in_an_unknown_outcome(
    dbos_app: Callable[[], None],
) -> None:
    ledger = InMemoryLedger()
    runner = ActionRunner(ledger)

    async def lost() -> str:
        raise TimeoutError("the response was lost")

    dbos_charge = guarded_step(runner, "charge", request={"o": 1})(lost)

    @DBOS.workflow()
    async def checkout() -> str:
        try:
            await dbos_charge()
        except UnresolvedActionError as exc:
            return str(exc)
        return "returned"

    dbos_app()
    with SetWorkflowID("wf-unknown"):
        handle = await DBOS.start_workflow_async(checkout)
    dbos_message = await handle.get_result()
    temporal_charge = guarded_activity(runner, "refund", request={"o": 1})(lost)
    with pytest.raises(ApplicationError) as info:
        await environment().run(temporal_charge)
    ids = {r.action_name: r.action_id for r in ledger.snapshot()}
    rest = (
        "must not run it again; settle it read-only (a verifier, or `dataoad recover`) "
        "and decide from the receipt"
    )
    unknown = "is UNKNOWN: it may have happened, and the provider did not confirm it."
    assert dbos_message == f"charge (action id {ids['charge']}) {unknown} DBOS {rest}"
    assert info.value.message == f"refund (action id {ids['refund']}) {unknown} Temporal {rest}"


async def test_a_dbos_step_key_exists_only_inside_a_step(dbos_app: Callable[[], None]) -> None:
    @DBOS.workflow()
    async def outside_a_step() -> str:
        try:
            return step_key()
        except NotInStepError as exc:
            return f"refused: {exc}"

    dbos_app()
    with SetWorkflowID("wf-no-step"):
        handle = await DBOS.start_workflow_async(outside_a_step)
    assert await handle.get_result() == (
        "refused: no DBOS step is running: a guarded step has a key only as a step of a "
        "workflow (call it from a @DBOS.workflow function); nothing was recorded or invoked"
    )
    with pytest.raises(NotInStepError):
        step_key()
