"""Receipts: immutable snapshots of a claim and its attempts."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from datetime import datetime
from typing import Any, Final, Literal

from dataoad._clock import utc_now
from dataoad._frozen import freeze
from dataoad._records import (
    OperatorRecord,
    RecoveryRecord,
    VerificationObservation,
    observations_from_metadata,
    recovery_from_metadata,
)
from dataoad._status import ActionStatus, ClaimState

__all__ = [
    "MAX_ERROR_LENGTH",
    "ActionReceipt",
    "AttemptRecord",
    "bounded_error",
    "build_receipt",
    "utc_now",
]

#: Stored error strings (type name and message) never exceed this many characters.
MAX_ERROR_LENGTH: Final = 1000

RetryDecision = Literal["retry", "stop"]


def bounded_error(exc: BaseException) -> str:
    """``"TypeName: message"``, cut to MAX_ERROR_LENGTH characters.

    Never raises: an exception whose ``str()`` fails is still described.
    """
    name = type(exc).__name__
    try:
        message = str(exc)
    except Exception:
        message = "<unprintable message>"
    return bound_text(f"{name}: {message}" if message else name)


def bound_text(text: str) -> str:
    """Make an arbitrary string storable by every ledger, cut to MAX_ERROR_LENGTH.

    No NUL (PostgreSQL text cannot hold one) and no lone surrogate (no
    encoder writes one; bytes decoded with ``surrogateescape`` carry them):
    both are written as backslash escapes, so the text stays readable.
    """
    text = text.replace("\x00", "\\x00").encode("utf-8", "backslashreplace").decode("utf-8")
    if len(text) > MAX_ERROR_LENGTH:
        return text[: MAX_ERROR_LENGTH - 1] + "\u2026"
    return text


@dataclasses.dataclass(frozen=True, slots=True)
class AttemptRecord:
    """One invocation of the operation under a claim.

    ``execution_status`` is None while the attempt has not finished (for
    example after a crash); ``retry_decision`` says whether the runner made
    another attempt after this one.
    """

    number: int
    started_at: datetime
    execution_status: ActionStatus | None = None
    verification_status: ActionStatus | None = None
    error: str | None = None
    provider_request_id: str | None = None
    retry_decision: RetryDecision | None = None
    finished_at: datetime | None = None

    @property
    def finished(self) -> bool:
        """Whether the attempt's outcome was recorded."""
        return self.finished_at is not None


