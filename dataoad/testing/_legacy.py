"""Receipts as older Dataoad runners left them, for tests of what a ledger may still hold."""

from __future__ import annotations

import uuid
from typing import Any

from dataoad._canonical import checked_request_hash
from dataoad._clock import utc_now
from dataoad._receipt import ActionReceipt
from dataoad._status import ClaimState

__all__ = ["unstarted_claim"]


def unstarted_claim(
    action_name: str,
    idempotency_key: str,
    request: Any,
    *,
    provider_reference: str | None = None,
    owner: str | None = None,
    namespace: str = "",
) -> ActionReceipt:
    """A PENDING claim with no attempt counted, as a v0.1 runner wrote it.

    A v0.1 runner claimed a key and started attempt 1 in two writes; one
    that died in between left this. The runner now counts attempt 1 in the
    claim itself, so only such a claim can be released, or invoked by the
    runner that takes it over. Write it with ``ledger.claim``.
    """
    now = utc_now()
    return ActionReceipt(
        action_id=uuid.uuid4().hex,
        action_name=action_name,
        idempotency_key=idempotency_key,
        request_hash=checked_request_hash(request),
        provider_reference=provider_reference,
        risk=None,
        claim_state=ClaimState.PENDING,
        attempts=0,
        execution_status=None,
        verification_status=None,
        final_status=None,
        provider_request_id=None,
        error=None,
        metadata={},
        attempt_records=(),
        version=1,
        created_at=now,
        updated_at=now,
        owner=owner,
        namespace=namespace,
    )
