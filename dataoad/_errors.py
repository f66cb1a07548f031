"""The error hierarchy. Every error Dataoad raises derives from DataoadError."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from dataoad._receipt import ActionReceipt
    from dataoad._status import ActionStatus

__all__ = [
    "LedgerClosedError",
    "LedgerDurabilityError",
    "NotInStepError",
    "LedgerUnusableError",
    "MissingExtraError",
    "ActionInProgressError",
    "ActionNotFoundError",
    "ActionPersistenceError",
    "AuditNotRecordedError",
    "ClaimFencedError",
    "NothingInvokedError",
    "OutcomeNotRecordedError",
    "DataoadError",
    "IdempotencyConflictError",
    "InvalidArgumentError",
    "InvalidRequestError",
    "RecoveryRefusedError",
    "ReservedMetadataError",
    "ResultValueUnavailableError",
    "UnresolvedActionError",
]


class DataoadError(Exception):
    """Base class of every error raised by Dataoad."""


class InvalidArgumentError(DataoadError, TypeError, ValueError):
    """An argument to a public function has the wrong type or value.

    Raised before any ledger write and before any operation call. It derives
    from both TypeError and ValueError so callers can catch either.
    """


class InvalidRequestError(DataoadError, TypeError):
    """The request is not a strict JSON object; ``path`` names the offending part."""

    def __init__(self, message: str, *, path: str = "request") -> None:
        super().__init__(message)
        self.path = path

    def __reduce__(self) -> tuple[Any, ...]:
        return (_rebuild, (type(self), self.args, {"path": self.path}))


class ReservedMetadataError(DataoadError, ValueError):
    """Caller metadata used a top-level key reserved for the receipt protocol."""

    def __init__(self, message: str, *, keys: tuple[str, ...] = ()) -> None:
        super().__init__(message)
        self.keys = keys

    def __reduce__(self) -> tuple[Any, ...]:
        return (_rebuild, (type(self), self.args, {"keys": self.keys}))


class _ClaimError(DataoadError):
    """An error about an existing claim; carries that claim's receipt."""

    def __init__(self, message: str, *, receipt: ActionReceipt) -> None:
        super().__init__(message)
        self.receipt = receipt

    @property
    def action_id(self) -> str:
        """The action id of the existing claim."""
        return self.receipt.action_id

    def __reduce__(self) -> tuple[Any, ...]:
        return (_rebuild, (type(self), self.args, {"receipt": self.receipt}))


class ActionInProgressError(_ClaimError):
    """The same action and key is claimed and not completed; nothing was invoked."""


class IdempotencyConflictError(_ClaimError):
    """The key is already claimed for a different request or provider reference."""


class RecoveryRefusedError(DataoadError):
    """A recovery or release was refused because it could be unsafe."""

    def __init__(self, message: str, *, receipt: ActionReceipt | None = None) -> None:
        super().__init__(message)
        self.receipt = receipt

    def __reduce__(self) -> tuple[Any, ...]:
        return (_rebuild, (type(self), self.args, {"receipt": self.receipt}))


class AuditNotRecordedError(DataoadError):
    """An operator verb was done, but its OperatorRecord could not be appended to the audit.

    ``record`` is the record that is missing; ``result`` what the verb returned.
    """

    def __init__(self, message: str, *, record: Any = None, result: Any = None) -> None:
        super().__init__(message)
        self.record = record
        self.result = result

    def __reduce__(self) -> tuple[Any, ...]:
        return (_rebuild, (type(self), self.args, {"record": self.record, "result": self.result}))


class ActionNotFoundError(DataoadError, LookupError):
    """No receipt with the given action id exists in the ledger."""

    def __init__(self, message: str, *, action_id: str = "") -> None:
        super().__init__(message)
        self.action_id = action_id

    def __reduce__(self) -> tuple[Any, ...]:
        return (_rebuild, (type(self), self.args, {"action_id": self.action_id}))


class UnresolvedActionError(DataoadError):
    """The action is not CONFIRMED: ``ActionResult.value`` was read for a FAILED or UNKNOWN
    result, or an engine step's outcome is UNKNOWN. ``receipt`` says which and why (an
    engine that carries only the id across a process, Temporal's, gives ``action_id``)."""

    def __init__(
        self, message: str, *, receipt: ActionReceipt | None = None, action_id: str | None = None
    ) -> None:
        super().__init__(message)
        self.receipt = receipt
        self._action_id = action_id

    @property
    def action_id(self) -> str | None:
        """The unresolved action's id (None when it is not known)."""
        return self._action_id if self.receipt is None else self.receipt.action_id

    def __reduce__(self) -> tuple[Any, ...]:
        # Engines store a step's exception (DBOS pickles it) and raise it again.
        return (
            _rebuild,
            (type(self), self.args, {"receipt": self.receipt, "action_id": self._action_id}),
        )


