"""The conditional-transition rules every ledger enforces, as pure predicates.

Durable backends express the same rules in their WHERE clauses; the
in-memory ledger and the reference model call these directly.
"""

from __future__ import annotations

import dataclasses
from datetime import datetime, timedelta

from dataoad._clock import LedgerClock, utc_now
from dataoad._errors import InvalidArgumentError
from dataoad._receipt import ActionReceipt
from dataoad._status import ClaimState

__all__ = [
    "check_ledger_clock",
    "check_record",
    "check_renew",
    "check_start_attempt",
    "check_take_over",
    "lease_expired",
    "lease_until",
    "same_holder",
    "same_identity",
]


def same_identity(current: ActionReceipt, proposed: ActionReceipt) -> bool:
    """Whether ``proposed`` describes the same claim as ``current``."""
    return (
        current.action_id == proposed.action_id
        and current.namespace == proposed.namespace
        and current.action_name == proposed.action_name
        and current.idempotency_key == proposed.idempotency_key
        and current.request_hash == proposed.request_hash
        and current.provider_reference == proposed.provider_reference
        and current.risk == proposed.risk
        and current.created_at == proposed.created_at
        # Only ``check_retire`` (``_lifecycle``) frees a key; nothing restores one.
        and current.retired_at == proposed.retired_at
    )


def same_holder(current: ActionReceipt, proposed: ActionReceipt) -> bool:
    """Whether ``proposed`` is written under the fence that holds ``current``.

    Only ``check_take_over`` changes the owner; every other transition keeps
    owner and fencing token, so a worker whose claim was taken over (a
    zombie) can no longer write it.
    """
    return current.owner == proposed.owner and current.fencing_token == proposed.fencing_token


def lease_until(now: datetime, lease: float | None) -> datetime | None:
    """When a lease of ``lease`` seconds granted at ``now`` (ledger clock) runs out."""
    return None if lease is None else now + timedelta(seconds=lease)


def lease_expired(current: ActionReceipt, now: datetime) -> bool:
    """Whether ``current`` is a PENDING claim whose lease ran out by ``now``.

    ``now`` is the ledger's clock, never a worker's: no decision compares two
    hosts' clocks. A claim without a lease never expires.
    """
    return (
        current.claim_state is ClaimState.PENDING
        and current.lease_expires_at is not None
        and current.lease_expires_at <= now
    )


def check_take_over(current: ActionReceipt, proposed: ActionReceipt, now: datetime) -> bool:
    """An expired claim passes to a new owner under the next fence, nothing else changed."""
    return (
        lease_expired(current, now)
        and proposed.fencing_token == current.fencing_token + 1
        and proposed.version == current.version + 1
        and proposed
        == dataclasses.replace(
            current,
            owner=proposed.owner,
            fencing_token=proposed.fencing_token,
            version=proposed.version,
            updated_at=proposed.updated_at,
        )
    )


def check_renew(current: ActionReceipt, fencing_token: int) -> bool:
    """Only the holder of the current fence may extend a PENDING claim's lease."""
    return current.claim_state is ClaimState.PENDING and current.fencing_token == fencing_token


def check_start_attempt(current: ActionReceipt, proposed: ActionReceipt) -> bool:
    """A new attempt may start only on the exact PENDING version it was read at."""
    return (
        current.claim_state is ClaimState.PENDING
        and proposed.claim_state is ClaimState.PENDING
        and proposed.version == current.version + 1
        and proposed.attempts == current.attempts + 1
        and len(proposed.attempt_records) == proposed.attempts
        and same_holder(current, proposed)
        and same_identity(current, proposed)
    )


def check_record(current: ActionReceipt, proposed: ActionReceipt) -> bool:
    """Any other transition keeps the attempt count and never reopens a claim."""
    return (
        proposed.version == current.version + 1
        and proposed.attempts == current.attempts
        and len(proposed.attempt_records) == proposed.attempts
        and not (
            current.claim_state is ClaimState.COMPLETED
            and proposed.claim_state is ClaimState.PENDING
        )
        and same_holder(current, proposed)
        and same_identity(current, proposed)
    )


def check_ledger_clock(clock: object) -> LedgerClock:
    """A ledger's clock: None gives UTC now; anything else must be callable."""
    if clock is None:
        return utc_now
    if not callable(clock):
        raise InvalidArgumentError(
            f"clock must be a callable returning an aware datetime, not {type(clock).__name__}"
        )
    return clock
