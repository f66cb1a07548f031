"""A correct adapter for the bundled fake payment provider; `dataoad check` passes it.

    $ dataoad check examples/adapters/payment_adapter.py
    dataoad check PaymentAdapter
    no violation found in 200 examples (...); this is a search result, not a proof

The buggy adapters next to it each change one method of this one.
"""

from __future__ import annotations

from typing import Any

from dataoad import ActionReceipt, VerificationResult
from dataoad.testing import (
    ChargeFault,
    FakePaymentProvider,
    LookupFault,
    PaymentVerifier,
    ProviderAdapter,
    ReadFault,
    SandboxFault,
)

SANDBOX_FAULTS = {
    SandboxFault.TIMEOUT_BEFORE_COMMIT: ChargeFault.TIMEOUT_BEFORE_COMMIT,
    SandboxFault.TIMEOUT_AFTER_COMMIT: ChargeFault.TIMEOUT_AFTER_COMMIT,
    SandboxFault.RESET_AFTER_COMMIT: ChargeFault.CONNECTION_RESET_AFTER_COMMIT,
    SandboxFault.DECLINE: ChargeFault.DECLINED,
    SandboxFault.IN_FLIGHT: ChargeFault.TIMEOUT_IN_FLIGHT,
    SandboxFault.ACCEPTED_THEN_REVERSED: ChargeFault.ACCEPTED_THEN_REVERSED,
    SandboxFault.DECLINED_LATER: ChargeFault.DECLINED_LATER,
    SandboxFault.ANSWERS_FOR_ANOTHER_REQUEST: ChargeFault.ANSWERS_FOR_ANOTHER_REQUEST,
}
READ_FAULTS = {
    ReadFault.UNAVAILABLE: LookupFault.UNAVAILABLE,
    ReadFault.STALE: LookupFault.STALE_EMPTY,
}


class PaymentAdapter(ProviderAdapter):
    """Charges through FakePaymentProvider; verifies with the bundled PaymentVerifier."""

    action_name = "charge_customer"

    def reset(self) -> None:
        self.provider = FakePaymentProvider()

    async def perform(self, request: dict[str, Any], reference: str) -> Any:
        # Every provider error propagates as it is: only the provider's own
        # DefinitiveFailure (a decline) says the charge did not happen.
        return await self.provider.charge(
            customer_id=request["customer_id"],
            amount_cents=request["amount_cents"],
            client_reference=reference,
        )

    async def verify(self, receipt: ActionReceipt) -> VerificationResult:
        return await PaymentVerifier(self.provider).verify(receipt)

    def effects(self, reference: str) -> int:
        return len(self.provider.charges_for(reference))

    def in_flight(self, reference: str) -> bool:
        return self.provider.in_flight(reference)

    def stage_sandbox_fault(self, fault: SandboxFault) -> None:
        self.provider.add_charge_fault(SANDBOX_FAULTS[fault])

    def land_in_flight(self) -> None:
        self.provider.commit_in_flight()

    def stage_read_fault(self, fault: ReadFault) -> None:
        self.provider.add_lookup_fault(READ_FAULTS[fault])

    def request_for(self, key: str) -> dict[str, Any]:
        return {"customer_id": f"cus_{key}", "amount_cents": 2_500}
