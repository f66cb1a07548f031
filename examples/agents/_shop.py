"""The shop every agent example uses: a payment provider whose answer gets lost.

The first charge commits and then times out; the provider's lookup is down
for the next two reads, so both the tool call and the model's retry end
UNKNOWN. An operator's later read-only reconciliation settles it. Receipts
go to a SQLite file in a temporary folder, so after a run you can look at
them yourself with the ``dataoad receipts show`` command it prints.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import tempfile
from pathlib import Path
from typing import Any

from dataoad import ActionRunner, GuardedTool, SQLiteLedger
from dataoad.testing import ChargeFault, FakePaymentProvider, LookupFault, PaymentVerifier

ORDER: dict[str, Any] = {"order_id": "order-7", "amount_cents": 2500}

provider = FakePaymentProvider(
    charge_faults=[ChargeFault.TIMEOUT_AFTER_COMMIT],
    lookup_faults=[LookupFault.UNAVAILABLE, LookupFault.UNAVAILABLE],
)
verifier = PaymentVerifier(provider)
#: Where the receipts go: a fresh folder each run, left for you to inspect.
LEDGER = Path(tempfile.mkdtemp(prefix="dataoad-example-")) / "ledger.sqlite3"


def _drop_folder_if_unused() -> None:
    # Importing this module (``dataoad check`` does) writes no receipt; only
    # a folder that holds a ledger is worth leaving behind.
    with contextlib.suppress(OSError):
        os.rmdir(LEDGER.parent)


atexit.register(_drop_folder_if_unused)
runner = ActionRunner(SQLiteLedger(LEDGER))


async def charge_order(order_id: str, amount_cents: int) -> dict[str, Any]:
    """Charge the customer of an order."""
    charge = await provider.charge(
        customer_id=f"cus_{order_id}", amount_cents=amount_cents, client_reference=order_id
    )
    return {"charge_id": charge.charge_id}


#: How the tool's arguments map onto Dataoad. The key is the order id (the
#: business intent), never the framework's per-call tool-call id.
GUARD = GuardedTool(
    runner,
    "charge_order",
    idempotency_key=lambda order_id, amount_cents: order_id,
    request=lambda order_id, amount_cents: {"order_id": order_id, "amount_cents": amount_cents},
    provider_reference=lambda order_id, amount_cents: order_id,
    verifier=verifier,
)


def show(label: str, text: str) -> None:
    """Print a tool result as the model reads it, action id included."""
    print(f"{label}: {text}")


async def settle() -> None:
    """What an operator (or a scheduled job) does later: verify read-only."""
    receipt = await runner.ledger.find("charge_order", ORDER["order_id"])
    assert receipt is not None
    result = await runner.reconcile(receipt.action_id, verifier)
    print(f"later, read-only verification: {result.status.value}")
    print(f"charges at the provider: {len(provider.charges)}")
    await runner.ledger.close()
    print(f"see the receipt: dataoad receipts show {receipt.action_id} --ledger sqlite://{LEDGER}")
