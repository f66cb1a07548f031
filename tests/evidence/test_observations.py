"""Verifier answers: what the runner judges them worth, and what it stores of each."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import pytest

from dataoad import (
    ActionRunner,
    ActionStatus,
    ClaimState,
    EventKind,
    InMemoryLedger,
    InvalidArgumentError,
    Ledger,
    VerificationHealth,
    VerificationResult,
)
from suite_support import (
    REF,
    CountingOperation,
    Recorder,
    closing,
    confirmed,
    execute,
    fixed_verifier,
    reconciled_at_once,
    stranded,
    unknown,
)

C, F, U = ActionStatus.CONFIRMED, ActionStatus.FAILED, ActionStatus.UNKNOWN


async def test_a_stored_observation_keeps_every_field_of_the_verifier_answer() -> None:
    answer = VerificationResult.absent(
        verified_provider_reference=REF,
        retry_safe=False,
        health=VerificationHealth.DEGRADED,
        conclusive_absence=False,
        details={"region": "eu"},
    )
    result = await execute(
        ActionRunner(InMemoryLedger()),
        CountingOperation(TimeoutError("lost")),
        verifier=fixed_verifier(answer),
    )
    observation = result.receipt.metadata["verification"]
    assert observation["source"] == "execute"
    assert observation["attempt"] == 1
    assert observation["claimed"] == "FAILED"
    assert observation["health"] == "DEGRADED"
    assert observation["conclusive_absence"] is False
    assert observation["retry_safe"] is False
    assert observation["verified_provider_reference"] == REF
    assert observation["provider_request_id"] is None
    assert observation["details"] == {"region": "eu"}
    assert result.receipt.metadata["verification_observations"] == (observation,)


@pytest.mark.parametrize(("size", "kept"), [(3990, True), (4100, False)])
async def test_observation_details_are_kept_only_while_small(size: int, kept: bool) -> None:
    # The bound is measured on compact JSON: "{"d":"xxx"}" is the text plus 8.
    details = {"d": "é" * (size - 8)}

    result = await execute(
        ActionRunner(InMemoryLedger()),
        CountingOperation(TimeoutError("lost")),
        verifier=fixed_verifier(
            VerificationResult.confirmed(verified_provider_reference=REF, details=details)
        ),
    )
    stored = result.receipt.metadata["verification"]["details"]
    assert stored == (details if kept else {"truncated": True})


async def test_details_exactly_at_the_bound_are_kept() -> None:
    details = {"d": "x" * (4000 - 8)}

    result = await execute(
        ActionRunner(InMemoryLedger()),
        CountingOperation(TimeoutError("lost")),
        verifier=fixed_verifier(
            VerificationResult.confirmed(verified_provider_reference=REF, details=details)
        ),
    )
    assert result.receipt.metadata["verification"]["details"] == details


async def test_a_raising_or_malformed_verifier_is_recorded_as_an_unknown_observation(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The receipt stores the exception's type only (its message may carry a provider's
    values, e.g. a URL with a customer id); the log gets the message, bounded."""

    for answer, problem in [
        (
            RuntimeError("GET /v1/charges?customer=cus_42 failed"),
            "verifier raised RuntimeError",
        ),
        ("not a result", "verifier returned str, not a VerificationResult"),
    ]:
        result = await execute(
            ActionRunner(InMemoryLedger()),
            CountingOperation(TimeoutError("lost")),
            verifier=fixed_verifier(answer),
        )
        observation = result.receipt.metadata["verification"]
        assert observation["source"] == "execute"
        assert observation["attempt"] == 1
        assert observation["status"] == "UNKNOWN"
        assert observation["provider_request_id"] is None
        assert observation["error"] == problem
        assert "cus_42" not in repr(result.receipt)
        assert result.receipt.verification_status is ActionStatus.UNKNOWN
    said = [r.getMessage() for r in caplog.records if "verification_failed" in r.getMessage()]
    assert len(said) == 2
    assert "RuntimeError: GET /v1/charges?customer=cus_42 failed" in said[0]


