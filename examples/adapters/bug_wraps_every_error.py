"""BUG: every provider error is wrapped in DefinitiveFailure.

A timeout after the provider committed is reported as "definitely did not
happen", so the receipt says FAILED while the charge exists; the checker
names definitive-failure-only-when-nothing-committed.
"""

from __future__ import annotations

from typing import Any

from dataoad import DefinitiveFailure
from examples.adapters.payment_adapter import PaymentAdapter


class WrapsEveryErrorAdapter(PaymentAdapter):
    async def perform(self, request: dict[str, Any], reference: str) -> Any:
        try:
            return await super().perform(request, reference)
        except Exception as exc:  # the bug: a timeout is not a definitive failure
            raise DefinitiveFailure(f"charge failed: {exc}", retryable=True) from exc
