"""The lifecycle rules of a receipt, as pure predicates: expiry, reopening, pruning.

A key is held by at most one receipt per namespace at a time, the one that
was never *retired*. Retiring frees the key and changes nothing else: the
old receipt stays readable by its action id (and prunable) while a new
claim takes the key. Only a definitive outcome may be retired, because only
a definitive outcome can be safely followed by a fresh invocation:

* CONFIRMED: the effect happened; the caller asked for it again after
  ``expires_after`` seconds, like an expired Stripe key.
* FAILED: the effect did not happen (a DefinitiveFailure or a bound,
  conclusive, retry-safe read-back), so a new attempt cannot double it.

UNKNOWN may have happened and PENDING may still be happening: neither ever
expires or reopens, whatever the caller asks. Retention deletes completed
receipts; UNKNOWN only when named, PENDING never.

The ledgers (memory here, SQL in ``ledgers._statements``) and the reference
model enforce these same predicates; the runner only decides when to ask.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Iterable, Sequence
from datetime import UTC, datetime, timedelta
from typing import Final

from dataoad._errors import InvalidArgumentError
from dataoad._receipt import ActionReceipt
from dataoad._status import ActionStatus, ClaimState

__all__ = [
    "BeforeDelete",
    "DEFAULT_PRUNE_STATUSES",
    "MAX_EXPIRES_AFTER",
    "RETIRABLE",
    "check_completed_before",
    "check_expires_after",
    "check_prune_statuses",
    "check_retire",
    "may_expire",
    "may_retire",
    "prunable",
    "reopenable",
    "stored_before",
]

#: Outcomes whose key may be freed: the definitive ones.
RETIRABLE: Final = frozenset({ActionStatus.CONFIRMED, ActionStatus.FAILED})

#: Called with each batch of a prune before any of it is deleted (sync or async).
BeforeDelete = Callable[[Sequence[ActionReceipt]], object]

#: What ``prune`` deletes unless told otherwise.
DEFAULT_PRUNE_STATUSES: Final = (ActionStatus.CONFIRMED, ActionStatus.FAILED)

#: Longest accepted ``expires_after``: ten years, in seconds.
MAX_EXPIRES_AFTER: Final = 10 * 365 * 86_400.0


def may_retire(current: ActionReceipt) -> bool:
    """Whether ``current`` may give up its key: completed, definitive, still holding it."""
    return (
        current.claim_state is ClaimState.COMPLETED
        and current.final_status in RETIRABLE
        and current.retired_at is None
    )


def check_retire(current: ActionReceipt, proposed: ActionReceipt) -> bool:
    """The ledger's rule: retiring sets ``retired_at`` at the next version, nothing else."""
    return (
        may_retire(current)
        and proposed.retired_at is not None
        and proposed.version == current.version + 1
        and proposed
        == dataclasses.replace(
            current,
            retired_at=proposed.retired_at,
            version=proposed.version,
            updated_at=proposed.updated_at,
        )
    )


def may_expire(current: ActionReceipt, expires_after: float | None) -> bool:
    """Whether a caller asking for ``expires_after`` may ask the ledger to free ``current``'s key.

    Only a definitive receipt, and only when expiry was asked for; whether
    it is old enough is the ledger's to judge, by ``stored_before`` on its
    own clock inside ``retire(older_than=...)``: measured from the receipt's
    last stored change, so a late merge never makes a receipt look older.
    """
    return expires_after is not None and may_retire(current)


def stored_before(current: ActionReceipt, seconds: float, now: datetime) -> bool:
    """Whether the ledger stored ``current`` at least ``seconds`` before ``now``.

    ``now`` and ``stored_at`` are both the ledger's own clock: an age is
    never a writer's ``updated_at`` held against a reader's clock.
    """
    return current.stored_at is not None and current.stored_at + timedelta(seconds=seconds) <= now


def reopenable(current: ActionReceipt) -> bool:
    """Whether an operator may reopen ``current``: a completed, definitive FAILED only.

    One whose key is already free (reopened or expired before) is reopened
    by doing nothing; retiring it again is refused by ``check_retire``.
    """
    return (
        current.claim_state is ClaimState.COMPLETED and current.final_status is ActionStatus.FAILED
    )


def prunable(
    current: ActionReceipt,
    *,
    completed_before: datetime,
    statuses: Iterable[ActionStatus],
    namespace: str | None,
) -> bool:
    """Whether retention may delete ``current``: completed, in ``statuses``, old enough.

    Old enough means stored by the ledger (its own clock) before ``completed_before``.
    """
    return (
        current.claim_state is ClaimState.COMPLETED
        and current.final_status in frozenset(statuses)
        and current.stored_at is not None
        and current.stored_at < completed_before
        and (namespace is None or current.namespace == namespace)
    )


def check_expires_after(value: object, name: str = "expires_after") -> float | None:
    """None, or finite seconds in [0, MAX_EXPIRES_AFTER] (``name``: the argument's)."""
    if value is None:
        return None
    if (
        type(value) not in (int, float)
        or not math.isfinite(value)  # type: ignore[arg-type]
        or not 0 <= value <= MAX_EXPIRES_AFTER  # type: ignore[operator]
    ):
        raise InvalidArgumentError(
            f"{name} must be None or seconds in [0, {MAX_EXPIRES_AFTER:g}], not {value!r}"
        )
    return float(value)  # type: ignore[arg-type]


def check_prune_statuses(statuses: object) -> tuple[ActionStatus, ...]:
    """A non-empty collection of ActionStatus values, without repeats, in a stable order."""
    if isinstance(statuses, str | bytes) or not isinstance(statuses, Iterable):
        raise InvalidArgumentError(
            f"statuses must be a collection of ActionStatus, not {type(statuses).__qualname__}"
        )
    chosen = list(statuses)
    if not chosen:
        raise InvalidArgumentError("statuses must name at least one ActionStatus")
    for status in chosen:
        if not isinstance(status, ActionStatus):
            raise InvalidArgumentError(
                f"statuses must hold ActionStatus values (PENDING claims are never pruned), "
                f"not {status!r}"
            )
    return tuple(s for s in ActionStatus if s in chosen)


def check_moment(name: str, value: object) -> datetime:
    """An aware datetime that exists in UTC, where every ledger compares times.

    Filters and cut-offs never guess a time zone; and a time at the very
    edge of Python's range (year 1 at +05:00, say) has no UTC value: the
    ledgers would fail on it after an operator record was started.
    """
    if not isinstance(value, datetime) or value.tzinfo is None or value.utcoffset() is None:
        raise InvalidArgumentError(f"{name} must be a timezone-aware datetime, not {value!r}")
    try:
        value.astimezone(UTC)
    except OverflowError:
        raise InvalidArgumentError(
            f"{name} {value.isoformat()} has no UTC time (out of range)"
        ) from None
    return value


def check_completed_before(value: object) -> datetime:
    """An aware datetime (retention never guesses a time zone)."""
    return check_moment("completed_before", value)