@dataclasses.dataclass(frozen=True)
class ActionReceipt:
    """An immutable snapshot of one idempotency claim, as the ledger holds it.

    The three statuses separate what direct execution established, what
    independent read-back established, and the current public statement
    (``final_status``, which ``ActionResult.status`` reports). All three are
    None while nothing is established. ``version`` grows by one on every
    durable transition. Raw requests and provider return values are never
    kept: only ``request_hash``, identifiers, bounded errors and JSON metadata.
    ``owner``, ``lease_expires_at`` and ``fencing_token`` say who may write a
    PENDING claim, until when, and under which fence (see ``_leases``).
    ``namespace`` scopes the key; ``retired_at`` is set once the key was
    freed from this receipt, which then stays readable by its id.
    """

    action_id: str
    action_name: str
    idempotency_key: str
    request_hash: str
    provider_reference: str | None
    risk: str | None
    claim_state: ClaimState
    attempts: int
    execution_status: ActionStatus | None
    verification_status: ActionStatus | None
    final_status: ActionStatus | None
    provider_request_id: str | None
    error: str | None
    metadata: Mapping[str, Any]
    attempt_records: tuple[AttemptRecord, ...]
    version: int
    created_at: datetime
    updated_at: datetime
    #: The worker holding (or, once COMPLETED, last holding) the claim.
    owner: str | None = None
    #: When the owner's lease runs out, on the ledger's own clock; None when
    #: COMPLETED or unleased. The ledger stamps it and a renewal moves it
    #: without a new version, so equality ignores it.
    lease_expires_at: datetime | None = dataclasses.field(default=None, compare=False)
    #: 1 when claimed, one more on every change of owner.
    fencing_token: int = 1
    #: The tenant or scope the key belongs to; keys of different namespaces
    #: never meet. ``""`` is the default namespace.
    namespace: str = ""
    #: When the key was freed from this receipt (expired or reopened, see
    #: ``_lifecycle``); None while the receipt holds its key.
    retired_at: datetime | None = None
    #: When the ledger stored this version, read from the ledger's own clock
    #: (None on a new version not yet stored, such as the copies the runner
    #: builds: read the receipt back to see it). Every age the ledger judges (expiry,
    #: retention) is measured from it, never from a writer's ``updated_at``,
    #: so no decision compares two hosts' clocks. The ledger stamps it, so
    #: equality ignores it.
    stored_at: datetime | None = dataclasses.field(default=None, compare=False)
    #: The operator verbs run on this receipt, oldest first (the newest
    #: ``MAX_RECEIPT_OPERATOR_RECORDS``; ``ledger.audit()`` keeps them all).
    #: The ledger appends them with each audit record, never a writer, so a
    #: write ignores this field and equality too.
    operator_records: tuple[OperatorRecord, ...] = dataclasses.field(default=(), compare=False)

    def __post_init__(self) -> None:
        # The fields live in __dict__ (no slots): normalised there, as
        # ``build_receipt`` normalises the dict it is given.
        _normalise(self.__dict__)

    @property
    def is_pending(self) -> bool:
        """Whether the claim is still PENDING (its outcome not yet recorded)."""
        return self.claim_state is ClaimState.PENDING

    @property
    def holds_key(self) -> bool:
        """Whether this receipt still answers for its key (it was never retired)."""
        return self.retired_at is None

    @property
    def observations(self) -> tuple[VerificationObservation, ...]:
        """The verifier observations kept for this claim, oldest first."""
        return observations_from_metadata(self.metadata)

    @property
    def recovery(self) -> RecoveryRecord | None:
        """How an operator verb completed this claim, if one did."""
        return recovery_from_metadata(self.metadata)

    def evolve(self, **changes: Any) -> ActionReceipt:
        """A copy with ``changes`` applied (the ledger decides if it is stored).

        What ``dataclasses.replace`` would build, without re-freezing what is
        already frozen: only changed metadata and attempt records are frozen
        again (the receipt transitions of every call go through here).
        """
        if not _FIELD_SET.issuperset(changes):
            unknown = sorted(changes.keys() - _FIELD_SET)
            raise TypeError(f"ActionReceipt has no field {unknown[0]!r}")
        # ``changes`` is this call's own dict: normalised in place, then copied in.
        if "version" in changes and "stored_at" not in changes:
            # A new version is not stored yet: when it is, is the ledger's to say.
            changes["stored_at"] = None
        if "metadata" in changes:
            changes["metadata"] = freeze(changes["metadata"])
        if "attempt_records" in changes:
            changes["attempt_records"] = tuple(changes["attempt_records"])
        new = _copy_with(self, changes)
        _release_if_completed(new.__dict__)
        return new


_FIELD_SET: Final = frozenset(field.name for field in dataclasses.fields(ActionReceipt))


def build_receipt(fields: dict[str, Any]) -> ActionReceipt:
    """``ActionReceipt(**fields)``, for a ``fields`` that names every field.

    The same receipt, built as ``evolve`` builds copies: every call proposes
    a claim (a replay too) and every SQL read decodes one, and the frozen
    ``__init__`` setting its 25 fields one by one cost about a quarter of a
    replay. ``fields`` is the caller's own dict, normalised in place and
    copied in; TypeError when it misses or adds a field.
    """
    if len(fields) != len(_FIELD_SET) or not _FIELD_SET.issuperset(fields):
        missing = sorted(_FIELD_SET - fields.keys()) or sorted(fields.keys() - _FIELD_SET)
        raise TypeError(f"ActionReceipt fields do not match at {missing[0]!r}")
    _normalise(fields)
    return _assembled(fields)


def _normalise(fields: dict[str, Any]) -> None:
    # Deep-freeze, so no holder of a snapshot can change what others see.
    fields["metadata"] = freeze(fields["metadata"])
    fields["attempt_records"] = tuple(fields["attempt_records"])
    _release_if_completed(fields)


def _release_if_completed(fields: dict[str, Any]) -> None:
    # Nobody holds a completed claim, however its receipt was built.
    if fields["lease_expires_at"] is not None and fields["claim_state"] is ClaimState.COMPLETED:
        fields["lease_expires_at"] = None


def _copy_with(receipt: ActionReceipt, changes: dict[str, Any]) -> ActionReceipt:
    # A receipt keeps its fields in its __dict__ (no slots) so that a copy is
    # two dict updates: field by field, a copy cost more than the rest of a
    # transition, and every call makes several.
    new = object.__new__(ActionReceipt)
    fields = new.__dict__
    fields.update(receipt.__dict__)
    fields.update(changes)
    return new


def _assembled(fields: dict[str, Any]) -> ActionReceipt:
    # ``build_receipt``'s receipt: its fields, checked and normalised, copied in.
    new = object.__new__(ActionReceipt)
    new.__dict__.update(fields)
    return new
