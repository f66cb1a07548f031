"""BUG: "absent" is reported retry-safe even while the request is still in flight.

The request lands after the verification, so a FAILED receipt gains an
effect (and a retry would charge twice); the checker names
retry-safe-absence-only-when-final.
"""

from __future__ import annotations

from dataoad import ActionReceipt, VerificationResult
from examples.adapters.payment_adapter import PaymentAdapter


class AbsentWhileInFlightAdapter(PaymentAdapter):
    async def verify(self, receipt: ActionReceipt) -> VerificationResult:
        reference = receipt.provider_reference or ""
        lookup = await self.provider.lookup(reference)
        if lookup.charges:
            return VerificationResult.confirmed(
                verified_provider_reference=lookup.reference,
                provider_request_id=lookup.charges[0].charge_id,
            )
        # The bug: no look at whether a request could still commit.
        return VerificationResult.absent(verified_provider_reference=reference, retry_safe=True)
