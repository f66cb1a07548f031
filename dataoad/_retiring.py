"""Freeing a key, as the runner does it: expiry inside ``execute``, and ``reopen``.

What may be freed is ``_lifecycle``'s rule; this module only asks, through
the proven-write rule, and re-decides on what is stored whenever the
receipt changed first (a zombie's evidence merged into a FAILED receipt can
make it UNKNOWN, which must then never be freed).
"""

from __future__ import annotations

from typing import Final

from dataoad._errors import InvalidArgumentError, NothingInvokedError, RecoveryRefusedError
from dataoad._events import EventKind, EventSink
from dataoad._lifecycle import may_expire, reopenable
from dataoad._proven import ProvenLedger
from dataoad._receipt import ActionReceipt, utc_now

__all__ = ["MAX_RETIRE_ROUNDS", "check_lifecycle", "expire_if_due", "reopen"]

#: How often freeing a key re-reads after the receipt changed first.
MAX_RETIRE_ROUNDS: Final = 16


def check_lifecycle(ledger: object, what: str) -> None:
    """Refuse ``what`` on a ledger without ``retire`` (one written before v0.2's lifecycle)."""
    if not callable(getattr(ledger, "retire", None)):
        raise InvalidArgumentError(
            f"ledger {type(ledger).__qualname__} cannot free keys (no retire), so it cannot {what}"
        )


async def _retire(
    store: ProvenLedger,
    current: ActionReceipt,
    events: EventSink,
    reason: str,
    older_than: float | None = None,
) -> bool:
    now = utc_now()
    proposed = current.evolve(retired_at=now, version=current.version + 1, updated_at=now)
    if not await store.retire(proposed, current, older_than=older_than):
        return False
    events.emit(EventKind.RETIRED, proposed, reason=reason)
    return True


async def expire_if_due(
    store: ProvenLedger,
    existing: ActionReceipt,
    expires_after: float | None,
    events: EventSink,
) -> ActionReceipt | None:
    """The receipt the call must answer to: ``existing``, or None once its key is free.

    Whether the receipt is old enough is the ledger's to judge, by its own
    clock inside the conditional write (``retire(older_than=...)``): the
    runner's clock never enters it, so a caller whose clock runs fast, or a
    writer whose clock ran slow, cannot expire a fresh receipt. A refused
    write is told apart by reading again: the same receipt means "not old
    enough yet", a changed one is decided afresh.
    """
    current: ActionReceipt | None = existing
    for _ in range(MAX_RETIRE_ROUNDS):
        if current is None or not may_expire(current, expires_after):
            return current
        if await _retire(store, current, events, "expired", older_than=expires_after):
            return None
        # Refused: too young by the ledger's clock, or changed first (retired
        # by another caller, merged into, pruned...).
        again = await store.read_claim(current.action_name, current.idempotency_key)
        if again is not None and again == current and again.action_id == current.action_id:
            return again
        current = again
    raise NothingInvokedError(
        f"the expired receipt of {existing.action_name!r} key {existing.idempotency_key!r} "
        f"kept changing while this call tried to free its key; nothing was invoked",
        receipt=None,
        operation_invoked=False,
    )


async def reopen(store: ProvenLedger, action_id: str, events: EventSink) -> bool:
    """Free the key of a definitive FAILED receipt; refuse anything else.

    True when this call freed it; False when it was free already.
    """
    for _ in range(MAX_RETIRE_ROUNDS):
        current = await store.read(action_id)
        if not reopenable(current):
            state = "PENDING" if current.final_status is None else current.final_status.value
            raise RecoveryRefusedError(
                f"action {action_id} is {state}: only a definitive FAILED receipt can be "
                "reopened (a CONFIRMED one happened, an UNKNOWN or PENDING one may have)",
                receipt=current,
            )
        if current.retired_at is not None:
            return False  # already free: reopening twice changes nothing
        if await _retire(store, current, events, "reopened"):
            return True
    raise NothingInvokedError(
        f"action {action_id} kept changing while it was being reopened; nothing was changed",
        receipt=None,
        operation_invoked=False,
    )
