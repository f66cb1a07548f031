"""How the operator commands show receipts: a table, every field, or JSON.

Times are shown in UTC with the zone written out, the same clock
``--since`` filters on.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

from dataoad._canonical import RESERVED_METADATA_KEYS
from dataoad._frozen import thaw
from dataoad._receipt import ActionReceipt

__all__ = ["receipt_dict", "render_receipt", "render_table", "status_text"]


def _utc(moment: datetime) -> str:
    return moment.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%SZ")


def status_text(value: Any) -> str:
    return "-" if value is None else str(value.value)


def receipt_dict(receipt: ActionReceipt) -> dict[str, Any]:
    """A JSON-ready form of a receipt, every field included."""
    return {
        "action_id": receipt.action_id,
        "action_name": receipt.action_name,
        "idempotency_key": receipt.idempotency_key,
        "request_hash": receipt.request_hash,
        "provider_reference": receipt.provider_reference,
        "risk": receipt.risk,
        "claim_state": receipt.claim_state.value,
        "attempts": receipt.attempts,
        "execution_status": None
        if receipt.execution_status is None
        else receipt.execution_status.value,
        "verification_status": None
        if receipt.verification_status is None
        else receipt.verification_status.value,
        "final_status": None if receipt.final_status is None else receipt.final_status.value,
        "provider_request_id": receipt.provider_request_id,
        "error": receipt.error,
        "metadata": thaw(receipt.metadata),
        "attempt_records": [
            {
                "number": a.number,
                "started_at": a.started_at.isoformat(),
                "finished_at": None if a.finished_at is None else a.finished_at.isoformat(),
                "execution_status": None
                if a.execution_status is None
                else a.execution_status.value,
                "verification_status": None
                if a.verification_status is None
                else a.verification_status.value,
                "error": a.error,
                "provider_request_id": a.provider_request_id,
                "retry_decision": a.retry_decision,
            }
            for a in receipt.attempt_records
        ],
        "version": receipt.version,
        "created_at": receipt.created_at.isoformat(),
        "updated_at": receipt.updated_at.isoformat(),
        "owner": receipt.owner,
        "fencing_token": receipt.fencing_token,
        "lease_expires_at": None
        if receipt.lease_expires_at is None
        else receipt.lease_expires_at.isoformat(),
        "namespace": receipt.namespace,
        "retired_at": None if receipt.retired_at is None else receipt.retired_at.isoformat(),
    }


def printable(text: str) -> str:
    """``text`` with every character a terminal would act on shown as ``\\xNN``.

    Stored strings come from callers and providers: a newline would forge
    another line, an escape sequence could move the cursor and overwrite a
    status, or retitle the terminal.
    """
    return "".join(c if c.isprintable() else f"\\x{ord(c):02x}" for c in text)


def render_table(receipts: Sequence[ActionReceipt]) -> str:
    """One aligned line per receipt."""
    header: tuple[str, ...] = (
        "ACTION ID",
        "ACTION",
        "KEY",
        "CLAIM",
        "FINAL",
        "ATTEMPTS",
        "CREATED",
        "UPDATED",
    )
    rows: list[tuple[str, ...]] = [
        (
            printable(r.action_id),
            printable(r.action_name),
            printable(r.idempotency_key),
            r.claim_state.value,
            status_text(r.final_status),
            str(r.attempts),
            _utc(r.created_at),
            _utc(r.updated_at),
        )
        for r in receipts
    ]
    if any(r.namespace for r in receipts):  # the column only where namespaces are used
        header = ("NAMESPACE", *header)
        rows = [
            (printable(r.namespace) or '""', *row) for r, row in zip(receipts, rows, strict=True)
        ]
    widths = [max(len(row[i]) for row in [header, *rows]) for i in range(len(header))]
    lines = [
        "  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip()
        for row in [header, *rows]
    ]
    lines.append(f"({len(rows)} receipt{'s' if len(rows) != 1 else ''})")
    return "\n".join(lines)


def render_receipt(receipt: ActionReceipt) -> str:
    """Every field, the attempt history and the verification observations."""
    data = receipt_dict(receipt)
    lines = [f"Receipt {receipt.action_id}"]
    if receipt.namespace:
        lines.append(f"  {'namespace':<20} {receipt.namespace}")
    for key in (
        "action_name",
        "idempotency_key",
        "provider_reference",
        "risk",
        "claim_state",
        "final_status",
        "execution_status",
        "verification_status",
        "attempts",
        "provider_request_id",
        "error",
        "request_hash",
        "version",
        "created_at",
        "updated_at",
    ):
        lines.append(f"  {key:<20} {data[key] if data[key] is not None else '-'}")
    if receipt.retired_at is not None:
        lines.append(
            f"  {'retired_at':<20} {data['retired_at']} (gave up its key: expired or reopened)"
        )
    lines.append("Attempts:")
    for attempt in data["attempt_records"] or []:
        lines.append(
            f"  #{attempt['number']} started {attempt['started_at']}, "
            f"finished {attempt['finished_at'] or '(never recorded)'}: "
            f"execution={attempt['execution_status'] or '-'}, "
            f"verification={attempt['verification_status'] or '-'}, "
            f"next={attempt['retry_decision'] or '-'}"
            + (f", error={attempt['error']}" if attempt["error"] else "")
        )
    if not data["attempt_records"]:
        lines.append("  (none: the operation was never invoked)")
    observations = data["metadata"].get("verification_observations", [])
    lines.append("Verification observations:")
    for o in observations:
        lines.append(
            f"  {o.get('observed_at', '?')} {o.get('source')} after attempt {o.get('attempt')}: "
            f"claimed {o.get('claimed', '-')}, counted as {o.get('status')}"
            + (
                f" (reference {o['verified_provider_reference']})"
                if o.get("verified_provider_reference")
                else ""
            )
            + (f" [{o['error']}]" if o.get("error") else "")
        )
    if not observations:
        lines.append("  (none)")
    meta = data["metadata"]
    if meta.get("provider_request_ids"):
        lines.append(
            f"Provider request ids: {', '.join(meta['provider_request_ids'])}"
            + (
                " (CONFLICT: possibly duplicate effects)"
                if meta.get("provider_request_id_conflict")
                else ""
            )
        )
    if meta.get("verification_conflict"):
        lines.append(
            "Verification conflict: observations contradict each other; a person must look"
        )
    if meta.get("recovery"):
        lines.append(f"Recovery: {json.dumps(meta['recovery'], sort_keys=True)}")
    caller = {k: v for k, v in meta.items() if k not in RESERVED_METADATA_KEYS}
    if caller:
        lines.append(f"Metadata: {json.dumps(caller, sort_keys=True)}")
    return "\n".join(printable(line) for line in lines)
