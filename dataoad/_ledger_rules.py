"""The conditional-transition rules every ledger enforces, as pure predicates.

Durable backends express the same rules in their WHERE clauses; the
in-memory ledger and the reference model call these directly.
"""

from __future__ import annotations

from dataoad._receipt import ActionReceipt
from dataoad._status import ClaimState

__all__ = ["check_record", "check_start_attempt", "same_identity"]


def same_identity(current: ActionReceipt, proposed: ActionReceipt) -> bool:
    """Whether ``proposed`` describes the same claim as ``current``."""
    return (
        current.action_id == proposed.action_id
        and current.action_name == proposed.action_name
        and current.idempotency_key == proposed.idempotency_key
        and current.request_hash == proposed.request_hash
        and current.provider_reference == proposed.provider_reference
        and current.risk == proposed.risk
        and current.created_at == proposed.created_at
    )


def check_start_attempt(current: ActionReceipt, proposed: ActionReceipt) -> bool:
    """A new attempt may start only on the exact PENDING version it was read at."""
    return (
        current.claim_state is ClaimState.PENDING
        and proposed.claim_state is ClaimState.PENDING
        and proposed.version == current.version + 1
        and proposed.attempts == current.attempts + 1
        and len(proposed.attempt_records) == proposed.attempts
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
        and same_identity(current, proposed)
    )
