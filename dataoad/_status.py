"""The three public outcome statements and the internal claim lifecycle."""

from __future__ import annotations

import enum

__all__ = ["ActionStatus", "ClaimState", "VerificationHealth"]


class ActionStatus(enum.Enum):
    """What the evidence establishes about an intended side effect."""

    #: Sufficient evidence shows the effect happened (at least once).
    CONFIRMED = "CONFIRMED"
    #: Sufficient evidence shows the effect did not happen and cannot happen later.
    FAILED = "FAILED"
    #: There is not enough trustworthy evidence either way.
    UNKNOWN = "UNKNOWN"


class ClaimState(enum.Enum):
    """Lifecycle of an idempotency claim; never a public outcome."""

    #: The claim exists and its work has not been recorded as finished.
    PENDING = "PENDING"
    #: The claim's outcome has been recorded; duplicates replay it.
    COMPLETED = "COMPLETED"


class VerificationHealth(enum.Enum):
    """How far a verifier's read path can be trusted for this observation."""

    #: The read was complete, fresh and authoritative.
    HEALTHY = "HEALTHY"
    #: The read answered, but may be stale, partial or otherwise untrustworthy.
    DEGRADED = "DEGRADED"
    #: The read path could not be used at all.
    UNAVAILABLE = "UNAVAILABLE"
