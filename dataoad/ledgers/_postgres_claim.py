"""What a row of PostgreSQL's fused claim statement (``claim_or_held``) answers.

The statement inserts the claim, or returns the receipt that holds its key,
with a flag saying which. Run once more after a broken connection (every
statement is conditional), it may find the call's own claim, stored by the
first run whose answer was lost: that answers for the call only while it is
the receipt written. Taken over or settled meanwhile, it is no longer the
call's to run, and the first error stands, as on every other ledger
(``ProvenLedger`` reads back and nothing is invoked).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Final

from dataoad._proven import proves
from dataoad._receipt import ActionReceipt
from dataoad.ledgers._codec import COLUMNS, receipt_of

__all__ = ["claim_answer", "rerun_answers"]

_ACTION_ID: Final = COLUMNS.index("action_id")
_LEASE_EXPIRES_AT: Final = COLUMNS.index("lease_expires_at")
_STORED_AT: Final = COLUMNS.index("stored_at")


def rerun_answers(receipt: ActionReceipt) -> Callable[[list[Any]], bool]:
    """Whether a re-run's rows answer for the claim of ``receipt``."""

    def answers(rows: list[Any]) -> bool:
        *stored, created = rows[0]
        # An action id is new with every claim: held by another, the key was
        # never this call's; held by this one, the first run committed it.
        if created or stored[_ACTION_ID] != receipt.action_id:
            return True
        return proves(receipt_of(stored), receipt)

    return answers


def claim_answer(receipt: ActionReceipt, row: Sequence[Any]) -> tuple[ActionReceipt, bool]:
    """``(stored, created)`` from the statement's row (a re-run's held to ``rerun_answers``)."""
    *stored, created = row
    if created:
        # Only what the ledger stamped comes back; the caller has the rest.
        return receipt.evolve(
            lease_expires_at=stored[_LEASE_EXPIRES_AT], stored_at=stored[_STORED_AT]
        ), True
    # Held by this call's own claim, exactly as written (a first run whose
    # answer was lost), or by another's.
    return receipt_of(stored), stored[_ACTION_ID] == receipt.action_id