async def test_an_unbound_confirmation_is_recorded_with_the_reason() -> None:
    result = await execute(
        ActionRunner(InMemoryLedger()),
        CountingOperation(TimeoutError("lost")),
        verifier=fixed_verifier(confirmed(ref="another-order")),
    )
    observation = result.receipt.metadata["verification"]
    assert observation["status"] == "UNKNOWN"
    assert "another-order" in observation["error"]
    assert result.status is ActionStatus.UNKNOWN


async def test_an_unknown_answer_for_another_reference_is_not_a_binding_problem() -> None:
    answer = VerificationResult.unknown(reason="queue lag", verified_provider_reference="x")
    result = await execute(
        ActionRunner(InMemoryLedger()),
        CountingOperation(TimeoutError("lost")),
        verifier=fixed_verifier(answer),
    )
    observation = result.receipt.metadata["verification"]
    assert observation["status"] == "UNKNOWN"
    assert observation["reason"] == "queue lag"
    assert observation["verified_provider_reference"] == "x"
    assert "error" not in observation


def test_confirmed_and_absent_answers_must_name_the_reference() -> None:
    for build in (VerificationResult.confirmed, VerificationResult.absent):
        with pytest.raises(
            InvalidArgumentError, match=r"^verified_provider_reference must be a str"
        ):
            build(verified_provider_reference=None)  # type: ignore[arg-type]


def test_each_field_of_a_verifier_answer_is_kept() -> None:
    answer = VerificationResult.absent(
        verified_provider_reference=REF,
        health=VerificationHealth.DEGRADED,
        details={"a": 1},
    )
    assert answer.health is VerificationHealth.DEGRADED
    assert answer.details == {"a": 1}
    answer = VerificationResult.confirmed(verified_provider_reference=REF, details={"b": 2})
    assert answer.details == {"b": 2}
    answer = VerificationResult.unknown(
        reason="lag", health=VerificationHealth.DEGRADED, verified_provider_reference=REF
    )
    assert answer.health is VerificationHealth.DEGRADED
    assert answer.verified_provider_reference == REF


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"outcome": "CONFIRMED"}, "outcome must be an ActionStatus"),
        ({"health": "HEALTHY"}, "health must be a VerificationHealth"),
        ({"retry_safe": 1}, "retry_safe must be a bool"),
        ({"conclusive_absence": None}, "conclusive_absence must be a bool"),
        ({"verified_provider_reference": 7}, "verified_provider_reference must be a str, not int"),
        ({"provider_request_id": ""}, "provider_request_id must not be empty"),
        ({"reason": b"x"}, "reason must be a str"),
        (
            {"details": {"x": object()}},
            'verification details are not JSON-compatible: details["x"] has unsupported type',
        ),
    ],
)
def test_a_malformed_verifier_answer_names_the_field(fields: dict[str, Any], message: str) -> None:
    base: dict[str, Any] = {"outcome": ActionStatus.UNKNOWN}
    with pytest.raises(InvalidArgumentError) as info:
        VerificationResult(**{**base, **fields})
    assert str(info.value).startswith(message)


def test_an_unknown_answer_needs_a_textual_reason() -> None:
    with pytest.raises(InvalidArgumentError) as info:
        VerificationResult.unknown(reason=3)  # type: ignore[arg-type]
    assert str(info.value) == "reason must be a str"


async def test_observations_and_recoveries_are_timestamped() -> None:
    from datetime import datetime

    ledger = InMemoryLedger()
    stuck = await stranded(ledger)
    recovered = await ActionRunner(ledger).recover_pending(
        stuck.action_id, fixed_verifier(confirmed())
    )
    metadata = recovered.receipt.metadata
    assert datetime.fromisoformat(metadata["verification"]["observed_at"])
    assert datetime.fromisoformat(metadata["recovery"]["recovered_at"])


