"""What the console shows, read through the ledger's read-only listing.

The queue is every UNKNOWN receipt and every PENDING claim whose lease ran
out, newest first, with counts per namespace and each one's age by the
ledger's clock. A receipt's timeline puts its claim, attempts, observations,
recovery, lease and fence and operator records in one order. The pages and
the JSON under ``/api/`` are built from the same dictionaries.
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from datetime import datetime
from typing import Any, Final

from dataoad._cli_render import receipt_dict
from dataoad._clock import utc_now
from dataoad._operator import OperatorRecord
from dataoad._receipt import ActionReceipt
from dataoad._status import ActionStatus
from dataoad.ledgers._audit import MAX_AUDIT_LIMIT

__all__ = ["PAGE_SIZE", "Queue", "audit_page", "held_by_a_live_lease", "queue", "timeline"]

#: Receipts a page of the queue or the audit shows.
PAGE_SIZE: Final = 50
#: Receipts the queue reads at most, per kind, to count and page them.
QUEUE_LIMIT: Final = 10_000


async def held_by_a_live_lease(ledger: Any, receipt: ActionReceipt) -> bool:
    """Whether ``receipt`` is a PENDING claim whose lease has not run out by the ledger's clock.

    Its worker renewed it lately, so it may still be running the operation:
    settling the claim under it from a shared page would let that worker
    commit after the verifier looked. The ledger judges the age itself.
    """
    if not receipt.is_pending or receipt.lease_expires_at is None:
        return False
    stale = await ledger.receipts(
        stale=True, action_id_prefix=receipt.action_id, namespace=receipt.namespace, limit=1
    )
    return not any(r.action_id == receipt.action_id for r in stale)


async def ledger_now(ledger: Any) -> datetime:
    """The ledger's clock: the server's for PostgreSQL, this host's for a SQLite file."""
    now = getattr(ledger, "_ledger_now", None)
    return await now() if now is not None else utc_now()


@dataclasses.dataclass(frozen=True)
class Queue:
    """One page of the queue and the counts behind it."""

    rows: list[dict[str, Any]]
    counts: dict[str, dict[str, int]]
    page: int
    pages: int
    capped: bool
    namespace: str | None

    def to_json(self) -> dict[str, Any]:
        """The page as JSON."""
        return dataclasses.asdict(self)


def _age(now: datetime, since: datetime | None) -> float | None:
    return None if since is None else max(0.0, (now - since).total_seconds())


