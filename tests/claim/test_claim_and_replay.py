"""Idempotency claims (seed: Idempotency semantics)."""

from __future__ import annotations

import asyncio
import hashlib
from typing import Any

import pytest
import rfc8785

from dataoad import (
    ActionInProgressError,
    ActionPersistenceError,
    ActionReceipt,
    ActionResult,
    ActionRunner,
    ActionStatus,
    IdempotencyConflictError,
    InMemoryLedger,
    ResultValueUnavailableError,
    VerificationResult,
)
from dataoad.testing import FaultyLedger, LedgerFault
from suite_support import (
    FRONT_ENDS_AND_OPERATION_KINDS,
    REF,
    REQUEST,
    CountingOperation,
    call_via,
    confirmed,
    execute,
    fixed_verifier,
)

FAIL = LedgerFault.FAIL_BEFORE_WRITE

FRONT = {"name": "execute"}


@pytest.fixture(autouse=True, params=FRONT_ENDS_AND_OPERATION_KINDS)
def front_end(request: pytest.FixtureRequest) -> None:
    """Every idempotency rule must hold through the decorator and the sync facade too."""
    FRONT["name"] = request.param


class Front:
    """A runner's execute, called through the current front end."""

    def __init__(self, runner: ActionRunner) -> None:
        self.runner = runner

    async def execute(self, action_name: str, operation: Any, **kwargs: Any) -> ActionResult[Any]:
        result: ActionResult[Any] = await call_via(
            FRONT["name"], self.runner, action_name, operation, **kwargs
        )
        return result


def via(runner: ActionRunner) -> Front:
    """The runner as the current front end exposes it."""
    return Front(runner)


async def test_request_hash_is_sha256_of_rfc8785_form() -> None:
    request: dict[str, Any] = {"b": [1, 2.5, "é"], "a": {"z": None, "y": True}}
    result = await ActionRunner(InMemoryLedger()).execute(
        "a", lambda: None, request=request, idempotency_key="k"
    )
    expected = hashlib.sha256(rfc8785.dumps(request)).hexdigest()
    assert result.receipt.request_hash == expected
    # Key order does not matter: the canonical form sorts keys.
    reordered = {"a": {"y": True, "z": None}, "b": [1, 2.5, "é"]}
    replay = await via(ActionRunner(result_ledger := InMemoryLedger())).execute(
        "a", lambda: None, request=reordered, idempotency_key="k"
    )
    assert replay.receipt.request_hash == expected
    assert result_ledger.snapshot()[0].request_hash == expected


async def test_request_hash_matches_rfc8785_vectors_another_language_computes() -> None:
    """The hash is over RFC 8785 bytes written out here, not over whatever the library says.

    The vectors are the ones implementations get wrong: a string that is not
    NFC-normalised (kept as sent, never normalised), an astral character
    (raw UTF-8, and keys sorted by UTF-16 code units, so U+1F600 sorts before
    U+FFFF), ECMAScript number forms, and escaped control characters.
    """
    request = {
        "\U0001f600": "e\u0301",
        "\uffff": 1.0,
        "a": [1e21, 0.1, -0.0],
        "ctl": '\u001f"\\',
    }
    canonical = (
        b'{"a":[1e+21,0.1,0],"ctl":"\\u001f\\"\\\\",'
        b'"\xf0\x9f\x98\x80":"e\xcc\x81","\xef\xbf\xbf":1}'
    )
    result = await via(ActionRunner(InMemoryLedger())).execute(
        "a", lambda: None, request=request, idempotency_key="k"
    )
    assert result.receipt.request_hash == hashlib.sha256(canonical).hexdigest()
    # The composed form is another request: normalising would merge the two.
    composed = await via(ActionRunner(InMemoryLedger())).execute(
        "a", lambda: None, request={**request, "\U0001f600": "\u00e9"}, idempotency_key="k"
    )
    assert composed.receipt.request_hash != result.receipt.request_hash


async def test_completed_duplicate_replays_without_invoking() -> None:
    runner = ActionRunner(InMemoryLedger())
    op = CountingOperation("v1", "v2")
    first = await via(runner).execute("a", op, request=REQUEST, idempotency_key="k")
    second = await via(runner).execute("a", op, request=REQUEST, idempotency_key="k")
    assert op.calls == 1
    assert first.replayed is False
    assert second.replayed is True
    assert second.receipt == first.receipt
    assert second.status is ActionStatus.CONFIRMED
    with pytest.raises(ResultValueUnavailableError):
        _ = second.value