async def test_observation_details_are_measured_as_compact_json() -> None:
    # 370 keys: with wider separators the same details would exceed the bound.
    details = {f"k{i:03d}": i for i in range(370)}
    import json

    assert len(json.dumps(details, separators=(",", ":"))) <= 4000 < len(json.dumps(details))

    result = await execute(
        ActionRunner(InMemoryLedger()),
        CountingOperation(TimeoutError("lost")),
        verifier=fixed_verifier(
            VerificationResult.confirmed(verified_provider_reference=REF, details=details)
        ),
    )
    assert result.receipt.metadata["verification"]["details"] == details
    assert result.receipt.updated_at >= result.receipt.attempt_records[-1].finished_at


async def test_verifier_reason_is_bounded() -> None:
    r = ActionRunner(InMemoryLedger())
    res = await r.execute(
        "a",
        CountingOperation(TimeoutError()),
        request={},
        idempotency_key="k",
        provider_reference=REF,
        verifier=fixed_verifier(VerificationResult.unknown(reason="z" * 50_000)),
    )
    assert len(res.receipt.metadata["verification"]["reason"]) <= 1000


async def test_large_verifier_details_not_stored() -> None:
    r = ActionRunner(InMemoryLedger())
    res = await r.execute(
        "a",
        CountingOperation(TimeoutError()),
        request={},
        idempotency_key="k",
        provider_reference=REF,
        verifier=fixed_verifier(
            VerificationResult.unknown(reason="x", details={"blob": "b" * 10_000})
        ),
    )
    assert res.receipt.metadata["verification"]["details"] == {"truncated": True}


async def test_untrusted_confirmation_request_id_not_retained() -> None:
    r = ActionRunner(InMemoryLedger())
    bad = VerificationResult(
        outcome=C,
        health=VerificationHealth.DEGRADED,
        verified_provider_reference=REF,
        provider_request_id="pr_x",
    )
    res = await r.execute(
        "a",
        CountingOperation(TimeoutError()),
        request={},
        idempotency_key="k",
        provider_reference=REF,
        verifier=fixed_verifier(bad),
    )
    assert res.status is U
    assert tuple(res.receipt.metadata["provider_request_ids"]) == ()
    assert res.receipt.provider_request_id is None


async def test_oversized_verifier_identifiers_are_refused_and_stay_unknown() -> None:
    from dataoad import InvalidArgumentError

    with pytest.raises(InvalidArgumentError):
        VerificationResult.confirmed(verified_provider_reference="r" * 1001)

    def verify(receipt: object) -> VerificationResult:
        return VerificationResult.confirmed(
            verified_provider_reference=REF, provider_request_id="p" * 100_000
        )

    r = ActionRunner(InMemoryLedger())
    res = await r.execute(
        "a",
        CountingOperation(TimeoutError()),
        request={},
        idempotency_key="k",
        provider_reference=REF,
        verifier=verify,
    )
    assert res.status is U
    assert len(str(res.receipt.metadata)) < 5000


def _forged(**fields: Any) -> VerificationResult:
    """A confirmation whose fields were changed after its own checks ran (as a buggy
    adapter could, through object.__setattr__): the runner must not trust the checks."""
    result = VerificationResult.confirmed(verified_provider_reference=REF, details={"ok": 1})
    for name, value in fields.items():
        object.__setattr__(result, name, value)
    return result


@pytest.mark.parametrize(
    "fields",
    [
        {"provider_request_id": "pr\x00hidden"},
        {"details": {"ratio": float("nan")}},
        {"details": {"when": {1, 2}}},
        {"details": {"note": "half a pair \ud800"}},
    ],
    ids=["NUL in an identifier", "NaN", "a set", "a lone surrogate"],
)
async def test_an_answer_no_ledger_can_store_counts_as_no_evidence(
    new_ledger: Any, fields: dict[str, Any]
) -> None:
    """What passes the check is exactly what the ledgers' encoder writes: an answer it
    would refuse is recorded as an UNKNOWN observation, and the outcome still lands."""
    ledger = new_ledger()
    try:
        result = await execute(
            ActionRunner(ledger),
            CountingOperation(TimeoutError("lost")),
            verifier=fixed_verifier(_forged(**fields)),
        )
        assert await ledger.get(result.receipt.action_id) == result.receipt
    finally:
        await ledger.close()
    assert result.status is U
    observation = result.receipt.metadata["verification"]
    assert observation["status"] == "UNKNOWN"
    assert observation["attempt"] == 1
    assert "no ledger can store" in observation["error"]


