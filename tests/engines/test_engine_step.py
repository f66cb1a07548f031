"""What every engine guard shares, without an engine: the key, the checks, the call, the
UNKNOWN rule, and the default wait for a dead worker's claim."""

from __future__ import annotations

import functools
import hashlib
from typing import Any

import pytest
import rfc8785

from dataoad import (
    ActionRunner,
    ActionStatus,
    DefinitiveFailure,
    InMemoryLedger,
    InvalidArgumentError,
    InvalidRequestError,
    RetryPolicy,
    SyncActionRunner,
    UnresolvedActionError,
)
from dataoad._arguments import MAX_TEXT_ARG_LENGTH
from dataoad._volatile import (
    MIN_VOLATILE_LENGTH,
    call_ids_of,
    refuse_volatile,
    refuse_volatile_request,
    stable_key,
)
from dataoad.integrations._engine import LEASE_WAIT, EngineStep, engine_key


def _default_wait(lease: float | None) -> float | None:
    runner = ActionRunner(InMemoryLedger(), lease=lease)
    step = EngineStep(
        "DBOS",
        runner,
        "charge",
        request={},
        provider_reference=None,
        verifier=None,
        policy=None,
        wait_in_progress=LEASE_WAIT,
    )
    return step.wait_in_progress


@pytest.mark.parametrize(
    ("lease", "wait"),
    [
        (30.0, 65.0),  # the default lease: twice it, plus 5 s (docs/how-to/engines/dbos.md)
        (0.5, 6.0),
        (1797.5, 3600.0),  # exactly the longest wait
        (1800.0, 3600.0),  # past it: capped, not refused
        (None, None),  # no lease: a dead worker's claim never runs out, so no waiting
    ],
)
def test_a_re_executed_step_waits_twice_the_lease_plus_five_seconds(
    lease: float | None, wait: float | None
) -> None:
    assert _default_wait(lease) == wait


# -- the key an engine step runs under ------------------------------------------------


def test_an_engine_key_joins_the_engine_and_its_parts_with_separators_escaped() -> None:
    assert engine_key("dbos", "wf-1", "3") == "dbos:wf-1:3"
    assert engine_key("t", "a:b", "c") == "t:a%3Ab:c"
    assert engine_key("t", "50%", "c") == "t:50%25:c"
    # No two part lists share a key: not across the separator, not through an escape.
    assert len({engine_key("t", "a:b", "c"), engine_key("t", "a", "b:c")}) == 2
    assert len({engine_key("t", "a%3Ab", "c"), engine_key("t", "a:b", "c")}) == 2


def test_an_engine_key_is_kept_up_to_the_longest_key_and_hashed_past_it() -> None:
    longest = MAX_TEXT_ARG_LENGTH["idempotency_key"]
    fits = "w" * (longest - len("dbos::1"))
    assert engine_key("dbos", fits, "1") == f"dbos:{fits}:1"
    assert len(engine_key("dbos", fits, "1")) == longest
    hashed = engine_key("dbos", fits + "w", "1")
    digest = hashlib.sha256(rfc8785.dumps([fits + "w", "1"])).hexdigest()
    assert hashed == f"dbos-sha256:{digest}"
    # Hashed keys still tell their parts apart, and stay the same on a re-execution.
    assert hashed != engine_key("dbos", fits + "x", "1")
    assert hashed == engine_key("dbos", fits + "w", "1")


@pytest.mark.parametrize(
    ("value", "refused"),
    [
        ("call_12", False),  # one character short of a volatile identifier: may be chance
        ("call_123", True),
        ("call_1234567", True),
        (None, False),
        (12345678, True),  # not only strings
    ],
)
def test_a_key_holding_a_volatile_identifier_is_refused(value: object, refused: bool) -> None:
    key = f"order-1:{value}"
    if not refused:
        refuse_volatile(key, {"tool call id": value})
        return
    with pytest.raises(InvalidArgumentError) as info:
        refuse_volatile(key, {"tool call id": value})
    assert str(info.value) == (
        f"the idempotency key contains the tool call id ({str(value)!r}), which changes when "
        "the step runs again (a retry, a resume, the model asking again): the second run "
        "would get a new key and act twice. Derive the key from the business intent "
        "(an order id, or dataoad.intent_key(scope, action, request)). Nothing was "
        "recorded or invoked"
    )


