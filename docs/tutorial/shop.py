"""The tutorial's shop: a payment provider whose charges outlive the worker.

Charges go to a JSON file beside the ledger, standing in for the provider's
own records, so a verifier in another process (the operator's) can read
them. ``DATAOAD_TUTORIAL_DIR`` names the folder.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from dataoad import ActionReceipt, VerificationResult

FOLDER = Path(os.environ.get("DATAOAD_TUTORIAL_DIR", "dataoad-tutorial"))
CHARGES = FOLDER / "provider-charges.json"


def charges() -> dict[str, Any]:
    """What the provider has recorded, by client reference."""
    return json.loads(CHARGES.read_text()) if CHARGES.exists() else {}


def charge(order_id: str, amount_cents: int) -> str:
    """Charge an order (a blocking call, like most payment SDKs)."""
    recorded = charges()
    charge_id = f"ch_{len(recorded) + 1:04d}"
    recorded[order_id] = {"charge_id": charge_id, "amount_cents": amount_cents}
    CHARGES.write_text(json.dumps(recorded))
    return charge_id


def verifier(receipt: ActionReceipt) -> VerificationResult:
    """Read-only: look the order up by the reference the charge was sent with."""
    reference = receipt.provider_reference
    assert reference is not None
    found = charges().get(reference)
    if found is None:
        # An empty read is not proof: the charge could still land.
        return VerificationResult.unknown(reason=f"no charge for {reference} yet")
    return VerificationResult.confirmed(
        verified_provider_reference=reference, provider_request_id=found["charge_id"]
    )