async def test_in_progress_duplicate_raises_without_invoking() -> None:
    runner = ActionRunner(InMemoryLedger())
    started = asyncio.Event()
    release = asyncio.Event()
    calls = 0

    async def slow() -> str:
        nonlocal calls
        calls += 1
        started.set()
        await release.wait()
        return "done"

    first = asyncio.create_task(runner.execute("a", slow, request=REQUEST, idempotency_key="k"))
    await started.wait()
    with pytest.raises(ActionInProgressError) as info:
        await via(runner).execute("a", slow, request=REQUEST, idempotency_key="k")
    assert calls == 1
    assert info.value.receipt.attempts == 1
    assert info.value.action_id == info.value.receipt.action_id
    release.set()
    assert (await first).status is ActionStatus.CONFIRMED


async def test_concurrent_contenders_produce_one_winner() -> None:
    runner = ActionRunner(InMemoryLedger())
    op = CountingOperation()

    async def contender() -> ActionResult[Any] | ActionInProgressError:
        try:
            return await via(runner).execute("a", op, request=REQUEST, idempotency_key="k")
        except ActionInProgressError as exc:
            return exc

    outcomes = await asyncio.gather(*(contender() for _ in range(20)))
    assert op.calls == 1
    assert sum(1 for o in outcomes if not isinstance(o, Exception) and not o.replayed) == 1


async def test_same_key_different_request_is_a_conflict_before_invoking() -> None:
    runner = ActionRunner(InMemoryLedger())
    op = CountingOperation()
    first = await via(runner).execute("a", op, request=REQUEST, idempotency_key="k")
    with pytest.raises(IdempotencyConflictError) as info:
        await via(runner).execute(
            "a", op, request={**REQUEST, "amount_cents": 1}, idempotency_key="k"
        )
    assert op.calls == 1
    assert info.value.action_id == first.receipt.action_id


async def test_same_key_different_request_while_pending_is_a_conflict() -> None:
    runner = ActionRunner(InMemoryLedger())
    gate = asyncio.Event()

    async def slow() -> None:
        await gate.wait()

    task = asyncio.create_task(runner.execute("a", slow, request=REQUEST, idempotency_key="k"))
    await asyncio.sleep(0.01)
    with pytest.raises(IdempotencyConflictError):
        await via(runner).execute("a", slow, request={"other": 1}, idempotency_key="k")
    gate.set()
    await task


async def test_different_provider_reference_is_a_conflict() -> None:
    runner = ActionRunner(InMemoryLedger())
    op = CountingOperation()
    first = await via(runner).execute(
        "a", op, request=REQUEST, idempotency_key="k", provider_reference=REF
    )
    with pytest.raises(IdempotencyConflictError, match="provider reference") as other:
        await via(runner).execute(
            "a", op, request=REQUEST, idempotency_key="k", provider_reference="order-2"
        )
    with pytest.raises(IdempotencyConflictError) as none:
        await via(runner).execute("a", op, request=REQUEST, idempotency_key="k")
    assert op.calls == 1
    # Each conflict names the claim it met, so the caller can look it up.
    assert other.value.receipt == first.receipt
    assert none.value.receipt == first.receipt


async def test_same_key_under_another_action_name_is_another_claim() -> None:
    runner = ActionRunner(InMemoryLedger())
    op = CountingOperation()
    a = await via(runner).execute("refund", op, request=REQUEST, idempotency_key="k")
    b = await via(runner).execute("charge", op, request=REQUEST, idempotency_key="k")
    assert op.calls == 2
    assert a.receipt.action_id != b.receipt.action_id


async def test_unknown_replay_with_verifier_reconciles_read_only() -> None:
    runner = ActionRunner(InMemoryLedger())
    op = CountingOperation(TimeoutError(), "second")
    first = await via(runner).execute(
        "a", op, request=REQUEST, idempotency_key="k", provider_reference=REF
    )
    assert first.status is ActionStatus.UNKNOWN
    verifier = fixed_verifier(confirmed())
    replay = await via(runner).execute(
        "a", op, request=REQUEST, idempotency_key="k", provider_reference=REF, verifier=verifier
    )
    assert op.calls == 1
    assert replay.replayed is True
    assert replay.status is ActionStatus.CONFIRMED
    assert len(verifier.calls) == 1  # type: ignore[attr-defined]


