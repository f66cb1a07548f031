"""The framework-neutral tool layer: what the model reads for every outcome."""

from __future__ import annotations

import asyncio
import datetime as dt
import subprocess
import sys
from collections.abc import Callable
from typing import Any

import pytest

from dataoad import (
    ActionResult,
    ActionRunner,
    DefinitiveFailure,
    InMemoryLedger,
    InvalidArgumentError,
    ToolOutcome,
    VerificationResult,
    describe_result,
    run_tool,
)
from dataoad._tool import MAX_VALUE_CHARS
from dataoad.testing import FaultyLedger, LedgerFault, ManualClock
from suite_support import REQUEST, unstarted


async def ok() -> dict[str, str]:
    return {"charge_id": "ch_1"}


def call(runner: ActionRunner, operation: object, **kwargs: object) -> ToolOutcome:
    options = {"request": REQUEST, "idempotency_key": "order-1", **kwargs}
    return asyncio.run(run_tool(runner, "charge", operation, action="the charge", **options))  # type: ignore[arg-type]


def test_confirmed_carries_the_value_then_replays_without_it() -> None:
    runner = ActionRunner(InMemoryLedger())
    first = call(runner, ok)
    assert first.status == "CONFIRMED"
    assert first.value == {"charge_id": "ch_1"}
    assert first.message.startswith("CONFIRMED: the charge happened (action id ")
    assert '"charge_id": "ch_1"' in first.message
    again = call(runner, ok)
    assert again.replayed
    assert again.value is None
    assert "already happened earlier" in again.message
    assert again.action_id == first.action_id


def test_failed_says_it_did_not_happen_and_how_to_retry() -> None:
    async def declined() -> None:
        raise DefinitiveFailure("card declined", retryable=False)

    outcome = call(ActionRunner(InMemoryLedger()), declined)
    assert outcome.status == "FAILED"
    assert "did not happen" in outcome.message
    assert "card declined" in outcome.message
    assert "needs a new request" in outcome.message


def test_unknown_says_do_not_call_again() -> None:
    async def lost() -> None:
        raise TimeoutError("response lost")

    outcome = call(ActionRunner(InMemoryLedger()), lost)
    assert outcome.status == "UNKNOWN"
    assert "may have happened" in outcome.message
    assert "Do NOT call this tool again" in outcome.message
    assert outcome.action_id is not None
    assert outcome.action_id in outcome.message


def test_unknown_promises_a_verification_only_when_a_verifier_is_set() -> None:
    async def lost() -> None:
        raise TimeoutError("response lost")

    def verifier(receipt: object) -> object:  # an answer that settles nothing: UNKNOWN stays
        raise RuntimeError("the provider cannot be reached")

    without = call(ActionRunner(InMemoryLedger()), lost)
    assert "verified" not in without.message, without.message
    assert "no verifier is set" in without.message
    assert "an operator must check it" in without.message
    with_one = call(
        ActionRunner(InMemoryLedger()), lost, verifier=verifier, provider_reference="ref_1"
    )
    assert with_one.status == "UNKNOWN"
    assert "It will be verified read-only" in with_one.message


async def test_in_progress_and_conflict_are_outcomes_not_exceptions() -> None:
    runner = ActionRunner(InMemoryLedger())
    started, release = asyncio.Event(), asyncio.Event()

    async def held() -> None:
        started.set()
        await release.wait()

    holder = asyncio.create_task(
        run_tool(runner, "charge", held, request=REQUEST, idempotency_key="k")
    )
    await started.wait()
    busy = await run_tool(runner, "charge", ok, request=REQUEST, idempotency_key="k")
    clash = await run_tool(runner, "charge", ok, request={"other": 1}, idempotency_key="k")
    release.set()
    await holder
    assert busy.status == "IN_PROGRESS"
    assert "Do NOT call again" in busy.message
    assert clash.status == "CONFLICT"
    assert "Nothing was done" in clash.message


async def legacy_unstarted_taken_over() -> FaultyLedger:
    """Key "order-1" held by an expired claim whose attempt 1 never started (a v0.1 runner's)."""
    clock = ManualClock()
    inner = InMemoryLedger(clock=clock)
    await unstarted(inner, "order-1", provider_reference=None, owner="v0.1-worker", lease=1.0)
    clock.advance(1.0)
    return FaultyLedger(inner)


