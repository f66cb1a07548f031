"""Verifier results, the Verifier protocol, and what a result is worth.

A verifier only reports what it read. The runner decides what that report
proves: :func:`classify_verification` is the single rule for it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Awaitable, Callable, Mapping
from typing import TYPE_CHECKING, Any, Final, Protocol, TypeAlias, runtime_checkable

from dataoad._canonical import validate_json_object
from dataoad._errors import InvalidArgumentError
from dataoad._frozen import freeze
from dataoad._status import ActionStatus, VerificationHealth

if TYPE_CHECKING:
    from dataoad._receipt import ActionReceipt

__all__ = [
    "MISSING",
    "AnyVerifier",
    "VerificationResult",
    "Verifier",
    "classify_verification",
]


class _Missing:
    __slots__ = ()

    def __repr__(self) -> str:
        return "<missing>"

    def __reduce__(self) -> str:
        return "MISSING"


#: Longest provider reference or request id a VerificationResult may carry.
MAX_IDENTIFIER_LENGTH: Final = 1000

#: Marks a VerificationResult that carries no recovered value.
MISSING: Final = _Missing()


def _details_error(message: str, path: str) -> Exception:
    return InvalidArgumentError(f"verification details are not JSON-compatible: {message}")


def check_stored_text(name: str, value: object, *, limit: int, optional: bool = False) -> None:
    """Refuse (InvalidArgumentError) a string field every ledger could not store as given.

    Non-empty ``str`` of at most ``limit`` characters, with no NUL (PostgreSQL
    text cannot hold one) and no lone surrogate (no encoder can write one).
    """
    if value is None and optional:
        return
    if type(value) is not str:
        raise InvalidArgumentError(f"{name} must be a str, not {type(value).__qualname__}")
    if not value:
        raise InvalidArgumentError(f"{name} must not be empty")
    if len(value) > limit:
        raise InvalidArgumentError(f"{name} is longer than {limit} characters")
    why = unstorable(value)
    if why is not None:
        raise InvalidArgumentError(f"{name} {why}")


def unstorable(value: str) -> str | None:
    """Why no ledger could store ``value`` as given, or None if every ledger can.

    PostgreSQL's text holds no NUL, and no UTF-8 encoder writes a lone
    surrogate (bytes decoded with ``surrogateescape`` carry them).
    """
    if "\x00" in value:
        return "must not contain NUL characters"
    if value.isascii():
        return None
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return "is not valid Unicode (lone surrogate)"
    return None


def _check_reference(name: str, value: object, *, optional: bool) -> None:
    # Identifiers are stored in receipts; an unbounded one is a provider response.
    check_stored_text(name, value, limit=MAX_IDENTIFIER_LENGTH, optional=optional)


@dataclasses.dataclass(frozen=True, slots=True)
class VerificationResult:
    """What a read-only verifier observed. Build it with the class methods.

    ``outcome`` is what the verifier claims; the runner accepts a claim only
    when it is healthy and bound to the receipt's ``provider_reference``
    (echoed as ``verified_provider_reference``), and an absence only when it
    is also conclusive and ``retry_safe``. ``value`` is never persisted.
    """

    outcome: ActionStatus
    health: VerificationHealth = VerificationHealth.HEALTHY
    conclusive_absence: bool = False
    retry_safe: bool = False
    verified_provider_reference: str | None = None
    provider_request_id: str | None = None
    details: Mapping[str, Any] | None = None
    reason: str | None = None
    value: object = MISSING

    def __post_init__(self) -> None:
        if type(self.outcome) is not ActionStatus:
            raise InvalidArgumentError("outcome must be an ActionStatus")
        if type(self.health) is not VerificationHealth:
            raise InvalidArgumentError("health must be a VerificationHealth")
        for name in ("conclusive_absence", "retry_safe"):
            if type(getattr(self, name)) is not bool:
                raise InvalidArgumentError(f"{name} must be a bool")
        _check_reference(
            "verified_provider_reference", self.verified_provider_reference, optional=True
        )
        _check_reference("provider_request_id", self.provider_request_id, optional=True)
        if self.reason is not None and type(self.reason) is not str:
            raise InvalidArgumentError("reason must be a str")
        if self.details is not None:
            validate_json_object(self.details, root="details", error=_details_error)
            object.__setattr__(self, "details", freeze(self.details))

    @property
    def has_value(self) -> bool:
        """Whether the verifier recovered a value (it may still be withheld)."""
        return self.value is not MISSING

    @classmethod
    def confirmed(
        cls,
        *,
        verified_provider_reference: str,
        provider_request_id: str | None = None,
        value: object = MISSING,
        details: dict[str, Any] | None = None,
    ) -> VerificationResult:
        """Positive evidence that the effect bound to this reference happened."""
        _check_reference("verified_provider_reference", verified_provider_reference, optional=False)
        return cls(
            outcome=ActionStatus.CONFIRMED,
            verified_provider_reference=verified_provider_reference,
            provider_request_id=provider_request_id,
            value=value,
            details=details,
        )

    @classmethod
    def absent(
        cls,
        *,
        verified_provider_reference: str,
        retry_safe: bool = False,
        health: VerificationHealth = VerificationHealth.HEALTHY,
        conclusive_absence: bool = True,
        details: dict[str, Any] | None = None,
    ) -> VerificationResult:
        """The read found no effect. Proves FAILED only with ``retry_safe=True``.

        Set ``retry_safe=True`` only when the original request is known to be
        terminal or fenced, so it cannot commit later; an empty read alone is
        not enough.
        """
        _check_reference("verified_provider_reference", verified_provider_reference, optional=False)
        return cls(
            outcome=ActionStatus.FAILED,
            health=health,
            conclusive_absence=conclusive_absence,
            retry_safe=retry_safe,
            verified_provider_reference=verified_provider_reference,
            details=details,
        )

    @classmethod
    def unknown(
        cls,
        *,
        reason: str,
        verified_provider_reference: str | None = None,
        health: VerificationHealth = VerificationHealth.UNAVAILABLE,
        details: dict[str, Any] | None = None,
    ) -> VerificationResult:
        """The verifier could not establish anything trustworthy."""
        if type(reason) is not str:
            raise InvalidArgumentError("reason must be a str")
        return cls(
            outcome=ActionStatus.UNKNOWN,
            health=health,
            verified_provider_reference=verified_provider_reference,
            reason=reason,
            details=details,
        )


@runtime_checkable
class Verifier(Protocol):
    """A read-only observer of the provider, bound by the receipt's provider_reference.

    ``verify`` may be sync or async. Plain callables taking the receipt are
    accepted wherever a Verifier is. A verifier must never mutate.
    """

    def verify(self, receipt: ActionReceipt) -> VerificationResult | Awaitable[VerificationResult]:
        """Observe the effect bound to ``receipt.provider_reference``."""
        ...


#: What the runner accepts as a verifier.
AnyVerifier: TypeAlias = (
    Verifier | Callable[["ActionReceipt"], VerificationResult | Awaitable[VerificationResult]]
)


def classify_verification(result: object, provider_reference: str | None) -> ActionStatus:
    """The status a verifier's result proves for a receipt with ``provider_reference``.

    Only an exact VerificationResult is judged at all; its fields are judged
    by :func:`classify_fields`. Everything else is UNKNOWN.

    post: __return__ == ActionStatus.UNKNOWN or provider_reference is not None
    """
    if type(result) is not VerificationResult:
        return ActionStatus.UNKNOWN
    return classify_fields(
        result.outcome,
        result.health,
        result.conclusive_absence,
        result.retry_safe,
        result.verified_provider_reference,
        provider_reference,
    )


def classify_fields(
    outcome: ActionStatus,
    health: VerificationHealth,
    conclusive_absence: bool,
    retry_safe: bool,
    verified_provider_reference: str | None,
    provider_reference: str | None,
) -> ActionStatus:
    """The specification's rule for what a verifier's claim is worth.

    CONFIRMED needs a healthy claim of CONFIRMED echoing the receipt's
    reference; FAILED needs the same binding and health plus conclusive,
    retry-safe absence. Everything else is UNKNOWN.

    post: __return__ != ActionStatus.CONFIRMED or (outcome == ActionStatus.CONFIRMED and health == VerificationHealth.HEALTHY and provider_reference is not None and verified_provider_reference == provider_reference)
    post: __return__ != ActionStatus.FAILED or (outcome == ActionStatus.FAILED and health == VerificationHealth.HEALTHY and conclusive_absence and retry_safe and provider_reference is not None and verified_provider_reference == provider_reference)
    """
    if provider_reference is None or type(verified_provider_reference) is not str:
        return ActionStatus.UNKNOWN
    if verified_provider_reference != provider_reference:
        return ActionStatus.UNKNOWN
    if health is not VerificationHealth.HEALTHY:
        return ActionStatus.UNKNOWN
    if outcome is ActionStatus.CONFIRMED:
        return ActionStatus.CONFIRMED
    if outcome is ActionStatus.FAILED and conclusive_absence is True and retry_safe is True:
        return ActionStatus.FAILED
    return ActionStatus.UNKNOWN