def test_a_volatile_identifier_elsewhere_is_no_reason_to_refuse() -> None:
    refuse_volatile("order-1", {"tool call id": "call_12345678", "task id": None})
    assert MIN_VOLATILE_LENGTH == 8


def test_a_request_holding_a_volatile_identifier_is_refused_by_name() -> None:
    call_id = "call_Zk3pQ9xY"
    refuse_volatile_request({"order": "o7"}, {"model's tool-call id": call_id})
    refuse_volatile_request({"order": "o7", "short": "call_1"}, {"id": "call_1"})  # < 8
    refuse_volatile_request(object(), {"id": call_id})  # not JSON: execute names it later
    with pytest.raises(InvalidArgumentError, match="request contains the id"):
        refuse_volatile_request({"call": "appel_éèêë1234"}, {"id": "appel_éèêë1234"})
    with pytest.raises(InvalidArgumentError) as info:
        refuse_volatile_request({"order": "o7", "note": f"for {call_id}"}, {"tool id": call_id})
    assert str(info.value).startswith(
        f"the request contains the tool id ({call_id!r}), which changes when the step runs "
        "again: its hash, and a key derived from it, would be new on the second run"
    )
    assert str(info.value).endswith("Nothing was recorded or invoked")


def test_call_ids_are_found_on_any_context_argument() -> None:
    class Context:
        def __init__(self, tool_call_id: object) -> None:
            self.tool_call_id = tool_call_id

    found = call_ids_of({"ctx": Context("call_abcdefgh"), "n": 3, "odd": Context(7)})
    assert found == {"model's tool-call id (ctx.tool_call_id)": "call_abcdefgh"}
    assert call_ids_of({}) == {}


def test_a_stable_key_is_derived_twice_and_held_to_both_rules() -> None:
    keys = iter(["k-1", "k-2"])
    with pytest.raises(InvalidArgumentError, match="changed between two derivations"):
        stable_key(lambda: next(keys), {}, {})
    derived: list[int] = []

    def derive() -> str:
        derived.append(1)
        return "order-1"

    assert stable_key(derive, {"order": 1}, {"id": "call_abcdefgh"}) == "order-1"
    assert len(derived) == 2
    with pytest.raises(InvalidArgumentError, match="idempotency key contains the id"):
        stable_key(lambda: "order-1:call_abcdefgh", {}, {"id": "call_abcdefgh"})
    with pytest.raises(InvalidArgumentError, match="request contains the id"):
        stable_key(lambda: "order-1", {"call": "call_abcdefgh"}, {"id": "call_abcdefgh"})


# -- the step: its checks, its call, and the UNKNOWN rule -------------------------------


def _step(runner: object = None, **options: Any) -> EngineStep:
    arguments: dict[str, Any] = {
        "request": {"order": 1},
        "provider_reference": None,
        "verifier": None,
        "policy": None,
        "wait_in_progress": None,
        **options,
    }
    return EngineStep(
        "DBOS",
        ActionRunner(InMemoryLedger()) if runner is None else runner,
        arguments.pop("action_name", "charge"),
        **arguments,
    )


@pytest.mark.parametrize(
    ("options", "message"),
    [
        (
            {"runner": SyncActionRunner},
            "DBOS steps are async: the runner must be an ActionRunner, not SyncActionRunner",
        ),
        ({"action_name": ""}, "action_name must not be empty"),
        (
            {"request": [1]},
            "request must be a JSON object or a callable of the step's arguments",
        ),
        ({"provider_reference": 7}, "provider_reference must be a str, not int"),
        (
            {"verifier": lambda receipt: None},
            "a verifier needs a provider_reference: it reads the provider by that reference",
        ),
        ({"policy": "twice"}, "policy must be a RetryPolicy or None"),
        ({"risk": 5}, "risk must be a str, not int"),
        (
            {"metadata": [1]},
            "metadata is not JSON-compatible: metadata must be a dict, not list",
        ),
        (
            {"metadata": {"at": float("inf")}},
            'metadata is not JSON-compatible: metadata["at"] is a non-finite float (inf)',
        ),
        (
            {"wait_in_progress": -1},
            "wait_in_progress must be None or seconds in [0, 3600.0], not -1",
        ),
    ],
)
def test_a_step_refuses_bad_options_when_it_is_built(options: dict[str, Any], message: str) -> None:
    options = dict(options)  # the parameter is shared by every run of this test
    runner = options.pop("runner", None)
    if runner is SyncActionRunner:
        with (
            SyncActionRunner(InMemoryLedger()) as sync,
            pytest.raises(InvalidArgumentError) as info,
        ):
            _step(sync, **options)
    else:
        with pytest.raises(InvalidArgumentError) as info:
            _step(**options)
    assert str(info.value) == message


