"""A deterministic fake payment provider with faults on both sides of the commit."""

from __future__ import annotations

import dataclasses
import enum
import itertools
from collections.abc import Iterable

from dataoad._failure import DefinitiveFailure
from dataoad._receipt import ActionReceipt
from dataoad._status import VerificationHealth
from dataoad._verification import VerificationResult

__all__ = [
    "Charge",
    "ChargeFault",
    "FakePaymentProvider",
    "LookupFault",
    "PaymentLookup",
    "PaymentVerifier",
]


class ChargeFault(enum.Enum):
    """A fault injected into one ``charge`` call, in the order given."""

    #: Time out before the provider commits anything; the request is dead.
    TIMEOUT_BEFORE_COMMIT = "timeout_before_commit"
    #: Commit the charge, then time out: the response is lost.
    TIMEOUT_AFTER_COMMIT = "timeout_after_commit"
    #: Refuse the card: a definitive, non-retryable failure before any effect.
    DECLINED = "declined"
    #: Refuse before processing, with explicit permission to try again.
    TRANSIENT_REJECT = "transient_reject"
    #: Commit the charge, then drop the connection.
    CONNECTION_RESET_AFTER_COMMIT = "connection_reset_after_commit"
    #: Commit the charge, then answer with a response that cannot be parsed.
    MALFORMED_RESPONSE_AFTER_COMMIT = "malformed_response_after_commit"
    #: Time out while the request is still in flight; it may commit later
    #: (``commit_in_flight``) unless it is fenced first (``fence``).
    TIMEOUT_IN_FLIGHT = "timeout_in_flight"
    #: Commit and answer normally, then reverse the charge before anyone
    #: reads it (a fraud check, say): the answer was true when sent and is
    #: no proof now.
    ACCEPTED_THEN_REVERSED = "accepted_then_reversed"
    #: Answer "accepted for processing" normally, then decline
    #: asynchronously: nothing is ever charged.
    DECLINED_LATER = "declined_later"
    #: Answer normally with another request's charge (a mixed-up response)
    #: and charge nothing for this one.
    ANSWERS_FOR_ANOTHER_REQUEST = "answers_for_another_request"


class LookupFault(enum.Enum):
    """A fault injected into one ``lookup`` call, in the order given."""

    #: The read path is down: lookup raises ConnectionError.
    UNAVAILABLE = "unavailable"
    #: The read answers from a stale replica: empty, and marked stale.
    STALE_EMPTY = "stale_empty"
    #: The read answers about a different reference than the one asked for.
    WRONG_REFERENCE = "wrong_reference"


@dataclasses.dataclass(frozen=True, slots=True)
class Charge:
    """A committed charge, as the provider's system of record holds it."""

    charge_id: str
    customer_id: str
    amount_cents: int
    client_reference: str


@dataclasses.dataclass(frozen=True, slots=True)
class PaymentLookup:
    """The answer of a provider lookup by client reference."""

    reference: str
    charges: tuple[Charge, ...]
    stale: bool = False


