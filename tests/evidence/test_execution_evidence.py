"""How one execution's outcome becomes evidence (seed: State semantics)."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest

from dataoad import (
    ActionResult,
    ActionRunner,
    ActionStatus,
    DefinitiveFailure,
    InMemoryLedger,
    InvalidArgumentError,
    UnresolvedActionError,
    VerificationHealth,
    VerificationResult,
)
from suite_support import (
    FRONT_ENDS_AND_OPERATION_KINDS,
    REF,
    REQUEST,
    CountingOperation,
    call_via,
    confirmed,
    fenced_absent,
    fixed_verifier,
)

FRONT = {"name": "execute"}


@pytest.fixture(autouse=True, params=FRONT_ENDS_AND_OPERATION_KINDS)
def front_end(request: pytest.FixtureRequest) -> None:
    """Every evidence rule must hold through the decorator and the sync facade too."""
    FRONT["name"] = request.param


async def execute(runner: ActionRunner, op: Any, **kw: Any) -> ActionResult[Any]:
    kw.setdefault("request", REQUEST)
    kw.setdefault("idempotency_key", "k1")
    result: ActionResult[Any] = await call_via(FRONT["name"], runner, "charge", op, **kw)
    return result


@pytest.mark.parametrize(
    "exc",
    [
        TimeoutError("timed out"),
        ConnectionResetError("reset"),
        ValueError("malformed response"),
        KeyError("missing field"),
        RuntimeError("anything else"),
    ],
)
async def test_ordinary_exception_after_invocation_is_unknown(exc: Exception) -> None:
    op = CountingOperation(exc)
    result = await execute(ActionRunner(InMemoryLedger()), op)
    assert result.status is ActionStatus.UNKNOWN
    assert result.receipt.execution_status is ActionStatus.UNKNOWN
    assert op.calls == 1
    with pytest.raises(UnresolvedActionError):
        _ = result.value


async def test_only_definitive_failure_is_failed() -> None:
    op = CountingOperation(DefinitiveFailure("declined"))
    result = await execute(ActionRunner(InMemoryLedger()), op)
    assert result.status is ActionStatus.FAILED
    assert result.receipt.execution_status is ActionStatus.FAILED
    assert result.receipt.error == "DefinitiveFailure: declined"


@pytest.mark.parametrize("falsey", [None, 0, "", False, [], {}])
async def test_normal_return_without_verifier_is_confirmed_even_when_falsey(falsey: object) -> None:
    op = CountingOperation(falsey)
    result = await execute(ActionRunner(InMemoryLedger()), op)
    assert result.status is ActionStatus.CONFIRMED
    assert result.value == falsey
    assert result.value_available is True


async def test_sync_operation_is_supported() -> None:
    result = await execute(ActionRunner(InMemoryLedger()), lambda: 42)
    assert result.status is ActionStatus.CONFIRMED
    assert result.value == 42


async def test_normal_return_with_verifier_is_unknown_until_verifier_decides() -> None:
    verifier = fixed_verifier(VerificationResult.unknown(reason="read path down"))
    op = CountingOperation("charged")
    result = await execute(
        ActionRunner(InMemoryLedger()), op, provider_reference=REF, verifier=verifier
    )
    assert result.receipt.execution_status is ActionStatus.UNKNOWN
    assert result.status is ActionStatus.UNKNOWN
    assert len(verifier.calls) == 1  # type: ignore[attr-defined]


async def test_normal_return_with_verifier_confirmed_by_bound_evidence() -> None:
    op = CountingOperation("charged")
    result = await execute(
        ActionRunner(InMemoryLedger()),
        op,
        provider_reference=REF,
        verifier=fixed_verifier(confirmed()),
    )
    assert result.receipt.execution_status is ActionStatus.UNKNOWN
    assert result.receipt.verification_status is ActionStatus.CONFIRMED
    assert result.status is ActionStatus.CONFIRMED
    assert result.value == "charged"  # the direct value of this execution


async def test_normal_return_with_verifier_can_be_failed_by_fenced_absence() -> None:
    result = await execute(
        ActionRunner(InMemoryLedger()),
        CountingOperation("ok"),
        provider_reference=REF,
        verifier=fixed_verifier(fenced_absent()),
    )
    assert result.status is ActionStatus.FAILED


async def test_verifier_without_provider_reference_is_a_usage_error_before_anything_runs() -> None:
    ledger = InMemoryLedger()
    op = CountingOperation()
    with pytest.raises(InvalidArgumentError, match="provider_reference"):
        await execute(ActionRunner(ledger), op, verifier=fixed_verifier(confirmed()))
    assert op.calls == 0
    assert ledger.snapshot() == []


async def test_three_status_fields_and_pending_stays_internal() -> None:
    provider_result = await execute(
        ActionRunner(InMemoryLedger()),
        CountingOperation(TimeoutError()),
        provider_reference=REF,
        verifier=fixed_verifier(confirmed()),
    )
    receipt = provider_result.receipt
    assert receipt.execution_status is ActionStatus.UNKNOWN
    assert receipt.verification_status is ActionStatus.CONFIRMED
    assert receipt.final_status is ActionStatus.CONFIRMED
    assert provider_result.status is receipt.final_status
    assert {s.value for s in ActionStatus} == {"CONFIRMED", "FAILED", "UNKNOWN"}


# -- verifier classification -------------------------------------------------


def _bad_results() -> list[object]:
    return [
        # absence that is not proven terminal or fenced
        VerificationResult.absent(verified_provider_reference=REF),
        # unhealthy or inconclusive absence, even when it claims retry safety
        VerificationResult.absent(
            verified_provider_reference=REF, retry_safe=True, health=VerificationHealth.DEGRADED
        ),
        VerificationResult.absent(
            verified_provider_reference=REF, retry_safe=True, health=VerificationHealth.UNAVAILABLE
        ),
        VerificationResult.absent(
            verified_provider_reference=REF, retry_safe=True, conclusive_absence=False
        ),
        # decisive results bound to the wrong reference
        VerificationResult.confirmed(verified_provider_reference="order-2"),
        VerificationResult.absent(verified_provider_reference="order-2", retry_safe=True),
        # unbound decisive result built by hand
        VerificationResult(outcome=ActionStatus.CONFIRMED),
        # not a VerificationResult at all
        None,
        True,
        "CONFIRMED",
        ActionStatus.CONFIRMED,
        {"outcome": "CONFIRMED", "verified_provider_reference": REF},
        VerificationResult.unknown(reason="no idea", verified_provider_reference=REF),
    ]


@pytest.mark.parametrize("verification", _bad_results(), ids=repr)
async def test_untrustworthy_verifier_answers_stay_unknown(verification: object) -> None:
    result = await execute(
        ActionRunner(InMemoryLedger()),
        CountingOperation(TimeoutError()),
        provider_reference=REF,
        verifier=fixed_verifier(verification),
    )
    assert result.status is ActionStatus.UNKNOWN


async def test_look_alike_verification_subclass_is_not_trusted() -> None:
    class Sneaky(VerificationResult):
        __slots__ = ()

    sneaky = Sneaky(outcome=ActionStatus.CONFIRMED, verified_provider_reference=REF)

    result = await execute(
        ActionRunner(InMemoryLedger()),
        CountingOperation(TimeoutError()),
        provider_reference=REF,
        verifier=fixed_verifier(sneaky),
    )
    assert result.status is ActionStatus.UNKNOWN


@pytest.mark.parametrize(
    "exc", [RuntimeError("boom"), TimeoutError(), PermissionError("auth failed")]
)
async def test_verifier_exception_is_unknown(exc: Exception) -> None:
    result = await execute(
        ActionRunner(InMemoryLedger()),
        CountingOperation(TimeoutError()),
        provider_reference=REF,
        verifier=fixed_verifier(exc),
    )
    assert result.status is ActionStatus.UNKNOWN
    observation = result.receipt.metadata["verification"]
    assert type(exc).__name__ in observation["error"]


async def test_wrong_reference_is_recorded_and_downgraded() -> None:
    result = await execute(
        ActionRunner(InMemoryLedger()),
        CountingOperation(TimeoutError()),
        provider_reference=REF,
        verifier=fixed_verifier(confirmed(ref="order-999")),
    )
    assert result.status is ActionStatus.UNKNOWN
    assert "does not match" in result.receipt.metadata["verification"]["error"]


async def test_healthy_conclusive_retry_safe_bound_absence_is_failed() -> None:
    result = await execute(
        ActionRunner(InMemoryLedger()),
        CountingOperation(TimeoutError()),
        provider_reference=REF,
        verifier=fixed_verifier(fenced_absent()),
    )
    assert result.status is ActionStatus.FAILED
    assert result.receipt.verification_status is ActionStatus.FAILED


async def test_verifier_objects_with_verify_method_sync_and_async() -> None:
    class SyncVerifier:
        def verify(self, receipt: object) -> VerificationResult:
            return confirmed()

    class AsyncVerifier:
        async def verify(self, receipt: object) -> VerificationResult:
            await asyncio.sleep(0)
            return confirmed()

    for index, verifier in enumerate([SyncVerifier(), AsyncVerifier()]):
        result = await execute(
            ActionRunner(InMemoryLedger()),
            CountingOperation(TimeoutError()),
            provider_reference=REF,
            verifier=verifier,
            idempotency_key=f"k{index}",
        )
        assert result.status is ActionStatus.CONFIRMED


async def test_verifier_that_is_not_callable_is_rejected_before_anything_runs() -> None:
    ledger = InMemoryLedger()
    op = CountingOperation()
    with pytest.raises(InvalidArgumentError, match="verifier"):
        await execute(ActionRunner(ledger), op, provider_reference=REF, verifier=object())
    assert op.calls == 0
    assert ledger.snapshot() == []


async def test_receipt_metadata_is_json_serialisable() -> None:
    result = await execute(
        ActionRunner(InMemoryLedger()),
        CountingOperation(TimeoutError()),
        provider_reference=REF,
        verifier=fixed_verifier(confirmed()),
    )
    json.dumps(result.receipt.metadata)


@pytest.mark.parametrize("with_verifier", [True, False])
@pytest.mark.parametrize(
    "fault",
    ["ACCEPTED_THEN_REVERSED", "DECLINED_LATER", "ANSWERS_FOR_ANOTHER_REQUEST"],
)
async def test_a_normal_return_is_no_proof_when_a_verifier_is_configured(
    fault: str, with_verifier: bool
) -> None:
    """The provider answers normally, yet no charge stands: with a verifier its read
    decides; without one the return is all there is (the specification's rule)."""
    from dataoad.testing import ChargeFault, FakePaymentProvider, PaymentVerifier

    provider = FakePaymentProvider(charge_faults=[ChargeFault[fault]])

    async def charge() -> object:
        return await provider.charge(customer_id="c", amount_cents=100, client_reference=REF)

    verifier = PaymentVerifier(provider) if with_verifier else None
    runner = ActionRunner(InMemoryLedger())
    result = await execute(runner, charge, provider_reference=REF, verifier=verifier)
    assert provider.charges_for(REF) == []
    assert provider.charge_calls == 1
    if not with_verifier:
        assert result.status is ActionStatus.CONFIRMED  # what a verifier would have caught
        return
    assert result.receipt.execution_status is ActionStatus.UNKNOWN  # it only finished
    assert result.status is ActionStatus.FAILED  # the fenced, bound read found nothing
    assert not result.value_available