def test_a_step_takes_each_option_it_offers() -> None:
    policy = RetryPolicy(max_attempts=2)
    step = _step(
        provider_reference="ref-1",
        verifier=lambda receipt: None,
        policy=policy,
        wait_in_progress=2.5,
        risk="money",
        metadata={"ticket": 7},
    )
    assert (step.engine, step.action_name, step.policy, step.wait_in_progress) == (
        "DBOS",
        "charge",
        policy,
        2.5,
    )
    assert (step.risk, step.metadata, step.provider_reference) == ("money", {"ticket": 7}, "ref-1")


def test_a_step_needs_an_async_function() -> None:
    def sync_step() -> None: ...

    with pytest.raises(InvalidArgumentError) as info:
        EngineStep.check_function(sync_step, "DBOS")
    assert str(info.value) == (
        f"{sync_step.__qualname__!r} is not async: a guarded DBOS step is an async function "
        "(ActionRunner awaits it on the step's event loop)"
    )
    with pytest.raises(InvalidArgumentError) as info:
        EngineStep.check_function(7, "DBOS")
    assert str(info.value) == "a DBOS step needs a function, not int"
    # A callable without a name of its own is shown as itself.
    unnamed = functools.partial(sync_step)
    with pytest.raises(InvalidArgumentError) as info:
        EngineStep.check_function(unnamed, "DBOS")
    assert str(info.value).startswith(f"{unnamed!r} is not async: ")

    async def async_step() -> None: ...

    EngineStep.check_function(async_step, "DBOS")


async def test_a_step_derives_its_request_and_reference_from_the_call() -> None:
    step = _step(
        request=lambda order, amount=0: {"order": order, "amount": amount},
        provider_reference=lambda order, amount=0: f"ref-{order}-{amount}",
    )

    async def charge(order: str, amount: int = 0) -> str:
        return f"{order}:{amount}"

    arguments = step.arguments("dbos:wf:1", charge, ("o-1",), {"amount": 5})
    assert arguments["request"] == {"order": "o-1", "amount": 5}
    assert arguments["provider_reference"] == "ref-o-1-5"
    # The operation is the step's function with every argument of the call.
    assert await arguments["operation"]() == "o-1:5"
    assert arguments["idempotency_key"] == "dbos:wf:1"
    assert arguments["action_name"] == "charge"


async def test_a_step_answers_confirmed_and_failed_and_raises_unknown() -> None:
    runner = ActionRunner(InMemoryLedger())
    step = _step(runner, provider_reference="ref-1")

    async def ok() -> str:
        return "ch_1"

    async def declined() -> str:
        raise DefinitiveFailure("declined", retryable=False)

    async def lost() -> str:
        raise TimeoutError("lost")

    confirmed = await step.run("k-ok", ok, (), {})
    assert (confirmed.status, confirmed.value) == (ActionStatus.CONFIRMED, "ch_1")
    failed = await step.run("k-failed", declined, (), {})
    assert failed.status is ActionStatus.FAILED
    with pytest.raises(UnresolvedActionError) as info:
        await step.run("k-lost", lost, (), {})
    receipt = info.value.receipt
    assert receipt is not None
    assert receipt.final_status is ActionStatus.UNKNOWN
    assert str(info.value) == (
        f"charge (action id {receipt.action_id}) is UNKNOWN: it may have happened, and the "
        "provider did not confirm it. DBOS must not run it again; settle it read-only (a "
        "verifier, or `dataoad recover`) and decide from the receipt"
    )
    # execute answers whatever the outcome; a re-execution replays, never runs again.
    again = await step.execute("k-lost", lost, (), {})
    assert (again.status, again.replayed) == (ActionStatus.UNKNOWN, True)


def test_a_step_holds_its_metadata_to_the_runner_s_bound_when_it_is_built() -> None:
    runner = ActionRunner(InMemoryLedger(), max_metadata_bytes=32)
    _step(runner, metadata={"note": "x" * 21})  # {"note":"xxx..."}: 32 bytes of JSON
    with pytest.raises(InvalidRequestError, match="max_metadata_bytes=32"):
        _step(runner, metadata={"note": "x" * 22})
