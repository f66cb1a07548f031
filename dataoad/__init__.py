"""Dataoad: evidence-based execution contracts for side-effecting actions.

A timeout does not prove an action failed. Dataoad records every action as a
durable receipt whose outcome is an evidence statement (CONFIRMED, FAILED or
UNKNOWN), never retries an ambiguous mutation by default, and settles
ambiguity only through read-only verifiers bound to the provider's reference.
"""

from __future__ import annotations

from dataoad._current import AttemptContext, current_attempt
from dataoad._errors import (
    ActionInProgressError,
    ActionNotFoundError,
    ActionPersistenceError,
    AuditNotRecordedError,
    ClaimFencedError,
    DataoadError,
    IdempotencyConflictError,
    InvalidArgumentError,
    InvalidRequestError,
    LedgerClosedError,
    LedgerDurabilityError,
    LedgerUnusableError,
    MissingExtraError,
    NothingInvokedError,
    NotInStepError,
    OutcomeNotRecordedError,
    RecoveryRefusedError,
    ReservedMetadataError,
    ResultValueUnavailableError,
    UnresolvedActionError,
)
from dataoad._events import EventKind, RunnerEvent, RunnerObserver
from dataoad._failure import DefinitiveFailure
from dataoad._guard import guarded
from dataoad._intent import intent_key
from dataoad._ledger import LeasingLedger, Ledger, LifecycleLedger
from dataoad._operator import OperatorRecord
from dataoad._policy import RetryPolicy
from dataoad._receipt import ActionReceipt, AttemptRecord
from dataoad._records import ObservationSource, RecoveryRecord, VerificationObservation
from dataoad._result import ActionResult
from dataoad._runner import ActionRunner
from dataoad._status import ActionStatus, ClaimState, VerificationHealth
from dataoad._sync import SyncActionRunner
from dataoad._tool import GuardedTool, ToolOutcome, describe_result, run_tool
from dataoad._verification import VerificationResult, Verifier
from dataoad._version import __version__
from dataoad.ledgers._durability import DurabilityReport
from dataoad.ledgers.memory import InMemoryLedger
from dataoad.ledgers.postgres import LedgerSchemaError, PostgresLedger
from dataoad.ledgers.sqlite import LedgerBusyError, LedgerFileError, SQLiteLedger

__all__ = [
    # running actions
    "ActionRunner",
    "RetryPolicy",
    "DefinitiveFailure",
    "guarded",
    "SyncActionRunner",
    # leases and fencing
    "current_attempt",
    "AttemptContext",
    # outcomes and receipts
    "ActionStatus",
    "ClaimState",
    "ActionResult",
    "ActionReceipt",
    "AttemptRecord",
    "VerificationObservation",
    "ObservationSource",
    "RecoveryRecord",
    "OperatorRecord",
    # agent tools
    "GuardedTool",
    "ToolOutcome",
    "describe_result",
    "intent_key",
    "run_tool",
    # observing the runner
    "RunnerObserver",
    "RunnerEvent",
    "EventKind",
    # verification
    "Verifier",
    "VerificationResult",
    "VerificationHealth",
    # ledgers
    "Ledger",
    "LeasingLedger",
    "LifecycleLedger",
    "InMemoryLedger",
    "SQLiteLedger",
    "PostgresLedger",
    # errors
    "DataoadError",
    "ClaimFencedError",
    "ActionInProgressError",
    "IdempotencyConflictError",
    "ActionPersistenceError",
    "NotInStepError",
    "NothingInvokedError",
    "OutcomeNotRecordedError",
    "UnresolvedActionError",
    "ResultValueUnavailableError",
    "InvalidArgumentError",
    "InvalidRequestError",
    "ReservedMetadataError",
    "RecoveryRefusedError",
    "ActionNotFoundError",
    "AuditNotRecordedError",
    "LedgerFileError",
    "LedgerBusyError",
    "LedgerSchemaError",
    "LedgerClosedError",
    "LedgerDurabilityError",
    "DurabilityReport",
    "LedgerUnusableError",
    "MissingExtraError",
    "__version__",
]


def _public_home() -> None:
    # Every public class and function says it lives in ``dataoad`` (reprs,
    # pickles, the API reference), wherever it is defined. Set here only.
    for name in __all__:
        public = globals()[name]
        if isinstance(public, type) or callable(public):
            public.__module__ = "dataoad"


_public_home()
