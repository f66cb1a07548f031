"""The crash tests' one business step, shared by every engine's worker: charge an order."""

from __future__ import annotations

from collections.abc import Callable, Coroutine
from typing import Any

from dataoad import ActionRunner, RetryPolicy, SQLiteLedger
from suite_support.payments_file import FilePayments
from tests.engines.crash_points import CrashObserver, crash_here

__all__ = ["Checkout"]


class Checkout:
    """The provider, the ledger and runner, the charge and its guard options, from a config."""

    def __init__(self, config: dict[str, Any]) -> None:
        self.payments = FilePayments(config["payments"])
        self.ledger = SQLiteLedger(config["ledger"])
        self.runner = ActionRunner(self.ledger, lease=config["lease"], observers=[CrashObserver()])
        self.guarded = config["mode"] == "guarded"
        self.verifier = config["verifier"]

    def charge_function(self) -> Callable[[str, int], Coroutine[Any, Any, str]]:
        """The step: charge the order (dying right after the commit, if told to)."""
        payments = self.payments

        async def charge(order_id: str, cents: int) -> str:
            charge_id = payments.charge(f"order-{order_id}", cents)
            crash_here("after_commit")
            return charge_id

        return charge

    def guard_options(self) -> dict[str, Any]:
        """What every engine's guard takes, the runner first."""
        return {
            "request": lambda order_id, cents: {"order": order_id, "cents": cents},
            "provider_reference": lambda order_id, cents: f"order-{order_id}",
            "verifier": self.payments.verify if self.verifier else None,
            # A verified absence is retry-safe: the step may charge once more.
            "policy": RetryPolicy(max_attempts=2, retry_on_failed=True),
        }
