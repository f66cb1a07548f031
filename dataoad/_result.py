"""ActionResult: the outcome handed back to the caller."""

from __future__ import annotations

from typing import Generic, TypeVar

from dataoad._errors import ResultValueUnavailableError, UnresolvedActionError
from dataoad._receipt import ActionReceipt
from dataoad._status import ActionStatus
from dataoad._verification import MISSING

__all__ = ["ActionResult"]

T = TypeVar("T")


class ActionResult(Generic[T]):
    """The evidence statement for one action, plus its value when that is safe.

    ``status`` is the receipt's ``final_status``. ``value`` is readable only
    for a CONFIRMED result with a correlated value: it raises
    UnresolvedActionError for FAILED or UNKNOWN, and
    ResultValueUnavailableError when no correlated value exists (every replay
    from a durable receipt, since values are never persisted).
    """

    __slots__ = ("_value", "receipt", "replayed", "taken_over")

    def __init__(
        self,
        receipt: ActionReceipt,
        *,
        replayed: bool = False,
        value: object = MISSING,
        taken_over: bool = False,
    ) -> None:
        if receipt.final_status is None:
            raise ValueError("an ActionResult needs a receipt with a final status")
        self.receipt = receipt
        self.replayed = replayed
        #: Whether this call took the claim over from a worker whose lease ran out.
        self.taken_over = taken_over
        # A value is only ever attached to a CONFIRMED result.
        self._value = value if receipt.final_status is ActionStatus.CONFIRMED else MISSING

    @property
    def status(self) -> ActionStatus:
        """The public outcome: CONFIRMED, FAILED or UNKNOWN."""
        status = self.receipt.final_status
        assert status is not None
        return status

    @property
    def value_available(self) -> bool:
        """True exactly when reading ``value`` would return."""
        return self.status is ActionStatus.CONFIRMED and self._value is not MISSING

    @property
    def value(self) -> T:
        """The operation's (or verifier's) correlated value for a CONFIRMED result."""
        status = self.status
        if status is not ActionStatus.CONFIRMED:
            raise UnresolvedActionError(
                f"action {self.receipt.action_id} is {status.value}; its value cannot be read "
                "because the side effect is not confirmed",
                receipt=self.receipt,
            )
        if self._value is MISSING:
            raise ResultValueUnavailableError(
                f"action {self.receipt.action_id} is CONFIRMED but no correlated value is "
                "available (values are never persisted; read the system of record)"
            )
        return self._value  # type: ignore[return-value]

    def __repr__(self) -> str:
        return (
            f"ActionResult(status={self.status.value}, action_id={self.receipt.action_id!r}, "
            f"replayed={self.replayed}, value_available={self.value_available}"
            + (", taken_over=True)" if self.taken_over else ")")
        )
