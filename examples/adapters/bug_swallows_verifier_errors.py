"""BUG: the verifier swallows its own lookup errors and answers "absent".

When the read path is down the charge may well exist; the checker names
retry-safe-absence-only-when-final.
"""

from __future__ import annotations

from dataoad import ActionReceipt, VerificationHealth, VerificationResult
from examples.adapters.payment_adapter import PaymentAdapter


class SwallowsErrorsAdapter(PaymentAdapter):
    async def verify(self, receipt: ActionReceipt) -> VerificationResult:
        reference = receipt.provider_reference or ""
        try:
            lookup = await self.provider.lookup(reference)
        except Exception:  # the bug: "could not look" becomes "not there"
            return VerificationResult.absent(verified_provider_reference=reference, retry_safe=True)
        if lookup.stale:
            return VerificationResult.unknown(reason="stale", health=VerificationHealth.DEGRADED)
        if lookup.charges:
            return VerificationResult.confirmed(
                verified_provider_reference=lookup.reference,
                provider_request_id=lookup.charges[0].charge_id,
            )
        return VerificationResult.absent(
            verified_provider_reference=lookup.reference,
            retry_safe=not self.provider.in_flight(reference),
        )
