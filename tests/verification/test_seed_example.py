"""The specification's 30-second example, and the naive-retry comparison."""

from __future__ import annotations

import asyncio

from dataoad import ActionRunner, ActionStatus, InMemoryLedger
from dataoad.testing import ChargeFault, FakePaymentProvider, PaymentVerifier


async def test_thirty_second_example() -> None:
    provider = FakePaymentProvider(charge_faults=[ChargeFault.TIMEOUT_AFTER_COMMIT])
    runner = ActionRunner(InMemoryLedger())
    request = {"customer_id": "customer_123", "amount_cents": 2_500}

    result = await runner.execute(
        "charge_customer",
        lambda: provider.charge(
            customer_id="customer_123",
            amount_cents=2_500,
            client_reference="order-123",
        ),
        request=request,
        idempotency_key="order-123",
        provider_reference="order-123",
        risk="financial",
    )

    assert result.status is ActionStatus.UNKNOWN
    assert provider.charge_calls == 1

    result = await runner.reconcile(result.receipt.action_id, PaymentVerifier(provider))
    assert result.status is ActionStatus.CONFIRMED
    assert provider.charge_calls == 1  # verification did not repeat the mutation
    assert len(provider.charges) == 1


def test_naive_retry_charges_twice_where_dataoad_charges_once() -> None:
    async def naive() -> FakePaymentProvider:
        provider = FakePaymentProvider(charge_faults=[ChargeFault.TIMEOUT_AFTER_COMMIT])
        for _ in range(2):
            try:
                await provider.charge(customer_id="c", amount_cents=2_500, client_reference="o")
                break
            except TimeoutError:
                continue
        return provider

    async def guarded() -> tuple[FakePaymentProvider, object]:
        provider = FakePaymentProvider(charge_faults=[ChargeFault.TIMEOUT_AFTER_COMMIT])
        runner = ActionRunner(InMemoryLedger())
        result = None
        for _ in range(2):  # the caller retries just as naively
            result = await runner.execute(
                "charge_customer",
                lambda: provider.charge(customer_id="c", amount_cents=2_500, client_reference="o"),
                request={"customer_id": "c", "amount_cents": 2_500},
                idempotency_key="o",
                provider_reference="o",
                verifier=PaymentVerifier(provider),
            )
        return provider, result

    naive_provider = asyncio.run(naive())
    assert (naive_provider.charge_calls, len(naive_provider.charges)) == (2, 2)
    provider, result = asyncio.run(guarded())
    assert (provider.charge_calls, len(provider.charges)) == (1, 1)
    receipt = result.receipt  # type: ignore[attr-defined]
    assert receipt.execution_status is ActionStatus.UNKNOWN
    assert receipt.verification_status is ActionStatus.CONFIRMED
    assert receipt.final_status is ActionStatus.CONFIRMED
