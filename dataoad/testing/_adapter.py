"""The adapter interface that ``dataoad check`` tests.

An adapter is the user's code between Dataoad and a provider: the operation
that performs the mutation, and the read-only verifier that looks it up.
The checker also needs a sandbox it can reset, read the truth from (the
oracle), and stage faults in. Subclass :class:`ProviderAdapter`; every
method's docstring says, in one sentence, what the checker assumes of it.
"""

from __future__ import annotations

import enum
from typing import Any

from dataoad._receipt import ActionReceipt
from dataoad._verification import VerificationResult

__all__ = ["ProviderAdapter", "ReadFault", "SandboxFault"]


class SandboxFault(enum.Enum):
    """A fault the sandbox stages in its next mutation call (inside ``perform``)."""

    #: The provider times out before anything commits.
    TIMEOUT_BEFORE_COMMIT = "times out before committing"
    #: The provider commits, then the response is lost (a timeout).
    TIMEOUT_AFTER_COMMIT = "commits, then times out"
    #: The provider commits, then the connection drops.
    RESET_AFTER_COMMIT = "commits, then resets the connection"
    #: The provider refuses definitively, before any effect.
    DECLINE = "declines before any effect"
    #: The request times out while still in flight: it commits when
    #: ``land_in_flight`` is called, unless the provider has fenced it.
    IN_FLIGHT = "times out while the request is still in flight"
    # The three below answer normally, yet nothing stands: a normal return is
    # no proof when a verifier is configured, and the verifier must read the
    # provider, not the response.
    #: The provider commits and answers, then reverses the effect before any read.
    ACCEPTED_THEN_REVERSED = "answers, then reverses the effect"
    #: The provider answers "accepted", then declines asynchronously; nothing lands.
    DECLINED_LATER = "answers accepted, then declines asynchronously"
    #: The provider answers with another request's response and applies nothing.
    ANSWERS_FOR_ANOTHER_REQUEST = "answers for another request, applies nothing"


class ReadFault(enum.Enum):
    """A fault the sandbox stages in its next read (inside ``verify``)."""

    #: The read path is down.
    UNAVAILABLE = "read path down"
    #: The read answers from a lagging replica that has not seen recent writes.
    STALE = "stale replica"


class ProviderAdapter:
    """Subclass and implement the methods; ``dataoad check`` does the rest.

    The checker builds one instance per run and calls ``reset()`` before
    every example, so an instance may keep its sandbox in attributes.
    Fault-staging methods are optional: leave one unimplemented and the
    checker skips that fault and says so. ``stage_sandbox_fault`` may also
    raise ``NotImplementedError`` (or ``KeyError``, from a mapping) for one
    fault its sandbox cannot stage: that fault alone is skipped.
    """

    #: The action name the checker executes under.
    action_name: str = "adapter_action"

    def reset(self) -> None:
        """Start from an empty sandbox: no effects, nothing in flight, no staged fault."""
        raise NotImplementedError

    async def perform(self, request: dict[str, Any], reference: str) -> Any:
        """Perform the mutation for ``request``, identified to the provider by ``reference``.

        Raise ``DefinitiveFailure`` only when the provider has definitively not
        applied it; let every other error propagate.
        """
        raise NotImplementedError

    async def verify(self, receipt: ActionReceipt) -> VerificationResult:
        """Look the mutation up read-only by ``receipt.provider_reference``, naming the reference the provider answered for."""
        raise NotImplementedError

    def effects(self, reference: str) -> int:
        """The oracle: how many effects the sandbox holds for ``reference``, read directly."""
        raise NotImplementedError

    def in_flight(self, reference: str) -> bool:
        """The oracle: whether a request for ``reference`` could still commit later."""
        raise NotImplementedError

    def stage_sandbox_fault(self, fault: SandboxFault) -> None:
        """Make the sandbox's next mutation call suffer ``fault`` (optional)."""
        raise NotImplementedError

    def land_in_flight(self) -> None:
        """Commit every in-flight request the provider has not fenced (optional)."""
        raise NotImplementedError

    def stage_read_fault(self, fault: ReadFault) -> None:
        """Make the sandbox's next read suffer ``fault`` (optional)."""
        raise NotImplementedError

    def request_for(self, key: str) -> dict[str, Any]:
        """A valid request for the idempotency key ``key`` (override if yours differ)."""
        return {"key": key, "amount_cents": 100}
