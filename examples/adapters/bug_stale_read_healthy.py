"""BUG: a read from a lagging replica is trusted as a healthy, retry-safe absence.

The charge exists, but the stale replica has not seen it; the checker names
retry-safe-absence-only-when-final.
"""

from __future__ import annotations

from dataoad import ActionReceipt, VerificationResult
from examples.adapters.payment_adapter import PaymentAdapter


class StaleReadAdapter(PaymentAdapter):
    async def verify(self, receipt: ActionReceipt) -> VerificationResult:
        reference = receipt.provider_reference or ""
        try:
            lookup = await self.provider.lookup(reference)
        except ConnectionError as exc:
            return VerificationResult.unknown(reason=str(exc))
        if lookup.charges:
            return VerificationResult.confirmed(
                verified_provider_reference=lookup.reference,
                provider_request_id=lookup.charges[0].charge_id,
            )
        # The bug: lookup.stale is ignored.
        return VerificationResult.absent(
            verified_provider_reference=lookup.reference,
            retry_safe=not self.provider.in_flight(reference),
        )
