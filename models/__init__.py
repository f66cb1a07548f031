"""The executable reference model of Dataoad's protocol.

Pure and synchronous, written from the specification rather than from the
library's code: the library is what it checks. ``world`` models the
provider's truth, ``ledger`` the claim store, ``protocol`` the evidence rules
and the set of outcomes the specification permits.
"""

from models.ledger import AbstractLedger, ModelReceipt
from models.protocol import (
    Evidence,
    Outcome,
    aggregate,
    classify_execution,
    classify_verification,
    evidence_permits,
    merge,
    permitted_outcomes,
    retry_allowed,
)
from models.world import World

__all__ = [
    "AbstractLedger",
    "Evidence",
    "ModelReceipt",
    "Outcome",
    "World",
    "aggregate",
    "classify_execution",
    "classify_verification",
    "evidence_permits",
    "merge",
    "permitted_outcomes",
    "retry_allowed",
]
