"""DefinitiveFailure: the adapter's assertion that the effect did not happen."""

from __future__ import annotations

from typing import Any

from dataoad._errors import DataoadError, InvalidArgumentError

__all__ = ["DefinitiveFailure"]


class DefinitiveFailure(DataoadError):
    """Raise from an operation only when the side effect is known not to have happened.

    It is the one exception the runner records as FAILED; every other
    exception after invocation is UNKNOWN. ``retryable=True`` additionally
    asserts that trying again is safe (for example a rejection before any
    processing); a retry still needs a policy with ``retry_on_failed=True``.
    Never wrap generic provider errors in it: a timeout is not a failure.
    """

    def __init__(self, message: str, *, retryable: bool = False) -> None:
        if type(retryable) is not bool:
            raise InvalidArgumentError(
                f"retryable must be a bool, not {type(retryable).__qualname__}"
            )
        super().__init__(message)
        self.retryable = retryable

    def __reduce__(self) -> tuple[Any, ...]:
        return (_rebuild, (self.args, self.retryable))


def _rebuild(args: tuple[Any, ...], retryable: bool) -> DefinitiveFailure:
    return DefinitiveFailure(*args, retryable=retryable)
