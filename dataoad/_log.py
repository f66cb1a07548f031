"""Structured logging: one record per durable transition, on the ``dataoad`` logger.

Records carry identifiers and statuses only, never request contents,
provider return values or metadata. The structured fields are in the
record's ``dataoad`` attribute (a dict) for log processors.
"""

from __future__ import annotations

import logging
from typing import Any

from dataoad._receipt import ActionReceipt

__all__ = ["log_event", "logger"]

logger = logging.getLogger("dataoad")
logger.addHandler(logging.NullHandler())


def _value(status: Any) -> str | None:
    return None if status is None else str(status.value)


def log_event(
    event: str, receipt: ActionReceipt | None, *, level: int = logging.INFO, **extra: Any
) -> None:
    """Log ``event`` for ``receipt`` if the ``dataoad`` logger wants it."""
    if not logger.isEnabledFor(level):
        return
    fields: dict[str, Any] = {"event": event, **extra}
    if receipt is not None:
        fields.update(
            action_name=receipt.action_name,
            action_id=receipt.action_id,
            attempt=receipt.attempts,
            claim_state=receipt.claim_state.value,
            execution_status=_value(receipt.execution_status),
            verification_status=_value(receipt.verification_status),
            final_status=_value(receipt.final_status),
            version=receipt.version,
        )
    summary = " ".join(f"{k}={v}" for k, v in fields.items() if k != "event" and v is not None)
    logger.log(level, "%s %s", event, summary, extra={"dataoad": fields})
