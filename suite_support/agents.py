"""The scenario every framework test plays: a charge whose answer is lost.

The provider commits the first charge and then times out; the verifier's
read path is down for the first two looks, so the first call and the
model's retry both end UNKNOWN. A later read-only reconciliation settles it.
"""

from __future__ import annotations

import importlib
from types import ModuleType
from typing import Any

from dataoad import ActionRunner, GuardedTool, InMemoryLedger
from dataoad.testing import ChargeFault, FakePaymentProvider, LookupFault, PaymentVerifier
from suite_support.services import unavailable

ARGS = {"order_id": "order-7", "amount_cents": 2500}


class ChargeScenario:
    """A provider, a verifier, a runner, and the guard's argument mapping."""

    def __init__(self, *, lookup_down: int = 2) -> None:
        """The first charge commits and times out; the lookup is down ``lookup_down`` times."""
        self.provider = FakePaymentProvider(
            charge_faults=[ChargeFault.TIMEOUT_AFTER_COMMIT],
            lookup_faults=[LookupFault.UNAVAILABLE] * lookup_down,
        )
        self.verifier = PaymentVerifier(self.provider)
        self.runner = ActionRunner(InMemoryLedger())

    async def charge_order(self, order_id: str, amount_cents: int) -> dict[str, Any]:
        """Charge the customer of an order."""
        charge = await self.provider.charge(
            customer_id=f"cus_{order_id}", amount_cents=amount_cents, client_reference=order_id
        )
        return {"charge_id": charge.charge_id}

    def guard(self) -> GuardedTool:
        return GuardedTool(
            self.runner,
            "charge_order",
            # The business intent, never the framework's tool-call id.
            idempotency_key=lambda order_id, amount_cents: order_id,
            request=lambda order_id, amount_cents: {
                "order_id": order_id,
                "amount_cents": amount_cents,
            },
            provider_reference=lambda order_id, amount_cents: order_id,
            verifier=self.verifier,
        )

    async def settle_later(self, message: str) -> str:
        """An operator's later read-only reconciliation of the UNKNOWN action."""
        action_id = message.split("action id ")[1].split(")")[0].split(";")[0]
        result = await self.runner.reconcile(action_id, self.verifier)
        return result.status.value


def framework(module: str, extra: str) -> ModuleType:
    """Import a framework; skip without it on a laptop, fail under CI=true."""
    try:
        return importlib.import_module(module)
    except ImportError:
        unavailable(f"the {extra} extra is not installed", module_level=True)