class FakePaymentProvider:
    """An in-process payment provider whose faults are scripted per call.

    ``charge_faults`` and ``lookup_faults`` are consumed one per call, in
    order; calls beyond them behave normally. ``charge_calls`` counts every
    charge request, ``charges`` holds the committed ones that still stand,
    ``reversed`` those committed and then reversed.
    """

    def __init__(
        self,
        charge_faults: Iterable[ChargeFault] = (),
        lookup_faults: Iterable[LookupFault] = (),
    ) -> None:
        self._charge_faults = list(charge_faults)
        self._lookup_faults = list(lookup_faults)
        for fault in self._charge_faults:
            if type(fault) is not ChargeFault:
                raise TypeError(f"charge_faults must hold ChargeFault values, not {fault!r}")
        for lookup_fault in self._lookup_faults:
            if type(lookup_fault) is not LookupFault:
                raise TypeError(f"lookup_faults must hold LookupFault values, not {lookup_fault!r}")
        self.charge_calls = 0
        self.lookup_calls = 0
        self.charges: list[Charge] = []
        self.reversed: list[Charge] = []
        self._in_flight: list[Charge] = []
        #: id(charge) of an in-flight request -> the fencing token it carried.
        self._in_flight_tokens: dict[int, int] = {}
        #: client_reference -> the highest fencing token seen: older ones are refused.
        self._fences: dict[str, int] = {}
        #: Requests refused because their fencing token was older than one already seen.
        self.fenced_refusals = 0
        self._ids = itertools.count(1)

    def add_charge_fault(self, fault: ChargeFault) -> None:
        """Queue ``fault`` for a later ``charge`` call, after those already queued."""
        if type(fault) is not ChargeFault:
            raise TypeError(f"expected a ChargeFault, not {fault!r}")
        self._charge_faults.append(fault)

    def add_lookup_fault(self, fault: LookupFault) -> None:
        """Queue ``fault`` for a later ``lookup`` call, after those already queued."""
        if type(fault) is not LookupFault:
            raise TypeError(f"expected a LookupFault, not {fault!r}")
        self._lookup_faults.append(fault)

    def _next_charge(self, customer_id: str, amount_cents: int, client_reference: str) -> Charge:
        return Charge(f"ch_{next(self._ids)}", customer_id, amount_cents, client_reference)

    async def charge(
        self,
        *,
        customer_id: str,
        amount_cents: int,
        client_reference: str,
        fencing_token: int | None = None,
    ) -> Charge:
        """Charge a customer; faults may hide whether the charge committed.

        With ``fencing_token`` (pass ``dataoad.current_attempt().fencing_token``)
        the provider refuses, committing nothing, a request whose token is
        older than one it has already seen for the reference: a zombie's.
        """
        self.charge_calls += 1
        if fencing_token is not None:
            if fencing_token < self._fences.get(client_reference, 0):
                self.fenced_refusals += 1
                raise DefinitiveFailure(
                    f"refused: fencing token {fencing_token} is older than "
                    f"{self._fences[client_reference]} for {client_reference}",
                    retryable=False,
                )
            self.fence_below(client_reference, fencing_token)
        fault = self._charge_faults.pop(0) if self._charge_faults else None
        if fault is ChargeFault.TIMEOUT_BEFORE_COMMIT:
            raise TimeoutError("payment provider timed out before committing")
        if fault is ChargeFault.DECLINED:
            raise DefinitiveFailure("card declined", retryable=False)
        if fault is ChargeFault.TRANSIENT_REJECT:
            raise DefinitiveFailure("rejected before processing; try again", retryable=True)
        charge = self._next_charge(customer_id, amount_cents, client_reference)
        if fault is ChargeFault.DECLINED_LATER:
            return charge  # "accepted"; the decline comes later, and nothing lands
        if fault is ChargeFault.ANSWERS_FOR_ANOTHER_REQUEST:
            other = f"{client_reference}-other"
            return dataclasses.replace(charge, client_reference=other)
        if fault is ChargeFault.ACCEPTED_THEN_REVERSED:
            self.reversed.append(charge)
            return charge
        if fault is ChargeFault.TIMEOUT_IN_FLIGHT:
            self._in_flight.append(charge)
            if fencing_token is not None:
                self._in_flight_tokens[id(charge)] = fencing_token
            raise TimeoutError("payment provider timed out; the request is still in flight")
        self.charges.append(charge)
        if fault is ChargeFault.TIMEOUT_AFTER_COMMIT:
            raise TimeoutError("payment provider timed out after committing")
        if fault is ChargeFault.CONNECTION_RESET_AFTER_COMMIT:
            raise ConnectionResetError("connection reset after the charge committed")
        if fault is ChargeFault.MALFORMED_RESPONSE_AFTER_COMMIT:
            raise ValueError("malformed provider response: expected JSON object")
        return charge

    def fence_below(self, client_reference: str, fencing_token: int) -> int:
        """Refuse, from now on, requests for the reference with an older fencing token.

        In-flight requests that carried an older token are dropped (they can
        no longer commit); returns how many.
        """
        self._fences[client_reference] = max(self._fences.get(client_reference, 0), fencing_token)
        floor = self._fences[client_reference]
        dropped = [
            c
            for c in self._in_flight
            if c.client_reference == client_reference
            and self._in_flight_tokens.get(id(c), floor) < floor
        ]
        for c in dropped:
            self._in_flight.remove(c)
            self._in_flight_tokens.pop(id(c), None)
        return len(dropped)

    def in_flight(self, client_reference: str) -> bool:
        """Whether a request for this reference could still commit (the fence check)."""
        return any(c.client_reference == client_reference for c in self._in_flight)

    def commit_in_flight(self) -> int:
        """Commit every in-flight request, as a slow provider eventually would."""
        committed = len(self._in_flight)
        self.charges.extend(self._in_flight)
        self._in_flight.clear()
        self._in_flight_tokens.clear()
        return committed

    def fence(self, client_reference: str) -> int:
        """Make in-flight requests for this reference terminal: they never commit."""
        before = len(self._in_flight)
        self._in_flight = [c for c in self._in_flight if c.client_reference != client_reference]
        self._in_flight_tokens = {
            key: token
            for key, token in self._in_flight_tokens.items()
            if any(id(c) == key for c in self._in_flight)
        }
        return before - len(self._in_flight)

    def charges_for(self, client_reference: str) -> list[Charge]:
        """The committed charges for one reference (ground truth, not a lookup)."""
        return [c for c in self.charges if c.client_reference == client_reference]

    async def lookup(self, client_reference: str) -> PaymentLookup:
        """Read committed charges by client reference; faults may spoil the read."""
        self.lookup_calls += 1
        fault = self._lookup_faults.pop(0) if self._lookup_faults else None
        if fault is LookupFault.UNAVAILABLE:
            raise ConnectionError("payment lookup unavailable")
        if fault is LookupFault.STALE_EMPTY:
            return PaymentLookup(client_reference, (), stale=True)
        if fault is LookupFault.WRONG_REFERENCE:
            other = f"{client_reference}-other"
            return PaymentLookup(other, tuple(self.charges_for(other)))
        return PaymentLookup(client_reference, tuple(self.charges_for(client_reference)))


