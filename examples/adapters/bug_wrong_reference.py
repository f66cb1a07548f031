"""BUG: the verifier echoes the idempotency key instead of the provider reference.

Dataoad refuses an answer bound to another reference, so the receipt stays
UNKNOWN forever; the checker names verifier-names-the-receipts-reference.
"""

from __future__ import annotations

from dataoad import ActionReceipt, VerificationResult
from examples.adapters.payment_adapter import PaymentAdapter


class WrongReferenceAdapter(PaymentAdapter):
    async def verify(self, receipt: ActionReceipt) -> VerificationResult:
        charges = self.provider.charges_for(receipt.provider_reference or "")
        if charges:
            return VerificationResult.confirmed(
                verified_provider_reference=receipt.idempotency_key,  # the bug
                provider_request_id=charges[0].charge_id,
            )
        return VerificationResult.absent(verified_provider_reference=receipt.idempotency_key)
