"""dataoad.testing: the payment fake, its verifier's fence, and strict safety reports."""

from __future__ import annotations

import asyncio
import dataclasses
import json

import pytest

from dataoad import (
    ActionRunner,
    ActionStatus,
    DefinitiveFailure,
    InMemoryLedger,
    InvalidArgumentError,
    RetryPolicy,
)
from dataoad.testing import (
    ChargeFault,
    FakePaymentProvider,
    LookupFault,
    PaymentVerifier,
    SafetyCheck,
    SafetyReport,
)
from dataoad.testing._report import SAFE, UNSAFE


def charge(provider: FakePaymentProvider) -> object:
    return provider.charge(customer_id="c", amount_cents=100, client_reference="o-1")


@pytest.mark.parametrize(
    ("fault", "error", "committed"),
    [
        (ChargeFault.TIMEOUT_BEFORE_COMMIT, TimeoutError, 0),
        (ChargeFault.TIMEOUT_AFTER_COMMIT, TimeoutError, 1),
        (ChargeFault.DECLINED, DefinitiveFailure, 0),
        (ChargeFault.TRANSIENT_REJECT, DefinitiveFailure, 0),
        (ChargeFault.CONNECTION_RESET_AFTER_COMMIT, ConnectionResetError, 1),
        (ChargeFault.MALFORMED_RESPONSE_AFTER_COMMIT, ValueError, 1),
        (ChargeFault.TIMEOUT_IN_FLIGHT, TimeoutError, 0),
    ],
)
def test_each_charge_fault_raises_and_commits_as_documented(
    fault: ChargeFault, error: type[Exception], committed: int
) -> None:
    provider = FakePaymentProvider(charge_faults=[fault])
    with pytest.raises(error) as info:
        asyncio.run(charge(provider))  # type: ignore[arg-type]
    assert len(provider.charges) == committed
    assert provider.charge_calls == 1
    if fault is ChargeFault.TRANSIENT_REJECT:
        assert info.value.retryable is True  # type: ignore[attr-defined]
    if fault is ChargeFault.DECLINED:
        assert info.value.retryable is False  # type: ignore[attr-defined]


def verdict(provider: FakePaymentProvider) -> object:
    async def go() -> object:
        result = await ActionRunner(InMemoryLedger()).execute(
            "charge", lambda: None, request={}, idempotency_key="x", provider_reference="o-1"
        )
        return await PaymentVerifier(provider).verify(result.receipt)

    return asyncio.run(go())


def test_verifier_says_retry_safe_only_after_the_in_flight_fence() -> None:
    provider = FakePaymentProvider(charge_faults=[ChargeFault.TIMEOUT_IN_FLIGHT])
    with pytest.raises(TimeoutError):
        asyncio.run(charge(provider))  # type: ignore[arg-type]
    in_flight = verdict(provider)
    assert in_flight.outcome is ActionStatus.FAILED  # type: ignore[attr-defined]
    assert in_flight.retry_safe is False  # type: ignore[attr-defined]
    assert provider.fence("o-1") == 1
    fenced = verdict(provider)
    assert fenced.retry_safe is True  # type: ignore[attr-defined]
    assert provider.commit_in_flight() == 0  # the fenced request never lands


def test_late_commit_becomes_visible_to_the_verifier() -> None:
    provider = FakePaymentProvider(charge_faults=[ChargeFault.TIMEOUT_IN_FLIGHT])
    with pytest.raises(TimeoutError):
        asyncio.run(charge(provider))  # type: ignore[arg-type]
    assert provider.commit_in_flight() == 1
    assert verdict(provider).outcome is ActionStatus.CONFIRMED  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    ("fault", "outcome", "reference"),
    [
        (LookupFault.UNAVAILABLE, ActionStatus.UNKNOWN, None),
        (LookupFault.STALE_EMPTY, ActionStatus.UNKNOWN, "o-1"),
        (LookupFault.WRONG_REFERENCE, ActionStatus.FAILED, "o-1-other"),
    ],
)
def test_lookup_faults_reach_the_verifier_as_documented(
    fault: LookupFault, outcome: ActionStatus, reference: str | None
) -> None:
    provider = FakePaymentProvider(lookup_faults=[fault])
    result = verdict(provider)
    assert result.outcome is outcome  # type: ignore[attr-defined]
    assert result.verified_provider_reference == reference  # type: ignore[attr-defined]


def test_wrong_reference_lookup_never_settles_a_receipt() -> None:
    async def go() -> object:
        provider = FakePaymentProvider(
            charge_faults=[ChargeFault.TIMEOUT_AFTER_COMMIT],
            lookup_faults=[LookupFault.WRONG_REFERENCE],
        )
        return await ActionRunner(InMemoryLedger()).execute(
            "charge",
            lambda: charge(provider),
            request={},
            idempotency_key="x",
            provider_reference="o-1",
            verifier=PaymentVerifier(provider),
            policy=RetryPolicy(max_attempts=2, retry_on_failed=True),
        )

    assert asyncio.run(go()).status is ActionStatus.UNKNOWN  # type: ignore[attr-defined]


def test_fake_provider_rejects_unknown_fault_values() -> None:
    with pytest.raises(TypeError):
        FakePaymentProvider(charge_faults=["timeout"])  # type: ignore[list-item]
    with pytest.raises(TypeError):
        FakePaymentProvider(lookup_faults=[ChargeFault.DECLINED])  # type: ignore[list-item]


# -- SafetyCheck and SafetyReport --------------------------------------------------


@pytest.mark.parametrize("passed", ["false", "true", 1, 0, None, [], 1.0])
def test_safety_check_needs_an_exact_bool(passed: object) -> None:
    with pytest.raises(InvalidArgumentError):
        SafetyCheck("c", passed)  # type: ignore[arg-type]


def test_report_rejects_look_alikes_and_subclasses() -> None:
    @dataclasses.dataclass
    class LookAlike:
        name: str = "c"
        passed: bool = True
        detail: str = ""

    class Subclass(SafetyCheck):
        __slots__ = ()

        def __bool__(self) -> bool:  # a subclass could bend any behaviour
            return True

    with pytest.raises(InvalidArgumentError, match="not a SafetyCheck"):
        SafetyReport("a", [LookAlike()])  # type: ignore[list-item]
    with pytest.raises(InvalidArgumentError, match="not a SafetyCheck"):
        SafetyReport("a", [Subclass("c", False)])
    forged = SafetyCheck("c", True)
    object.__setattr__(forged, "passed", "false")
    with pytest.raises(InvalidArgumentError):
        SafetyReport("a", [forged])
    with pytest.raises(InvalidArgumentError):
        SafetyReport("a", [])
    with pytest.raises(InvalidArgumentError):
        SafetyReport("a", "not checks")  # type: ignore[arg-type]


def test_report_classification_and_machine_readable_form() -> None:
    good = SafetyReport(
        "a", [SafetyCheck("x", True), SafetyCheck("y", True, "ok")], comparison="cmp"
    )
    assert good.passed is True
    assert good.classification == SAFE
    bad = SafetyReport("a", [SafetyCheck("x", True), SafetyCheck("y", False, "why")])
    assert bad.passed is False
    assert bad.classification == UNSAFE
    payload = json.loads(json.dumps(bad.to_dict()))
    assert payload == {
        "action_name": "a",
        "passed": False,
        "classification": UNSAFE,
        "comparison": None,
        "checks": [
            {"name": "x", "passed": True, "detail": ""},
            {"name": "y", "passed": False, "detail": "why"},
        ],
    }
    text = bad.render()
    assert "y" in text
    assert "FAIL" in text
    assert text.endswith(UNSAFE)