async def test_unknown_replay_without_verifier_stays_unknown() -> None:
    runner = ActionRunner(InMemoryLedger())
    op = CountingOperation(TimeoutError())
    await via(runner).execute("a", op, request=REQUEST, idempotency_key="k")
    replay = await via(runner).execute("a", op, request=REQUEST, idempotency_key="k")
    assert replay.status is ActionStatus.UNKNOWN
    assert replay.replayed is True
    assert op.calls == 1


async def test_an_unproven_claim_carries_the_proposed_claim_and_says_nothing_ran() -> None:
    inner = InMemoryLedger()
    ledger = FaultyLedger(inner)
    ledger.inject("claim", FAIL)
    original_find = ledger.find
    looks = 0

    async def find(
        action_name: str, idempotency_key: str, namespace: str = ""
    ) -> ActionReceipt | None:
        nonlocal looks
        looks += 1
        if looks == 1:  # the read-back after the failed claim write (the claim looks itself)
            raise ConnectionError("read-back failed too")
        return await original_find(action_name, idempotency_key, namespace)

    ledger.find = find  # type: ignore[method-assign]
    op = CountingOperation("ok")
    with pytest.raises(ActionPersistenceError) as info:
        await execute(ActionRunner(ledger), op)
    assert op.calls == 0
    assert info.value.operation_invoked is False
    assert info.value.receipt is not None
    assert info.value.receipt.idempotency_key == "k"
    assert str(info.value).endswith("settles read-only (recover_pending) or by a lease takeover")
    assert await inner.find("charge", "k") is None


class StaleFindLedger(FaultyLedger):
    """Its looks never see an existing claim (a replica that lags).

    The claim write itself answers with the stored claim, so a runner that
    looked first and trusted that look would be the one this catches.
    """

    async def find(
        self, action_name: str, idempotency_key: str, namespace: str = ""
    ) -> ActionReceipt | None:
        self.calls.append("find")
        return None


async def test_a_duplicate_that_loses_the_claim_race_gets_the_stored_claim_answered() -> None:
    ledger = InMemoryLedger()
    first = await execute(
        ActionRunner(ledger),
        CountingOperation(TimeoutError("lost")),
        verifier=fixed_verifier(VerificationResult.unknown(reason="lag")),
    )
    assert first.status is ActionStatus.UNKNOWN
    op = CountingOperation("ok")
    stale = StaleFindLedger(ledger)
    second = await execute(ActionRunner(stale), op, verifier=fixed_verifier(confirmed()))
    assert op.calls == 0
    # The claim write found the stored claim: no look, lagging or not, decided.
    assert stale.calls[0] == "claim"
    assert "find" not in stale.calls
    assert second.replayed is True
    # The duplicate's verifier settled the stored UNKNOWN claim.
    assert second.status is ActionStatus.CONFIRMED
    assert second.receipt.action_id == first.receipt.action_id


async def test_a_failed_first_look_says_nothing_was_invoked() -> None:
    # The look is part of the claim: a ledger that answers neither the
    # claim nor the read-back after it has had nothing invoked against it.
    inner = InMemoryLedger()
    ledger = FaultyLedger(inner)
    ledger.inject("claim", FAIL)
    ledger.inject("find", FAIL)
    op = CountingOperation()
    with pytest.raises(ActionPersistenceError) as info:
        await execute(ActionRunner(ledger), op)
    assert op.calls == 0
    assert info.value.operation_invoked is False
    assert "the operation was not invoked" in str(info.value)
    assert inner.snapshot() == []


async def test_lost_claim_ack_with_competitor_does_not_invoke() -> None:
    inner = InMemoryLedger()
    op = CountingOperation()

    class Racing(FaultyLedger):
        async def claim(self, receipt: ActionReceipt, **lease: Any) -> tuple[ActionReceipt, bool]:
            comp = receipt.evolve(action_id="competitor")
            await inner.claim(comp)
            raise ConnectionError("ack lost")

    with pytest.raises(ActionInProgressError):
        await ActionRunner(Racing(inner)).execute("a", op, request=REQUEST, idempotency_key="k")
    assert op.calls == 0
    # The competitor's claim counts its own attempt 1; this call ran nothing.
    competitor = await inner.get("competitor")
    assert competitor is not None
    assert competitor.attempts == 1


async def test_the_provider_reference_is_never_inferred_from_the_key() -> None:
    """Spec: provider_reference is caller-supplied, never derived from idempotency_key."""
    ledger = InMemoryLedger()
    result = await via(ActionRunner(ledger)).execute(
        "charge", CountingOperation("ok"), request=REQUEST, idempotency_key=REF
    )
    assert result.receipt.provider_reference is None
    [stored] = ledger.snapshot()
    assert stored.provider_reference is None
