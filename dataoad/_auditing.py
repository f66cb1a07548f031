"""Auditing operator verbs: one OperatorRecord per verb and receipt, after the fact.

The record is appended once the verb's outcome is known, refusals included,
so the audit says what happened, not what was attempted. A verb whose input
is bad is refused before anything is written and leaves no record. When the
verb was done but its record could not be appended, the caller learns it
(``AuditNotRecordedError``, carrying the result): an audit that silently
missed an action would be worse than none.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from dataoad._errors import (
    ActionNotFoundError,
    AuditNotRecordedError,
    DataoadError,
    InvalidArgumentError,
    RecoveryRefusedError,
)
from dataoad._operator import OperatorRecord, check_operator, this_host
from dataoad._receipt import bound_text

__all__ = ["OperatorStamp", "audited"]

T = TypeVar("T")


@dataclasses.dataclass(frozen=True, slots=True)
class OperatorStamp:
    """Who runs a verb, from where and why: checked before the verb starts."""

    operator: str
    host: str
    reason: str | None
    verb: str
    namespace: str | None

    @classmethod
    def of(
        cls, verb: str, operator: object, reason: object, namespace: str | None
    ) -> OperatorStamp:
        """The stamp for ``verb``, or InvalidArgumentError for a bad name or reason."""
        name, why = check_operator(operator, reason)
        return cls(name, this_host(), why, verb, namespace)

    def record(self, action_id: str | None, outcome: str) -> OperatorRecord:
        """The record of this verb's ``outcome`` on ``action_id`` (not stored yet)."""
        return OperatorRecord(
            operator=self.operator,
            host=self.host,
            verb=self.verb,
            action_id=action_id,
            namespace=self.namespace,
            reason=self.reason,
            outcome=bound_text(outcome)[:500],
        )

    async def note(self, ledger: object, action_id: str | None, outcome: str) -> None:
        """Append the record of ``outcome`` to ``ledger``'s audit (if it keeps one)."""
        append = getattr(ledger, "append_audit", None)
        if append is None:
            return  # a ledger of the caller's own making, without an audit
        record = self.record(action_id, outcome)
        try:
            await append(record)
        except Exception as exc:
            raise AuditNotRecordedError(
                f"{self.verb} {action_id or ''} was done ({outcome}), but its operator record "
                f"could not be appended to the audit: {type(exc).__name__}: {exc} (where the "
                "answer to the append was lost it may be there: look before adding it again)",
                record=record,
            ) from exc


async def audited(
    ledger: object,
    stamp: OperatorStamp,
    action_id: str | None,
    run: Callable[[], Awaitable[T]],
    outcome_of: Callable[[T], str],
) -> T:
    """Run the verb, then append its record: its outcome, or why it was refused or failed."""
    try:
        result = await run()
    except (InvalidArgumentError, ActionNotFoundError):
        raise  # a bad input: refused before anything was written, and not audited
    except RecoveryRefusedError as exc:
        await _note_failure(ledger, stamp, action_id, f"refused: {_first_line(exc)}")
        raise
    except DataoadError as exc:
        await _note_failure(ledger, stamp, action_id, f"failed: {type(exc).__name__}")
        raise
    except asyncio.CancelledError:
        # Cancelled after its write may have been made: the audit says so.
        await _note_failure(ledger, stamp, action_id, "cancelled: its write may have been made")
        raise
    try:
        await stamp.note(ledger, action_id, outcome_of(result))
    except AuditNotRecordedError as exc:
        exc.result = result
        raise
    return result


async def _note_failure(ledger: object, stamp: OperatorStamp, action_id: Any, outcome: str) -> None:
    # The verb's own error is what the caller must see; a record that cannot
    # be appended as well adds nothing to it.
    with contextlib.suppress(AuditNotRecordedError):
        await stamp.note(ledger, action_id, outcome)


def _first_line(exc: BaseException) -> str:
    text = str(exc)
    return text.splitlines()[0] if text else type(exc).__name__