class ResultValueUnavailableError(DataoadError):
    """The result is CONFIRMED but no value correlated with it is available."""


class ActionPersistenceError(DataoadError):
    """A ledger transition could not be proven durable.

    ``receipt`` is the last receipt this runner safely observed (None when the
    ledger could not even be read), not a promise that the failed write did
    not commit. ``operation_invoked`` says whether the
    operation ran in this call. The ``observed_*`` fields are the in-process
    evidence at the time of the failure: diagnostics, not durable facts. Never
    treat this error as permission to repeat the mutation; re-read the ledger.
    """

    def __init__(
        self,
        message: str,
        *,
        receipt: ActionReceipt | None,
        operation_invoked: bool,
        observed_status: ActionStatus | None = None,
        observed_metadata: Mapping[str, Any] | None = None,
        value_available: bool = False,
        observed_value: object = None,
    ) -> None:
        super().__init__(message)
        self.receipt = receipt
        self.operation_invoked = operation_invoked
        self.observed_status = observed_status
        self.observed_metadata = observed_metadata
        self.value_available = value_available
        self.observed_value = observed_value if value_available else None

    @property
    def action_id(self) -> str | None:
        """The action id of the affected claim, if one was known."""
        return None if self.receipt is None else self.receipt.action_id

    def __reduce__(self) -> tuple[Any, ...]:
        state = {
            "receipt": self.receipt,
            "operation_invoked": self.operation_invoked,
            "observed_status": self.observed_status,
            "observed_metadata": None
            if self.observed_metadata is None
            else dict(self.observed_metadata),
            "value_available": self.value_available,
            "observed_value": self.observed_value,
        }
        return (_rebuild, (type(self), self.args, state))


class NothingInvokedError(ActionPersistenceError):
    """This call invoked nothing: a claim, an attempt start, a read, a verification,
    a release, or the lease renewal of an attempt that began late could not be
    proven, so the operation was not called by it.

    ``operation_invoked`` is always False. The same call may be made again
    later (it goes through the claim again). A claim it may have left
    counts attempt 1 (claim and attempt start are one write) although
    nothing ran: it settles read-only (``recover_pending``) or by a lease
    takeover, like any stranded claim.
    """


class OutcomeNotRecordedError(ActionPersistenceError):
    """The operation WAS invoked by this call, and its outcome could not be recorded.

    ``operation_invoked`` is always True and ``observed_status`` carries the
    evidence seen. Do not repeat the operation: re-read the ledger, and settle
    a PENDING claim read-only (``recover_pending``).
    """


class ClaimFencedError(ActionPersistenceError):
    """This worker lost its claim: its lease ran out and another worker took it over.

    A fenced worker (a zombie) can no longer write the claim. What it
    observed was merged into the receipt as evidence (``receipt`` is the
    receipt after that merge, when it could be written), never overwriting
    the new owner's record. ``operation_invoked`` says whether this call ran
    the operation; if it did, do not repeat it.
    """


class LedgerUnusableError(DataoadError):
    """The ledger cannot be used as configured (not a ledger file, no schema yet, a newer
    schema); it was left unchanged and no statement of the call ran."""


class NotInStepError(DataoadError, RuntimeError):
    """An engine-guarded step ran where the engine gives it no identity (outside a workflow,
    activity or graph task), so it has no stable key; nothing was recorded or invoked."""


class LedgerClosedError(LedgerUnusableError):
    """The ledger was closed; nothing was read or written. Open a new one."""


class LedgerDurabilityError(LedgerUnusableError):
    """The ledger could lose a claim it acknowledged (``require_durable=True``); ``report``
    says how and what to set. No claim was written (the ledger is closed)."""

    def __init__(self, message: str, *, report: Any = None) -> None:
        super().__init__(message)
        self.report = report

    def __reduce__(self) -> tuple[Any, ...]:
        return (_rebuild, (type(self), self.args, {"report": self.report}))


class MissingExtraError(DataoadError, ImportError):
    """An optional dependency is not installed; the message names the extra to install."""

    @classmethod
    def for_extra(cls, feature: str, module: str, extra: str) -> MissingExtraError:
        """The error for ``feature``, which needs ``module`` from the ``extra`` extra.

        The hint installs from a Dataoad checkout or a built wheel: the
        ``dataoad`` on the public package index is a different project.
        """
        return cls(
            f"{feature} needs {module}, from Dataoad's '{extra}' extra: "
            f'pip install -e ".[{extra}]" in a Dataoad checkout (or "dataoad-0.2*.whl[{extra}]" '
            "for a built wheel); the 'dataoad' on the public package index is another project"
        )


def _rebuild(cls: type[BaseException], args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    return cls(*args, **kwargs)