def test_unrecorded_outcomes_say_whether_anything_ran() -> None:
    # Attempt 1 is counted by the claim itself now: the writes before anything
    # runs are the claim, and the attempt start of a takeover of a legacy claim.
    taking_over = asyncio.run(legacy_unstarted_taken_over())
    taking_over.inject("start_attempt", LedgerFault.FAIL_BEFORE_WRITE)
    assert call(ActionRunner(taking_over), ok).status == "NOT_ATTEMPTED"
    before = FaultyLedger(InMemoryLedger())
    before.inject("claim", LedgerFault.FAIL_BEFORE_WRITE)
    assert call(ActionRunner(before), ok).status == "NOT_ATTEMPTED"
    after = FaultyLedger(InMemoryLedger())
    after.inject("record", LedgerFault.FAIL_BEFORE_WRITE)
    outcome = call(ActionRunner(after), ok)
    assert outcome.status == "UNKNOWN"
    assert "could not be recorded" in outcome.message


def test_an_unrecorded_check_of_an_attempted_action_is_never_not_attempted() -> None:
    """A replay's read-only check that cannot be recorded invoked nothing itself, but the
    claim it replays counted an attempt: the model must read UNKNOWN, never "not attempted"
    (which invites a new request, and a second charge)."""
    ledger = FaultyLedger(InMemoryLedger())
    runner = ActionRunner(ledger)

    async def lost() -> None:
        raise TimeoutError("the answer was lost")

    async def confirms(receipt: object) -> VerificationResult:
        return VerificationResult.confirmed(verified_provider_reference="ref-1")

    first = call(runner, lost, provider_reference="ref-1")
    assert first.status == "UNKNOWN"
    ledger.inject("record", LedgerFault.FAIL_BEFORE_WRITE)  # the check's merge write
    replay = call(runner, lost, provider_reference="ref-1", verifier=confirms)
    assert replay.status == "UNKNOWN", replay.message
    assert replay.action_id == first.action_id
    assert "Do NOT call this tool again" in replay.message
    # A refusal before any claim counted an attempt is the only "not attempted".
    # (The lookup is folded into the claim now: the refusal is the claim write's.)
    fresh = FaultyLedger(InMemoryLedger())
    fresh.inject("claim", LedgerFault.FAIL_BEFORE_WRITE)
    assert call(ActionRunner(fresh), ok).status == "NOT_ATTEMPTED"


def test_bad_arguments_still_raise() -> None:
    with pytest.raises(InvalidArgumentError):
        call(ActionRunner(InMemoryLedger()), ok, idempotency_key="")


def test_positional_only_tools_are_refused() -> None:
    from dataoad import GuardedTool
    from dataoad.integrations._common import tool_function

    def positional(order_id: str, /) -> None: ...

    guard = GuardedTool(ActionRunner(InMemoryLedger()), "a", lambda **k: "k", lambda **k: {})
    with pytest.raises(TypeError, match="keyword"):
        tool_function(guard, positional)


def test_a_guarded_tool_refuses_what_it_cannot_await_when_built() -> None:
    from dataoad import GuardedTool, InvalidArgumentError, SyncActionRunner

    keyed: tuple[Callable[..., str], Callable[..., dict[str, Any]]] = (
        lambda **k: "k",
        lambda **k: {},
    )
    with (
        SyncActionRunner(InMemoryLedger()) as sync_runner,
        pytest.raises(InvalidArgumentError, match="not SyncActionRunner"),
    ):
        GuardedTool(sync_runner, "a", *keyed)  # type: ignore[arg-type]
    with pytest.raises(InvalidArgumentError, match="idempotency_key must be a callable"):
        GuardedTool(ActionRunner(InMemoryLedger()), "a", "k", keyed[1])  # type: ignore[arg-type]
    with pytest.raises(InvalidArgumentError, match="provider_reference"):
        GuardedTool(ActionRunner(InMemoryLedger()), "a", *keyed, provider_reference="r")  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("module", "framework", "extra"),
    [
        ("pydantic_ai", "pydantic_ai", "pydantic-ai"),
        ("openai_agents", "agents", "openai-agents"),
        ("langgraph", "langchain_core.tools", "langgraph"),
        ("mcp", "mcp", "mcp"),
        ("otel", "opentelemetry.trace", "otel"),
    ],
)
def test_an_adapter_without_its_framework_names_the_extra(
    module: str, framework: str, extra: str
) -> None:
    code = (
        f"import sys; sys.modules[{framework!r}] = None\n"
        "import dataoad\n"
        "try:\n"
        f"    import dataoad.integrations.{module}\n"
        "except dataoad.MissingExtraError as exc:\n"
        "    print(exc)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120
    )
    assert f"'{extra}' extra" in done.stdout
    assert f'pip install -e ".[{extra}]"' in done.stdout


