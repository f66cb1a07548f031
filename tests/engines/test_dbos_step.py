"""``dataoad.integrations.dbos`` in one process, with the real ``dbos`` package on SQLite:
the key, the UNKNOWN rule, DBOS's retries left off, and every bad use refused first."""

from __future__ import annotations

import pickle
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from dbos import DBOS, SetWorkflowID

from dataoad import (
    ActionRunner,
    ActionStatus,
    DefinitiveFailure,
    EventKind,
    InMemoryLedger,
    InvalidArgumentError,
    InvalidRequestError,
    LedgerClosedError,
    NothingInvokedError,
    NotInStepError,
    RetryPolicy,
    RunnerEvent,
    SQLiteLedger,
    SyncActionRunner,
    UnresolvedActionError,
    VerificationResult,
)
from dataoad.integrations._engine import engine_key
from dataoad.integrations.dbos import guarded_step, step_key


async def run_workflow(workflow: Any, *args: Any, workflow_id: str = "wf-1") -> Any:
    with SetWorkflowID(workflow_id):
        handle = await DBOS.start_workflow_async(workflow, *args)
    return await handle.get_result()


async def test_each_step_of_a_workflow_has_its_own_stable_key(
    dbos_app: Callable[[], None],
) -> None:
    ledger = InMemoryLedger()
    runner = ActionRunner(ledger)
    calls: list[str] = []

    @guarded_step(runner, "charge", request=lambda order: {"order": order})
    async def charge(order: str) -> str:
        calls.append(order)
        return f"ch-{order}"

    @DBOS.workflow()
    async def checkout(order: str) -> list[Any]:
        first = await charge(order)
        second = await charge(order + "-b")
        return [first.value, second.value, first.receipt.idempotency_key, await step_key_inside()]

    @DBOS.step()
    async def step_key_inside() -> str:
        return step_key()

    dbos_app()
    value = await run_workflow(checkout, "o1")
    assert value == ["ch-o1", "ch-o1-b", "dbos:wf-1:1", "dbos:wf-1:3"]
    assert calls == ["o1", "o1-b"]
    keys = sorted(r.idempotency_key for r in ledger.snapshot())
    assert keys == ["dbos:wf-1:1", "dbos:wf-1:2"]


async def test_unknown_reaches_the_workflow_as_unresolved_and_dbos_does_not_retry(
    dbos_app: Callable[[], None],
) -> None:
    started: list[EventKind] = []

    class Calls:
        def on_event(self, event: RunnerEvent) -> None:
            if event.kind is EventKind.CALL_STARTED:
                started.append(event.kind)

    runner = ActionRunner(InMemoryLedger(), observers=[Calls()])
    calls: list[int] = []

    @guarded_step(
        runner,
        "charge",
        request={"order": "o1"},
        # Even a policy that retries UNKNOWN leaves it to the evidence: no verifier, no retry.
        policy=RetryPolicy(max_attempts=3),
    )
    async def charge() -> str:
        calls.append(1)
        raise TimeoutError("the response was lost")

    @DBOS.workflow()
    async def checkout() -> Any:
        try:
            await charge()
        except UnresolvedActionError as exc:
            receipt = exc.receipt
            status = None
            if receipt is not None:
                assert receipt.final_status is not None
                status = receipt.final_status.value
            return [
                status,
                exc.action_id,
                str(exc),
            ]
        return "returned"

    dbos_app()
    status, action_id, message = await run_workflow(checkout)
    assert status == "UNKNOWN"
    assert action_id in message
    assert "must not run it again" in message
    assert calls == [1]
    # DBOS ran the step once: it did not retry the error (which would only replay).
    assert len(started) == 1


