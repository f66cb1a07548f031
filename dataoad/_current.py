"""``current_attempt()``: what an operation may know about the attempt it runs in.

A provider that supports conditional or fenced requests can pass the
fencing token along, so a worker that lost its claim (a zombie) has its
late request refused by the provider itself.
"""

from __future__ import annotations

import contextvars
import dataclasses

from dataoad._receipt import ActionReceipt

__all__ = ["AttemptContext", "current_attempt", "running_attempt"]


@dataclasses.dataclass(frozen=True, slots=True)
class AttemptContext:
    """The claim and attempt an operation is running under."""

    action_id: str
    action_name: str
    idempotency_key: str
    provider_reference: str | None
    #: The 1-based attempt number.
    attempt: int
    #: The claim's fencing token: higher means a later owner.
    fencing_token: int


# The receipt the attempt runs under, not its AttemptContext: every attempt
# sets this, few operations ask, so the context is built only when asked.
_current: contextvars.ContextVar[ActionReceipt | None] = contextvars.ContextVar(
    "dataoad_current_attempt", default=None
)


def current_attempt() -> AttemptContext | None:
    """The attempt the calling operation runs in (sync or async), or None outside one."""
    receipt = _current.get()
    if receipt is None:
        return None
    return AttemptContext(
        action_id=receipt.action_id,
        action_name=receipt.action_name,
        idempotency_key=receipt.idempotency_key,
        provider_reference=receipt.provider_reference,
        attempt=receipt.attempts,
        fencing_token=receipt.fencing_token,
    )


class running_attempt:
    """Within this block, ``current_attempt()`` describes ``receipt``'s latest attempt.

    A class, not a generator: every attempt enters it.
    """

    __slots__ = ("_receipt", "_token")

    def __init__(self, receipt: ActionReceipt) -> None:
        self._receipt = receipt

    def __enter__(self) -> None:
        self._token = _current.set(self._receipt)

    def __exit__(self, *exc_info: object) -> None:
        _current.reset(self._token)
