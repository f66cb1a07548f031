"""What every ledger accepts at its door, refused alike by every backend before it writes.

The runner checks its own arguments long before it calls a ledger; these
checks guard a ledger called directly (a script, an operator tool, a
runner of someone else's). A value one backend could not store (a count
past PostgreSQL's ``integer``, a NUL, a lone surrogate) or would store with
another meaning (a lease of zero, minus one or NaN seconds: a claim stale
the moment it is made) raises InvalidArgumentError from every backend, and
the call writes nothing.

Cheap on purpose, since every write of every call passes here: a few type
and range tests, and a C-speed scan of each stored string. What a receipt
carries as JSON (its metadata and attempt records) is checked where it is
encoded (``ledgers._codec``); the in-memory ledger keeps those objects as
they are.
"""

from __future__ import annotations

import math
from datetime import datetime
from typing import Final

from dataoad._errors import InvalidArgumentError
from dataoad._lifecycle import check_expires_after, check_moment
from dataoad._receipt import ActionReceipt
from dataoad._status import ActionStatus, ClaimState
from dataoad._verification import unstorable

__all__ = [
    "MAX_COUNT",
    "MAX_LEASE",
    "check_claim",
    "check_key",
    "check_listing",
    "check_receipt",
    "checked_action_id",
    "checked_count",
    "checked_lease",
    "checked_older_than",
    "checked_text",
    "required_lease",
]

#: The longest lease a claim may be granted, in seconds (one day).
MAX_LEASE: Final = 86_400.0
#: The largest count a ledger stores (attempts, version, fencing token): what
#: PostgreSQL's ``integer`` holds, so every backend refuses the same receipts.
MAX_COUNT: Final = 2**31 - 1

#: A receipt's text fields, and whether each may be None.
_TEXT_FIELDS: Final = (
    ("action_id", False),
    ("namespace", False),
    ("action_name", False),
    ("idempotency_key", False),
    ("request_hash", False),
    ("provider_reference", True),
    ("risk", True),
    ("owner", True),
    ("error", True),
    ("provider_request_id", True),
)
#: A receipt's counts and the least value each may hold.
_COUNT_FIELDS: Final = (("attempts", 0), ("version", 1), ("fencing_token", 1))
_STATUS_FIELDS: Final = ("execution_status", "verification_status", "final_status")
_TIME_FIELDS: Final = ("created_at", "updated_at")


def checked_text(name: str, value: object, *, optional: bool = False) -> str | None:
    """``value`` if it is a string every ledger can store (or None, when ``optional``)."""
    if value is None and optional:
        return None
    if not isinstance(value, str):
        raise InvalidArgumentError(
            f"{name} must be a string{' or None' if optional else ''}, not {type(value).__name__}"
        )
    why = unstorable(value)
    if why is not None:
        raise InvalidArgumentError(f"{name} {why}")
    return value


def checked_action_id(action_id: object) -> str:
    """An action id as a ledger looks it up: a non-empty storable string."""
    checked_text("action_id", action_id)
    if not action_id:
        raise InvalidArgumentError("action_id must not be empty")
    return action_id  # type: ignore[return-value]


def checked_count(name: str, value: object, low: int) -> int:
    """An integer count in [low, MAX_COUNT] (a bool is no count)."""
    if type(value) is not int or not low <= value <= MAX_COUNT:
        raise InvalidArgumentError(
            f"{name} must be an integer in [{low}, {MAX_COUNT}], not {value!r}"
        )
    return value


def checked_lease(lease: object) -> float | None:
    """A claim's lease in seconds, finite in (0, MAX_LEASE], or None (no lease)."""
    return None if lease is None else _lease(lease, "None or seconds")


def required_lease(lease: object) -> float:
    """A lease that must be given (a takeover, a renewal): seconds in (0, MAX_LEASE]."""
    return _lease(lease, "seconds")


def _lease(lease: object, allowed: str) -> float:
    if (
        type(lease) not in (int, float)
        or not math.isfinite(lease)  # type: ignore[arg-type]
        or not 0 < lease <= MAX_LEASE  # type: ignore[operator]
    ):
        raise InvalidArgumentError(f"lease must be {allowed} in (0, {MAX_LEASE:g}], not {lease!r}")
    return float(lease)  # type: ignore[arg-type]


def check_key(action_name: object, idempotency_key: object, namespace: object) -> None:
    """A key as a ledger looks it up: three storable strings."""
    checked_text("action_name", action_name)
    checked_text("idempotency_key", idempotency_key)
    checked_text("namespace", namespace)


def checked_older_than(older_than: object) -> float | None:
    """An age in seconds, finite in [0, MAX_EXPIRES_AFTER], or None (no age asked for)."""
    return check_expires_after(older_than, "older_than")


