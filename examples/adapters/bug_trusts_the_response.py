"""BUG: the verifier answers from the responses ``perform`` saw, not from the provider.

It saves a lookup whenever the charge call answered: a charge id in hand
"proves" the charge. But a provider may answer and then reverse the charge,
decline it later, or hand back another request's response; the checker
stages those and names confirmed-only-with-the-effect.
"""

from __future__ import annotations

from typing import Any

from dataoad import ActionReceipt, VerificationResult
from examples.adapters.payment_adapter import PaymentAdapter


class TrustsTheResponseAdapter(PaymentAdapter):
    def reset(self) -> None:
        super().reset()
        self.answered: dict[str, str] = {}

    async def perform(self, request: dict[str, Any], reference: str) -> Any:
        charge = await super().perform(request, reference)
        self.answered[reference] = charge.charge_id
        return charge

    async def verify(self, receipt: ActionReceipt) -> VerificationResult:
        reference = receipt.provider_reference or ""
        if reference in self.answered:  # the bug: the response is taken as the record
            return VerificationResult.confirmed(
                verified_provider_reference=reference,
                provider_request_id=self.answered[reference],
            )
        return await super().verify(receipt)