async def test_an_uncaught_unknown_fails_the_workflow_with_its_receipt(
    dbos_app: Callable[[], None],
) -> None:
    runner = ActionRunner(InMemoryLedger())

    @guarded_step(runner, "charge", request={"order": "o1"})
    async def charge() -> str:
        raise ConnectionResetError("reset after commit")

    @DBOS.workflow()
    async def checkout() -> None:
        await charge()

    dbos_app()
    with pytest.raises(UnresolvedActionError) as info:
        await run_workflow(checkout)
    # DBOS stored the error and raised it again: the receipt came with it.
    assert info.value.receipt is not None
    assert info.value.receipt.final_status is ActionStatus.UNKNOWN
    again = pickle.loads(pickle.dumps(info.value))
    assert again.receipt == info.value.receipt


async def test_failed_is_returned_and_confirmed_by_a_verifier_is_confirmed(
    dbos_app: Callable[[], None],
) -> None:
    runner = ActionRunner(InMemoryLedger())

    @guarded_step(runner, "charge", request={"order": "o1"})
    async def declined() -> str:
        raise DefinitiveFailure("card declined")

    def found(receipt: Any) -> VerificationResult:
        return VerificationResult.confirmed(verified_provider_reference="order-o2")

    @guarded_step(
        runner, "charge2", request={"order": "o2"}, provider_reference="order-o2", verifier=found
    )
    async def lost() -> str:
        raise TimeoutError("lost")

    @DBOS.workflow()
    async def checkout() -> list[str]:
        first = await declined()
        second = await lost()
        return [first.status.value, second.status.value]

    dbos_app()
    assert await run_workflow(checkout) == ["FAILED", "CONFIRMED"]


async def test_outside_a_workflow_nothing_is_recorded_or_invoked() -> None:
    ledger = InMemoryLedger()
    runner = ActionRunner(ledger)
    calls: list[int] = []

    @guarded_step(runner, "charge", request={"order": "o1"})
    async def charge() -> str:
        calls.append(1)
        return "ch"

    with pytest.raises(NotInStepError, match="no DBOS step is running"):
        await charge()
    with pytest.raises(NotInStepError):
        step_key()
    assert calls == []
    assert ledger.snapshot() == []


async def test_a_guarded_step_inside_another_step_is_refused_before_anything(
    dbos_app: Callable[[], None],
) -> None:
    # DBOS runs a step called from inside another step as part of it: no
    # step id of its own, so every guarded call in it had the outer step's
    # key (a cart's second unit replayed the first's receipt).
    ledger = InMemoryLedger()
    calls: list[str] = []

    @guarded_step(ActionRunner(ledger), "charge", request=lambda sku: {"sku": sku})
    async def charge(sku: str) -> str:
        calls.append(sku)
        return f"ch-{sku}"

    @DBOS.step()
    async def charge_cart(skus: list[str]) -> list[Any]:
        return [(await charge(sku)).value for sku in skus]

    @DBOS.workflow()
    async def checkout(skus: list[str]) -> list[Any]:
        return await charge_cart(skus)

    @DBOS.workflow()
    async def step_by_step(skus: list[str]) -> list[Any]:
        return [(await charge(sku)).value for sku in skus]

    dbos_app()
    with pytest.raises(NotInStepError, match="was called inside step 1 of workflow 'wf-nested'"):
        await run_workflow(checkout, ["a", "a"], workflow_id="wf-nested")
    assert calls == []
    assert ledger.snapshot() == []
    # Called from the workflow, each unit is a step of its own.
    assert await run_workflow(step_by_step, ["a", "a"]) == ["ch-a", "ch-a"]
    assert calls == ["a", "a"]


async def test_a_request_that_is_not_json_is_refused_before_anything(
    dbos_app: Callable[[], None],
) -> None:
    ledger = InMemoryLedger()
    runner = ActionRunner(ledger)
    calls: list[int] = []

    @guarded_step(runner, "charge", request=lambda amount: {"amount": amount})
    async def charge(amount: object) -> str:
        calls.append(1)
        return "ch"

    @DBOS.workflow()
    async def checkout() -> str:
        try:
            await charge(float("nan"))
        except InvalidRequestError as exc:
            return type(exc).__name__
        return "accepted"

    dbos_app()
    assert await run_workflow(checkout) == "InvalidRequestError"
    assert calls == []
    assert ledger.snapshot() == []


