"""The retry policy: when, if ever, the runner may invoke an operation again."""

from __future__ import annotations

import dataclasses
import warnings

from dataoad._errors import InvalidArgumentError
from dataoad._status import ActionStatus

__all__ = ["RetryPolicy", "UNKNOWN_RETRY_WARNING"]

UNKNOWN_RETRY_WARNING = (
    "RetryPolicy(retry_on_unknown=True) retries actions whose side effect may already "
    "have happened; this can duplicate real-world effects unless the operation is "
    "independently idempotent downstream"
)


@dataclasses.dataclass(frozen=True, slots=True)
class RetryPolicy:
    """How many attempts one claim may make, and on what evidence.

    The default makes one attempt and never retries. FAILED is retried only
    with ``retry_on_failed=True``, spare attempts, and evidence that the failure
    is retryable. ``retry_on_unknown=True`` is a loud escape hatch: it warns,
    because an UNKNOWN attempt may already have produced the side effect.
    """

    max_attempts: int = 1
    retry_on_failed: bool = False
    retry_on_unknown: bool = False

    def __post_init__(self) -> None:
        if type(self.max_attempts) is not int:
            raise InvalidArgumentError(
                f"max_attempts must be an int, not {type(self.max_attempts).__qualname__}"
            )
        if self.max_attempts < 1:
            raise InvalidArgumentError(f"max_attempts must be >= 1, got {self.max_attempts}")
        for name in ("retry_on_failed", "retry_on_unknown"):
            if type(getattr(self, name)) is not bool:
                raise InvalidArgumentError(
                    f"{name} must be a bool, not {type(getattr(self, name)).__qualname__}"
                )
        if self.retry_on_unknown:
            warnings.warn(UNKNOWN_RETRY_WARNING, RuntimeWarning, stacklevel=3)

    def should_retry(self, status: ActionStatus, attempts: int, failure_is_retryable: bool) -> bool:
        """Whether another attempt is allowed after ``attempts`` attempts ended in ``status``.

        Returns True only when attempts remain and either ``status`` is FAILED,
        ``retry_on_failed`` is set and ``failure_is_retryable`` is True, or
        ``status`` is UNKNOWN and the ``retry_on_unknown`` escape hatch is set.
        Arguments are checked by exact type; anything else raises
        InvalidArgumentError instead of falling through to a retry.
        """
        if type(status) is not ActionStatus:
            raise InvalidArgumentError(
                f"status must be an ActionStatus, not {type(status).__qualname__}"
            )
        if type(attempts) is not int:
            raise InvalidArgumentError(
                f"attempts must be an int, not {type(attempts).__qualname__}"
            )
        if attempts < 1:
            raise InvalidArgumentError(f"attempts must be >= 1, got {attempts}")
        if type(failure_is_retryable) is not bool:
            raise InvalidArgumentError(
                "failure_is_retryable must be a bool, not "
                f"{type(failure_is_retryable).__qualname__}"
            )
        return decide_retry(
            status,
            attempts=attempts,
            failure_is_retryable=failure_is_retryable,
            max_attempts=self.max_attempts,
            retry_on_failed=self.retry_on_failed,
            retry_on_unknown=self.retry_on_unknown,
        )


def decide_retry(
    status: ActionStatus,
    *,
    attempts: int,
    failure_is_retryable: bool,
    max_attempts: int,
    retry_on_failed: bool,
    retry_on_unknown: bool,
) -> bool:
    """The pure retry rule, on already-validated inputs.

    post: not __return__ or attempts < max_attempts
    post: not __return__ or status != ActionStatus.CONFIRMED
    post: not __return__ or status != ActionStatus.FAILED or (retry_on_failed and failure_is_retryable)
    post: not __return__ or status != ActionStatus.UNKNOWN or retry_on_unknown
    """
    if attempts >= max_attempts:
        return False
    if status is ActionStatus.FAILED:
        return retry_on_failed and failure_is_retryable
    if status is ActionStatus.UNKNOWN:
        return retry_on_unknown
    return False
