"""Operator records: who ran an operator verb, from where, why, and what came of it.

An UNKNOWN receipt is a decision a person makes (verify, wait, settle). Each
operator verb (recover, recover_stale, reopen, release_unstarted, prune, and
the console's actions) leaves one ``OperatorRecord`` in the ledger's
append-only audit, which outlives the receipts it names. The record's time
is the ledger's own clock, stamped when it is stored.
"""

from __future__ import annotations

import dataclasses
import getpass
import socket
from collections.abc import Mapping
from datetime import datetime
from typing import Any, Final

from dataoad._errors import InvalidArgumentError
from dataoad._receipt import bound_text
from dataoad._verification import check_stored_text

__all__ = [
    "MAX_OPERATOR_LENGTH",
    "MAX_REASON_LENGTH",
    "OPERATOR_VERBS",
    "OperatorRecord",
    "check_operator",
    "default_operator",
    "this_host",
]

#: The longest operator name and reason a record keeps.
MAX_OPERATOR_LENGTH: Final = 200
MAX_REASON_LENGTH: Final = 2000
#: The verbs an operator record names.
OPERATOR_VERBS: Final = frozenset(
    {"recover", "recover_stale", "reopen", "release_unstarted", "prune", "verify"}
)


def default_operator() -> str:
    """The OS user running this process (``"unknown"`` when the system cannot say)."""
    try:
        name = getpass.getuser()
    except Exception:  # no login name, no USER variable, no passwd entry
        return "unknown"
    return bound_text(name)[:MAX_OPERATOR_LENGTH] or "unknown"


def this_host() -> str:
    """This machine's host name, bounded and storable."""
    return bound_text(socket.gethostname() or "unknown")[:MAX_OPERATOR_LENGTH]


def check_operator(operator: object, reason: object) -> tuple[str, str | None]:
    """The operator's name (the OS user for None) and reason, or InvalidArgumentError.

    Checked before the verb touches the ledger: a bad name changes nothing.
    """
    name = default_operator() if operator is None else operator
    check_stored_text("operator", name, limit=MAX_OPERATOR_LENGTH)
    assert isinstance(name, str)
    if any(ord(c) < 32 or ord(c) == 127 for c in name):
        raise InvalidArgumentError("operator must not hold control characters")
    check_stored_text("reason", reason, limit=MAX_REASON_LENGTH, optional=True)
    return name, reason  # type: ignore[return-value]


@dataclasses.dataclass(frozen=True, slots=True)
class OperatorRecord:
    """One operator verb: who, from which host, on what, why, and its outcome.

    ``action_id`` is None for a verb over many receipts (``prune``);
    ``namespace`` None when it spanned every namespace. ``at`` is when the
    ledger stored the record, by its own clock (None before it is stored).
    """

    operator: str
    host: str
    verb: str
    action_id: str | None
    namespace: str | None
    reason: str | None
    outcome: str
    at: datetime | None = None

    def to_json(self) -> Mapping[str, Any]:
        """The record as a JSON object."""
        return {
            "operator": self.operator,
            "host": self.host,
            "verb": self.verb,
            "action_id": self.action_id,
            "namespace": self.namespace,
            "reason": self.reason,
            "outcome": self.outcome,
            "at": None if self.at is None else self.at.isoformat(),
        }

    @classmethod
    def from_json(cls, raw: Mapping[str, Any]) -> OperatorRecord:
        """The record ``to_json`` wrote."""
        at = raw.get("at")
        return cls(
            operator=raw["operator"],
            host=raw["host"],
            verb=raw["verb"],
            action_id=raw.get("action_id"),
            namespace=raw.get("namespace"),
            reason=raw.get("reason"),
            outcome=raw["outcome"],
            at=None if at is None else datetime.fromisoformat(at),
        )