async def queue(ledger: Any, *, namespace: str | None, page: int) -> Queue:
    """UNKNOWN receipts and stale PENDING claims, newest first, ``PAGE_SIZE`` a page."""
    unknown = await ledger.receipts(
        final_status=ActionStatus.UNKNOWN,
        namespace=namespace,
        newest_first=True,
        limit=QUEUE_LIMIT,
    )
    stale = await ledger.receipts(
        stale=True, namespace=namespace, newest_first=True, limit=QUEUE_LIMIT
    )
    now = await ledger_now(ledger)
    found = sorted(
        [("UNKNOWN", r) for r in unknown] + [("stale PENDING", r) for r in stale],
        key=lambda kr: (kr[1].created_at, kr[1].action_id),
        reverse=True,
    )
    counts: dict[str, Counter[str]] = {}
    for kind, receipt in found:
        counts.setdefault(receipt.namespace, Counter())[kind] += 1
    pages = max(1, -(-len(found) // PAGE_SIZE))
    page = min(max(page, 1), pages)
    shown = found[(page - 1) * PAGE_SIZE : page * PAGE_SIZE]
    rows = [
        {
            "kind": kind,
            "action_id": r.action_id,
            "namespace": r.namespace,
            "action_name": r.action_name,
            "idempotency_key": r.idempotency_key,
            "attempts": r.attempts,
            "owner": r.owner,
            "created_at": r.created_at.isoformat(),
            "age_seconds": _age(now, r.stored_at or r.updated_at),
        }
        for kind, r in shown
    ]
    return Queue(
        rows=rows,
        counts={ns: dict(c) for ns, c in sorted(counts.items())},
        page=page,
        pages=pages,
        capped=len(unknown) >= QUEUE_LIMIT or len(stale) >= QUEUE_LIMIT,
        namespace=namespace,
    )


def timeline(receipt: ActionReceipt, records: list[OperatorRecord]) -> list[dict[str, Any]]:
    """Everything that happened to the receipt, oldest first: (when, what, detail)."""
    events: list[dict[str, Any]] = [
        {
            "at": receipt.created_at,
            "what": "claimed",
            "detail": f"by {receipt.owner or 'an unnamed worker'}, fencing token 1",
        }
    ]
    for a in receipt.attempt_records:
        events.append(
            {
                "at": a.started_at,
                "what": f"attempt {a.number} started",
                "detail": f"fencing token {receipt.fencing_token}" if a.number == 1 else "",
            }
        )
        if a.finished_at is not None:
            outcome = "" if a.execution_status is None else a.execution_status.value
            said = f" ({a.error})" if a.error else ""
            retry = f"; {a.retry_decision}" if a.retry_decision else ""
            events.append(
                {
                    "at": a.finished_at,
                    "what": f"attempt {a.number} finished",
                    "detail": f"{outcome}{said}{retry}",
                }
            )
    for o in receipt.observations:
        said = o.reason or o.error or ""
        events.append(
            {
                "at": o.observed_at,
                "what": f"verifier ({o.source.value}) counted as {o.status.value}",
                "detail": said
                + (
                    f"; provider request id {o.provider_request_id}"
                    if o.provider_request_id
                    else ""
                ),
            }
        )
    if receipt.recovery is not None:
        events.append(
            {
                "at": receipt.recovery.recovered_at,
                "what": f"completed by {receipt.recovery.method}",
                "detail": f"after {receipt.recovery.attempts} attempt(s)",
            }
        )
    if receipt.fencing_token > 1:
        events.append(
            {
                "at": receipt.updated_at,
                "what": "taken over",
                "detail": f"now held by {receipt.owner}, fencing token {receipt.fencing_token}",
            }
        )
    if receipt.lease_expires_at is not None:
        events.append(
            {"at": receipt.lease_expires_at, "what": "lease runs out", "detail": receipt.owner}
        )
    if receipt.retired_at is not None:
        events.append({"at": receipt.retired_at, "what": "gave up its key", "detail": ""})
    for r in records:
        events.append(
            {
                "at": r.at,
                "what": f"operator {r.verb} by {r.operator}@{r.host}",
                "detail": r.outcome + (f"; reason: {r.reason}" if r.reason else ""),
            }
        )
    events.sort(key=lambda e: e["at"] or receipt.created_at)
    return [{**e, "at": None if e["at"] is None else e["at"].isoformat()} for e in events]


def receipt_json(receipt: ActionReceipt) -> dict[str, Any]:
    """The receipt, its timeline and its operator records (newest first), as JSON."""
    records = list(reversed(receipt.operator_records))
    return {
        "receipt": receipt_dict(receipt),
        "timeline": timeline(receipt, records),
        "operator_records": [dict(r.to_json()) for r in records],
    }


async def audit_page(ledger: Any, *, operator: str | None, page: int) -> dict[str, Any]:
    """One page of the audit, newest first."""
    audit = getattr(ledger, "audit", None)
    records: list[OperatorRecord] = (
        []
        if audit is None
        else await audit(operator=operator, limit=min(page * PAGE_SIZE + 1, MAX_AUDIT_LIMIT))
    )
    shown = records[(page - 1) * PAGE_SIZE : page * PAGE_SIZE]
    return {
        "records": [dict(r.to_json()) for r in shown],
        "page": page,
        "more": len(records) > page * PAGE_SIZE,
        "operator": operator,
    }