async def test_a_closed_ledger_is_refused_before_the_provider_is_called(
    dbos_app: Callable[[], None], tmp_path: Path
) -> None:
    ledger = SQLiteLedger(tmp_path / "ledger.sqlite3")
    runner = ActionRunner(ledger)
    await ledger.close()
    calls: list[int] = []

    @guarded_step(runner, "charge", request={"order": "o1"})
    async def charge() -> str:
        calls.append(1)
        return "ch"

    @DBOS.workflow()
    async def checkout() -> list[Any]:
        try:
            await charge()
        except NothingInvokedError as exc:
            return [type(exc.__cause__).__name__, exc.operation_invoked]
        return ["accepted"]

    dbos_app()
    assert await run_workflow(checkout) == [LedgerClosedError.__name__, False]
    assert calls == []


async def test_a_long_workflow_id_still_gives_a_stable_key(
    dbos_app: Callable[[], None],
) -> None:
    ledger = InMemoryLedger()
    runner = ActionRunner(ledger)

    @guarded_step(runner, "charge", request={"order": "o1"})
    async def charge() -> str:
        return "ch"

    @DBOS.workflow()
    async def checkout() -> str:
        return (await charge()).receipt.idempotency_key

    dbos_app()
    long_id = "order:" + "x" * 600
    key = await run_workflow(checkout, workflow_id=long_id)
    assert key == engine_key("dbos", long_id, "1")
    assert key.startswith("dbos-sha256:")
    assert len(key) <= 512


def test_engine_keys_escape_their_separator_and_hash_when_too_long() -> None:
    assert engine_key("dbos", "wf", "1") == "dbos:wf:1"
    assert engine_key("t", "a:b", "c") != engine_key("t", "a", "b:c")
    assert engine_key("t", "a%3Ab", "c") != engine_key("t", "a:b", "c")
    fits = "w" * (512 - len("dbos::1"))
    assert engine_key("dbos", fits, "1") == f"dbos:{fits}:1"
    assert engine_key("dbos", fits + "w", "1").startswith("dbos-sha256:")


@pytest.mark.parametrize(
    ("make_runner", "kwargs", "match"),
    [
        (lambda: SyncActionRunner(InMemoryLedger()), {}, "must be an ActionRunner"),
        (lambda: object(), {}, "must be an ActionRunner"),
        (lambda: ActionRunner(InMemoryLedger()), {"action_name": ""}, "action_name"),
        (lambda: ActionRunner(InMemoryLedger()), {"request": [1]}, "request must be"),
        (lambda: ActionRunner(InMemoryLedger()), {"verifier": lambda r: None}, "needs a provider"),
        (lambda: ActionRunner(InMemoryLedger()), {"wait_in_progress": -1}, "wait_in_progress"),
        (lambda: ActionRunner(InMemoryLedger()), {"policy": {"max_attempts": 2}}, "policy"),
        (lambda: ActionRunner(InMemoryLedger()), {"provider_reference": ""}, "provider_reference"),
    ],
)
def test_bad_options_are_refused_when_decorating(
    make_runner: Callable[[], Any], kwargs: dict[str, Any], match: str
) -> None:
    runner = make_runner()
    options: dict[str, Any] = {"action_name": "charge", "request": {"order": "o1"}, **kwargs}
    with pytest.raises(InvalidArgumentError, match=match):
        guarded_step(runner, options.pop("action_name"), **options)
    if isinstance(runner, SyncActionRunner):
        runner.close()


def test_a_sync_function_is_refused_when_decorating() -> None:
    decorate = guarded_step(ActionRunner(InMemoryLedger()), "charge", request={"o": 1})

    def charge() -> str:
        return "ch"

    with pytest.raises(InvalidArgumentError, match="is not async"):
        decorate(charge)  # type: ignore[arg-type]