def test_the_testing_helpers_without_hypothesis_name_the_extra() -> None:
    code = (
        "import sys; sys.modules['hypothesis'] = None\n"
        "import dataoad, dataoad.testing\n"
        "print(dataoad.testing.FakePaymentProvider.__name__)\n"
        "try:\n"
        "    from dataoad.testing import adapter_test_case\n"
        "except dataoad.MissingExtraError as exc:\n"
        "    print('MissingExtraError:', exc)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120
    )
    assert done.stdout.startswith("FakePaymentProvider\n")  # the fakes need no extra
    assert "MissingExtraError:" in done.stdout
    assert "'testing' extra" in done.stdout
    assert 'pip install -e ".[testing]"' in done.stdout


def test_the_core_imports_no_framework() -> None:
    code = (
        "import sys, dataoad, dataoad.testing\n"
        "loaded = [m for m in ('pydantic_ai', 'agents', 'langgraph', 'langchain_core', 'mcp')"
        " if m in sys.modules]\n"
        "print(loaded)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120
    )
    assert done.stdout.strip() == "[]"


@pytest.mark.parametrize(
    ("length", "shown"),
    [(MAX_VALUE_CHARS - 1, "whole"), (MAX_VALUE_CHARS, "whole"), (MAX_VALUE_CHARS + 1, "cut")],
)
def test_a_confirmed_value_is_shown_up_to_its_bound_and_cut_past_it(
    length: int, shown: str
) -> None:
    # The JSON text of a string is the string in quotes: two characters more.
    value = "v" * (length - 2)

    async def returns() -> str:
        return value

    outcome = call(ActionRunner(InMemoryLedger()), returns)
    assert outcome.value == value  # the caller's value is never cut
    text = outcome.message.split(" Result: ", 1)[1]
    if shown == "whole":
        assert text == f'"{value}"'
    else:
        assert text == f'"{value}'[: MAX_VALUE_CHARS - 1] + "\u2026"
        assert len(text) == MAX_VALUE_CHARS


def test_a_value_is_shown_as_json_text_as_written_or_its_repr() -> None:
    class Circular(dict[str, Any]):
        def __repr__(self) -> str:
            return "<circular>"

    looped = Circular()
    looped["self"] = looped
    shown = {}
    for name, value in (("unicode", {"name": "café"}), ("date", [dt.date(2026, 12, 6)])):

        async def returns(value: Any = value) -> Any:
            return value

        shown[name] = call(ActionRunner(InMemoryLedger()), returns, idempotency_key=name)

    async def circular() -> Any:
        return looped

    shown["circular"] = call(ActionRunner(InMemoryLedger()), circular)
    assert shown["unicode"].message.endswith(' Result: {"name": "café"}')
    assert shown["date"].message.endswith(' Result: ["2026-12-06"]')
    assert shown["circular"].message.endswith(" Result: <circular>")


def test_no_value_is_shown_where_none_is_available() -> None:
    async def lost() -> str:
        raise TimeoutError("lost")

    unknown = call(
        ActionRunner(InMemoryLedger()),
        lost,
        provider_reference="order-1",
        verifier=lambda receipt: VerificationResult.unknown(reason="not yet"),
    )
    assert unknown.status == "UNKNOWN"
    assert unknown.value is None
    assert "Result:" not in unknown.message
    # CONFIRMED with no correlated value (the first call's result, its value not kept):
    # said to have happened, with no value and no error.
    runner = ActionRunner(InMemoryLedger())
    confirmed = asyncio.run(runner.execute("charge", ok, request=REQUEST, idempotency_key="k"))
    bare = describe_result(ActionResult(confirmed.receipt), "the charge")
    assert bare.status == "CONFIRMED"
    assert bare.value is None
    assert bare.message.startswith("CONFIRMED: the charge happened (action id ")
    assert "Result:" not in bare.message