class PaymentVerifier:
    """The bundled read-only verifier for FakePaymentProvider.

    It echoes the reference the provider actually answered for, reports a
    stale read as DEGRADED, and claims ``retry_safe=True`` only after the
    in-flight fence shows no request for the reference can still commit. It
    first fences the reference at the receipt's fencing token, so the
    requests of a worker whose claim was taken over are refused.
    """

    def __init__(self, provider: FakePaymentProvider) -> None:
        self.provider = provider

    async def verify(self, receipt: ActionReceipt) -> VerificationResult:
        """Look the charge up by the receipt's provider reference."""
        reference = receipt.provider_reference
        if reference is None:
            return VerificationResult.unknown(reason="the receipt has no provider_reference")
        # Raise the provider's fence to this claim's token first: a taken-over
        # worker's late request can then no longer commit, so absence can be final.
        self.provider.fence_below(reference, receipt.fencing_token)
        try:
            lookup = await self.provider.lookup(reference)
        except Exception as exc:
            return VerificationResult.unknown(reason=f"lookup failed: {exc}")
        if lookup.stale:
            return VerificationResult.unknown(
                reason="stale read",
                health=VerificationHealth.DEGRADED,
                verified_provider_reference=lookup.reference,
            )
        if lookup.charges:
            first = lookup.charges[0]
            return VerificationResult.confirmed(
                verified_provider_reference=lookup.reference,
                provider_request_id=first.charge_id,
                value=first,
                details={"charges": len(lookup.charges)},
            )
        return VerificationResult.absent(
            verified_provider_reference=lookup.reference,
            retry_safe=not self.provider.in_flight(reference),
        )