async def test_stored_observation_details_cannot_be_changed_afterwards() -> None:
    details = {"region": "eu", "tags": ["a"]}
    result = await execute(
        ActionRunner(InMemoryLedger()),
        CountingOperation(TimeoutError("lost")),
        verifier=fixed_verifier(_forged(details=details)),
    )
    details["region"] = "us"  # the adapter's own dict, changed after the answer
    kept = result.receipt.observations[-1].details
    assert kept["region"] == "eu"
    with pytest.raises(TypeError):
        kept["region"] = "us"


class EqualsAnything(str):
    """A str subclass that claims equality with any reference."""

    __hash__ = str.__hash__

    def __eq__(self, other: object) -> bool:
        return True

    def __ne__(self, other: object) -> bool:
        return False


async def test_a_forged_reference_that_equals_everything_binds_nothing() -> None:
    """Binding compares plain strings: a str subclass that claims equality with any
    reference (forged into an answer after its checks) is not a binding."""
    from dataoad._verification import classify_fields

    claim = (ActionStatus.CONFIRMED, VerificationHealth.HEALTHY, False, False)
    assert classify_fields(*claim, EqualsAnything("other"), REF) is U  # the rule itself
    assert classify_fields(*claim, REF, REF) is C
    result = await execute(
        ActionRunner(InMemoryLedger()),
        CountingOperation(TimeoutError("lost")),
        verifier=fixed_verifier(_forged(verified_provider_reference=EqualsAnything("other"))),
    )
    assert result.status is U  # and the runner, which also refuses to store it


async def test_a_verifier_with_no_answer_leaves_a_completed_receipt_as_it_was(
    new_ledger: Callable[[], Ledger], caplog: pytest.LogCaptureFixture
) -> None:
    """ "Could not verify" is not an observation of the provider: reconciling or recovering
    a completed UNKNOWN receipt with a verifier that raises, times out or answers with
    something else writes nothing (the log says why), however often it is tried; a
    real answer afterwards still settles it."""
    ledger = new_ledger()
    first = await unknown(ledger)
    before = await ledger.get(first.receipt.action_id)
    assert before is not None
    runner = ActionRunner(ledger, verifier_timeout=0.05)

    async def too_slow(receipt: Any) -> Any:
        await asyncio.sleep(1)

    for verifier in (
        fixed_verifier(ConnectionError("GET https://api.example/charges?c=cus_42")),
        fixed_verifier("not a result"),
        too_slow,
    ):
        for verb in (runner.reconcile, runner.recover_pending):
            result = await verb(first.receipt.action_id, verifier)
            assert result.status is ActionStatus.UNKNOWN
            assert result.replayed is False  # an operator's verb, not a replay
            assert result.receipt == before
            assert await ledger.get(first.receipt.action_id) == before
        # A caller retrying the key replays it, verified again to no avail.
        again = await execute(runner, CountingOperation("never"), verifier=verifier)
        assert again.replayed is True
        assert again.status is ActionStatus.UNKNOWN
        assert again.receipt == before
    failed = [r.getMessage() for r in caplog.records if "verification_failed" in r.getMessage()]
    assert len(failed) == 9
    assert "cus_42" in failed[0]
    # A runner with the default time limit: 0.05 s is too short for a thread
    # hop on a loaded machine (a mutation run's tracing once made it time out).
    settled = await ActionRunner(ledger).reconcile(
        first.receipt.action_id, fixed_verifier(confirmed())
    )
    assert settled.status is ActionStatus.CONFIRMED
    assert len(settled.receipt.observations) == len(before.observations) + 1
    await closing(ledger)


async def test_a_verifier_with_no_answer_still_settles_a_stranded_claim_as_unknown(
    new_ledger: Callable[[], Ledger],
) -> None:
    """A PENDING claim must be completed: it is, as UNKNOWN, with the exception's type."""
    ledger = new_ledger()
    receipt = await stranded(ledger)
    result = await ActionRunner(ledger).recover_pending(
        receipt.action_id, fixed_verifier(ConnectionError("cus_42"))
    )
    assert result.status is ActionStatus.UNKNOWN
    assert result.receipt.claim_state is ClaimState.COMPLETED
    assert result.receipt.observations[-1].error == "verifier raised ConnectionError"
    assert "cus_42" not in repr(await ledger.get(receipt.action_id))
    await closing(ledger)


