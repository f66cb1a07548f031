"""Operator records: who ran an operator verb, from where, why, and what came of it.

An UNKNOWN receipt is a decision a person makes (verify, wait, settle). Each
operator verb (recover, recover_stale, reopen, release_unstarted, prune, and
the console's actions) leaves one ``OperatorRecord`` in the ledger's
append-only audit, which outlives the receipts it names. The record's time
is the ledger's own clock, stamped when it is stored.
"""

from __future__ import annotations

import getpass
import socket
from typing import Final

from dataoad._errors import InvalidArgumentError
from dataoad._receipt import bound_text
from dataoad._records import OperatorRecord
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
