"""Typed evidence on a receipt: verifier observations, recovery and operator records.

A receipt stores observations and its recovery record inside its metadata, in
the JSON shape v0.1 wrote, so every existing SQLite file and PostgreSQL table
still reads; operator records the ledger keeps beside it (see ``_codec``). The runner and
the evidence rules work only with these frozen records; the JSON mapping is
built and parsed here and nowhere else.
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any, Final

from dataoad._frozen import freeze
from dataoad._status import ActionStatus, VerificationHealth

__all__ = [
    "OBSERVATION_KEYS",
    "MAX_RECEIPT_OPERATOR_RECORDS",
    "OperatorRecord",
    "PROTOCOL_METADATA_KEYS",
    "ObservationSource",
    "RecoveryRecord",
    "VerificationObservation",
    "observations_from_metadata",
    "recovery_from_metadata",
]

#: The metadata keys derived from a receipt's observations (rewritten on every merge).
OBSERVATION_KEYS: Final = frozenset(
    {
        "verification",
        "verification_observations",
        "verification_observation_count",
        "verification_conflict",
        "provider_request_ids",
        "provider_request_id_conflict",
    }
)
#: The most operator records a receipt carries (the newest; the audit keeps every one).
MAX_RECEIPT_OPERATOR_RECORDS: Final = 100
#: Every metadata key the protocol writes: the observation keys and the recovery record.
PROTOCOL_METADATA_KEYS: Final = OBSERVATION_KEYS | {"recovery"}


class ObservationSource(enum.Enum):
    """Which runner step asked the verifier."""

    #: Read-back of one attempt right after it ran (``execute``).
    EXECUTE = "execute"
    #: Read-back of a completed UNKNOWN receipt (``reconcile``, or a replay with a verifier).
    RECONCILE = "reconcile"
    #: Read-back that completed a stranded PENDING claim (``recover_pending``).
    RECOVER = "recover"

    @property
    def covers_the_action(self) -> bool:
        """Whether it looks at the action as a whole, after execution."""
        return self is not ObservationSource.EXECUTE


@dataclasses.dataclass(frozen=True, slots=True)
class VerificationObservation:
    """One verifier answer as the runner judged it.

    ``status`` is what the runner decided the answer is worth; ``claimed``
    and the fields after it are what the verifier said (None when it raised
    or answered with something that is not a ``VerificationResult``).
    ``number`` counts every observation ever made for the claim, so dropped
    old ones still show as a gap.
    """

    source: ObservationSource
    attempt: int
    status: ActionStatus
    observed_at: datetime
    claimed: ActionStatus | None = None
    health: VerificationHealth | None = None
    conclusive_absence: bool | None = None
    retry_safe: bool | None = None
    verified_provider_reference: str | None = None
    provider_request_id: str | None = None
    reason: str | None = None
    details: Mapping[str, Any] | None = None
    error: str | None = None
    number: int | None = None

    def __post_init__(self) -> None:
        if self.details is not None:
            object.__setattr__(self, "details", freeze(self.details))

    @property
    def answered(self) -> bool:
        """Whether the verifier returned a usable ``VerificationResult``."""
        return self.claimed is not None

    def to_json(self) -> Mapping[str, Any]:
        """The stored JSON shape (v0.1's keys; absent fields are left out)."""
        record: dict[str, Any] = {
            "source": self.source.value,
            "attempt": self.attempt,
            "status": self.status.value,
            "observed_at": self.observed_at.isoformat(),
        }
        if self.claimed is not None:
            record.update(
                claimed=self.claimed.value,
                health=None if self.health is None else self.health.value,
                conclusive_absence=self.conclusive_absence,
                retry_safe=self.retry_safe,
                verified_provider_reference=self.verified_provider_reference,
                provider_request_id=self.provider_request_id,
            )
            if self.reason is not None:
                record["reason"] = self.reason
            if self.details is not None:
                record["details"] = self.details
        else:
            record["provider_request_id"] = None
        if self.error is not None:
            record["error"] = self.error
        if self.number is not None:
            record["number"] = self.number
        return freeze(record)  # type: ignore[no-any-return]

    @classmethod
    def from_json(cls, record: Mapping[str, Any]) -> VerificationObservation:
        """Parse the stored shape; ValueError when it is not one."""
        try:
            claimed = record.get("claimed")
            health = record.get("health")
            return cls(
                source=ObservationSource(record["source"]),
                attempt=int(record["attempt"]),
                status=ActionStatus(record["status"]),
                observed_at=datetime.fromisoformat(record["observed_at"]),
                claimed=None if claimed is None else ActionStatus(claimed),
                health=None if health is None else VerificationHealth(health),
                conclusive_absence=record.get("conclusive_absence"),
                retry_safe=record.get("retry_safe"),
                verified_provider_reference=record.get("verified_provider_reference"),
                provider_request_id=record.get("provider_request_id"),
                reason=record.get("reason"),
                details=record.get("details"),
                error=record.get("error"),
                number=record.get("number"),
            )
        except (KeyError, TypeError) as exc:
            raise ValueError(f"not a stored verification observation: {exc}") from exc


@dataclasses.dataclass(frozen=True, slots=True)
class RecoveryRecord:
    """How a stranded PENDING claim was completed by an operator verb."""

    method: str
    recovered_at: datetime
    attempts: int

    def to_json(self) -> Mapping[str, Any]:
        """The stored JSON shape."""
        return freeze(  # type: ignore[no-any-return]
            {
                "method": self.method,
                "recovered_at": self.recovered_at.isoformat(),
                "attempts": self.attempts,
            }
        )

    @classmethod
    def from_json(cls, record: Mapping[str, Any]) -> RecoveryRecord:
        """Parse the stored shape; ValueError when it is not one."""
        try:
            return cls(
                method=str(record["method"]),
                recovered_at=datetime.fromisoformat(record["recovered_at"]),
                attempts=int(record["attempts"]),
            )
        except (KeyError, TypeError) as exc:
            raise ValueError(f"not a stored recovery record: {exc}") from exc


def observations_from_metadata(
    metadata: Mapping[str, Any],
) -> tuple[VerificationObservation, ...]:
    """The typed observations a receipt's metadata carries, oldest first."""
    stored: Sequence[Mapping[str, Any]] = metadata.get("verification_observations", ())
    return tuple(VerificationObservation.from_json(o) for o in stored)


def recovery_from_metadata(metadata: Mapping[str, Any]) -> RecoveryRecord | None:
    """The typed recovery record a receipt's metadata carries, if any."""
    stored = metadata.get("recovery")
    return None if stored is None else RecoveryRecord.from_json(stored)


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