async def test_the_newest_observation_is_kept_even_when_no_older_one_may_go(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Trimming drops the oldest that prove nothing new, never the newest (the receipt's
    ``verification``), even when every older one must stay and the bound is passed."""
    import dataoad._evidence as evidence

    monkeypatch.setattr(evidence, "MAX_KEPT_OBSERVATIONS", 3)
    runner = ActionRunner(InMemoryLedger())

    async def lost() -> None:
        raise TimeoutError("response lost")

    first = await runner.execute(
        "charge", lost, request={}, idempotency_key="k", provider_reference=REF
    )
    action_id = first.receipt.action_id
    # Two readers at once: a retry-safe absence and a confirmation contradict each
    # other (UNKNOWN, both kept); a later confirmation names another request. Each
    # decides the status, the conflict or a request id, so none may be dropped.
    absent = VerificationResult.absent(verified_provider_reference=REF, retry_safe=True)
    await reconciled_at_once(runner, action_id, absent, confirmed(rid="pr_a"))
    await runner.reconcile(action_id, fixed_verifier(confirmed(rid="pr_b")))
    down = VerificationResult.unknown(verified_provider_reference=REF, reason="down")
    await runner.reconcile(action_id, fixed_verifier(down))
    stored = await runner.receipt(action_id)
    kept = stored.metadata["verification_observations"]
    assert len(kept) == 4  # over the bound: nothing older could go
    assert kept[-1] == stored.metadata["verification"]
    assert kept[-1]["health"] == "UNAVAILABLE"


async def _slowly_confirmed(receipt: Any) -> VerificationResult:
    await asyncio.sleep(0.3)
    return confirmed()


async def _its_own_timeout(receipt: Any) -> VerificationResult:
    raise TimeoutError("the provider's read timed out")


@pytest.mark.parametrize(
    ("verifier", "time_limit", "stored", "said"),
    [
        (
            fixed_verifier("not a result"),
            30.0,
            "verifier returned str, not a VerificationResult",
            "verifier returned str, not a VerificationResult",
        ),
        (
            fixed_verifier(_forged(provider_request_id="pr\x00hidden")),
            30.0,
            "verifier returned a VerificationResult that no ledger can store",
            "verifier returned a VerificationResult that no ledger can store",
        ),
        (
            _slowly_confirmed,
            0.05,
            "verifier raised TimeoutError: no answer within 0.05 s",
            "verifier raised TimeoutError: no answer within 0.05 s",
        ),
        (
            _its_own_timeout,
            30.0,
            "verifier raised TimeoutError",
            "TimeoutError: the provider's read timed out",
        ),
    ],
    ids=["not a result", "unstorable", "past the time limit", "its own TimeoutError"],
)
async def test_a_verifier_without_a_usable_answer_is_stored_and_announced_as_such(
    verifier: Any, time_limit: float, stored: str, said: str
) -> None:
    seen = Recorder()
    result = await execute(
        ActionRunner(InMemoryLedger(), observers=[seen], verifier_timeout=time_limit),
        CountingOperation(TimeoutError("lost")),
        verifier=verifier,
    )
    assert result.status is U
    assert result.receipt.metadata["verification"]["error"] == stored
    (event,) = seen.of(EventKind.VERIFICATION_FAILED)
    assert event.receipt is not None
    assert event.receipt.action_id == result.receipt.action_id
    assert event.fields["source"] == "execute"
    assert event.fields["said"] == said


async def test_without_a_time_limit_a_slow_verifier_is_waited_for() -> None:
    result = await execute(
        ActionRunner(InMemoryLedger(), verifier_timeout=None),
        CountingOperation(TimeoutError("lost")),
        verifier=_slowly_confirmed,
    )
    assert result.status is C