def check_claim(receipt: object) -> ActionReceipt:
    """``receipt`` if it can be a new claim: storable, and holding its key (never retired)."""
    claim = check_receipt(receipt)
    if claim.retired_at is not None:
        raise InvalidArgumentError("a new claim must hold its key (retired_at is None)")
    return claim


def check_receipt(receipt: object) -> ActionReceipt:
    """``receipt`` if every ledger can store it: its counts in range, its text storable."""
    if not isinstance(receipt, ActionReceipt):
        raise InvalidArgumentError(f"a ledger stores ActionReceipts, not {type(receipt).__name__}")
    f = receipt.__dict__
    # The common case in a few C calls: every text field a plain ASCII str
    # with no NUL (joined, so one scan), every count an int in range, every
    # status and time of its exact type. Anything else is judged field by
    # field, which also says what is wrong.
    try:
        text = "".join(
            (
                f["action_id"],
                f["namespace"],
                f["action_name"],
                f["idempotency_key"],
                f["request_hash"],
                "" if f["provider_reference"] is None else f["provider_reference"],
                "" if f["risk"] is None else f["risk"],
                "" if f["owner"] is None else f["owner"],
                "" if f["error"] is None else f["error"],
                "" if f["provider_request_id"] is None else f["provider_request_id"],
            )
        )
    except TypeError:
        return _judged(receipt)
    attempts, version, token = f["attempts"], f["version"], f["fencing_token"]
    created, updated = f["created_at"], f["updated_at"]
    if (
        text.isascii()
        and "\x00" not in text
        and f["action_id"]
        and type(attempts) is int
        and type(version) is int
        and type(token) is int
        and 0 <= attempts <= MAX_COUNT
        and 1 <= version <= MAX_COUNT
        and 1 <= token <= MAX_COUNT
        and type(f["claim_state"]) is ClaimState
        and (f["execution_status"] is None or type(f["execution_status"]) is ActionStatus)
        and (f["verification_status"] is None or type(f["verification_status"]) is ActionStatus)
        and (f["final_status"] is None or type(f["final_status"]) is ActionStatus)
        and type(created) is datetime
        and created.tzinfo is not None
        and type(updated) is datetime
        and updated.tzinfo is not None
    ):
        return receipt
    return _judged(receipt)


def _judged(receipt: ActionReceipt) -> ActionReceipt:
    """``check_receipt`` field by field: InvalidArgumentError naming the first wrong one."""
    fields = receipt.__dict__
    for name, low in _COUNT_FIELDS:
        checked_count(name, fields[name], low)
    for name, optional in _TEXT_FIELDS:
        checked_text(name, fields[name], optional=optional)
    if not receipt.action_id:
        raise InvalidArgumentError("action_id must not be empty")
    if not isinstance(fields["claim_state"], ClaimState):
        raise InvalidArgumentError(
            f"claim_state must be a ClaimState, not {type(fields['claim_state']).__name__}"
        )
    for name in _STATUS_FIELDS:
        value = fields[name]
        if value is not None and not isinstance(value, ActionStatus):
            raise InvalidArgumentError(
                f"{name} must be an ActionStatus or None, not {type(value).__name__}"
            )
    for name in _TIME_FIELDS:
        value = fields[name]
        # Naive times would sort and compare apart from every stored one.
        if not isinstance(value, datetime) or value.tzinfo is None:
            raise InvalidArgumentError(f"{name} must be a timezone-aware datetime, not {value!r}")
    return receipt


def check_listing(
    *,
    final_status: object,
    pending: object,
    stale: object,
    action_name: object,
    idempotency_key: object,
    action_id_prefix: object,
    since: object,
    limit: object,
    namespace: object,
    newest_first: object,
) -> None:
    """A ``receipts()`` listing's filters, each None or of its kind (``limit``: 0 and up)."""
    if final_status is not None and not isinstance(final_status, ActionStatus):
        raise InvalidArgumentError(
            f"final_status must be an ActionStatus or None, not {type(final_status).__name__}"
        )
    for name, flag in (("pending", pending), ("stale", stale)):
        if flag is not None and type(flag) is not bool:
            raise InvalidArgumentError(f"{name} must be True, False or None, not {flag!r}")
    if type(newest_first) is not bool:
        raise InvalidArgumentError(f"newest_first must be True or False, not {newest_first!r}")
    for name, text in (
        ("action_name", action_name),
        ("idempotency_key", idempotency_key),
        ("action_id_prefix", action_id_prefix),
        ("namespace", namespace),
    ):
        checked_text(name, text, optional=True)
    if since is not None:
        check_moment("since", since)
    if limit is not None:
        checked_count("limit", limit, 0)
