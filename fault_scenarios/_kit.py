"""Shared plumbing for the fault scenarios: world state, fences, check helpers.

Each scenario has its own fake provider; this module only holds what every
fake needs: a record of committed effects, requests that are still in
flight, and a fence a verifier uses before it may call an absence final.
"""

from __future__ import annotations

import asyncio
import dataclasses
import enum
import itertools
import time
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any

from dataoad import (
    ActionResult,
    ActionRunner,
    ClaimFencedError,
    DefinitiveFailure,
    IdempotencyConflictError,
    Ledger,
    VerificationResult,
    current_attempt,
)
from dataoad.testing import CheckFn, LedgerFactory, SafetyReport, default_ledgers, run_checks

#: Builds the runner a check uses (the ledger, then ActionRunner's options);
#: tests swap in deliberately broken runners.
RunnerFactory = Callable[..., ActionRunner]

#: The lease of the zombie checks: short, so a check waits little for it to run out.
ZOMBIE_LEASE = 0.2


class Fault(enum.Enum):
    """Where a provider call goes wrong, relative to its commit."""

    NONE = "none"
    REFUSED_BEFORE_SEND = "refused before send"  # nothing happened, but the client cannot know
    TIMEOUT_AFTER_COMMIT = "timeout after commit"
    RESET_AFTER_COMMIT = "connection reset after commit"
    TIMEOUT_IN_FLIGHT = "timeout while in flight"  # may commit later unless fenced


@dataclasses.dataclass
class ProviderState:
    """Committed effects and in-flight requests per reference, with fences."""

    effects: dict[str, list[dict[str, Any]]] = dataclasses.field(default_factory=dict)
    in_flight: dict[str, list[dict[str, Any]]] = dataclasses.field(default_factory=dict)
    calls: int = 0
    ids: itertools.count[int] = dataclasses.field(default_factory=lambda: itertools.count(1))
    #: reference -> the highest fencing token seen; requests with older ones are refused.
    fences: dict[str, int] = dataclasses.field(default_factory=dict)
    fenced_refusals: int = 0

    def check_fence(self, reference: str, fencing_token: int | None) -> None:
        """Refuse a request whose fencing token is older than one already seen (a zombie's)."""
        if fencing_token is None:
            return
        if fencing_token < self.fences.get(reference, 0):
            self.fenced_refusals += 1
            raise DefinitiveFailure(
                f"refused: fencing token {fencing_token} is older than {self.fences[reference]}"
            )
        self.fences[reference] = fencing_token

    def new_id(self, prefix: str) -> str:
        return f"{prefix}_{next(self.ids)}"

    def apply(self, reference: str, record: dict[str, Any], fault: Fault) -> dict[str, Any]:
        """Commit (or stage) ``record`` under ``fault``; raise what the client would see."""
        self.calls += 1
        if fault is Fault.REFUSED_BEFORE_SEND:
            raise ConnectionRefusedError("could not connect")
        if fault is Fault.TIMEOUT_IN_FLIGHT:
            self.in_flight.setdefault(reference, []).append(record)
            raise TimeoutError("timed out; the request may still be processed")
        self.effects.setdefault(reference, []).append(record)
        if fault is Fault.TIMEOUT_AFTER_COMMIT:
            raise TimeoutError("timed out after the provider committed")
        if fault is Fault.RESET_AFTER_COMMIT:
            raise ConnectionResetError("connection reset after the provider committed")
        return record

    def fence(self, reference: str, fencing_token: int | None = None) -> int:
        """Make every pending request for the reference terminal: it can never commit.

        With ``fencing_token``, also refuse later requests with an older token.
        """
        if fencing_token is not None:
            self.fences[reference] = max(self.fences.get(reference, 0), fencing_token)
        return len(self.in_flight.pop(reference, []))

    def pending(self, reference: str) -> bool:
        """Whether a request for the reference is still in flight."""
        return bool(self.in_flight.get(reference))

    def settle_in_flight(self) -> None:
        """A slow provider finally commits what was in flight."""
        for reference, records in self.in_flight.items():
            self.effects.setdefault(reference, []).extend(records)
        self.in_flight.clear()

    def count(self, reference: str) -> int:
        return len(self.effects.get(reference, ()))


class FaultScript:
    """The faults of successive provider calls, in order; then no more faults."""

    def __init__(self, faults: tuple[Fault, ...]) -> None:
        self._faults = list(faults)

    def next(self) -> Fault:
        return self._faults.pop(0) if self._faults else Fault.NONE


async def raises_conflict(call: Awaitable[Any]) -> bool:
    """Whether the call was refused as an idempotency conflict."""
    try:
        await call
    except IdempotencyConflictError:
        return True
    return False


async def run_scenario(
    action: str,
    checks: list[tuple[str, CheckFn]],
    ledger_factory: LedgerFactory | None,
) -> SafetyReport:
    """Run a scenario's checks, each on a fresh ledger (SQLite in a temporary file by default)."""
    return await run_checks(action, checks, ledger_factory=ledger_factory or default_ledgers())


def read_back(
    state: ProviderState,
    reference: str,
    *,
    fence: bool,
    request_id: Callable[[dict[str, Any]], str],
    fencing_token: int | None = None,
) -> VerificationResult:
    """The verdict of a careful read: confirmed, or absent (retry-safe only when nothing can land)."""
    if fence:
        state.fence(reference, fencing_token)
    records = state.effects.get(reference, [])
    if records:
        return VerificationResult.confirmed(
            verified_provider_reference=reference, provider_request_id=request_id(records[0])
        )
    return VerificationResult.absent(
        verified_provider_reference=reference, retry_safe=not state.pending(reference)
    )


class PausedHeartbeat:
    """The clock of a worker whose process is paused (a GC pause, SIGSTOP): it never renews."""

    def monotonic(self) -> float:
        return time.monotonic()

    async def sleep(self, seconds: float) -> None:
        await asyncio.Event().wait()


def fencing_token() -> int | None:
    """The running attempt's fencing token, as an operation passes it to its provider."""
    attempt = current_attempt()
    return None if attempt is None else attempt.fencing_token


Execute = Callable[
    [ActionRunner, Callable[[], Awaitable[None]]], Coroutine[Any, Any, ActionResult[Any]]
]


async def zombie_and_taker(
    ledger: Ledger, new_runner: RunnerFactory, execute: Execute
) -> tuple[ActionResult[Any], BaseException | None]:
    """A worker pauses before sending, past its lease; another takes over; the first resumes.

    ``execute(runner, before_send)`` runs the action, awaiting ``before_send()``
    just before the provider call. Returns the taker's result and the
    zombie's error (a ClaimFencedError when the runner fenced it).
    """
    paused, resume = asyncio.Event(), asyncio.Event()

    async def before_send() -> None:
        if fencing_token() == 1:  # only the first owner pauses
            paused.set()
            await resume.wait()

    zombie = asyncio.create_task(
        execute(new_runner(ledger, lease=ZOMBIE_LEASE, clock=PausedHeartbeat()), before_send)
    )
    await paused.wait()
    await asyncio.sleep(ZOMBIE_LEASE * 1.5)  # its lease runs out on the ledger's clock
    taken = await execute(new_runner(ledger, lease=ZOMBIE_LEASE), before_send)
    resume.set()
    try:
        await zombie
    except ClaimFencedError as exc:
        return taken, exc
    return taken, None


def broken_runner_factories() -> dict[str, RunnerFactory]:
    """Runners with one safety rule removed, for tests that prove checks can fail."""
    import warnings

    from dataoad import RetryPolicy

    class RetriesUnknown(ActionRunner):
        """Retries ambiguous outcomes as if they were failures."""

        async def execute(self, *args: Any, **kwargs: Any) -> Any:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", RuntimeWarning)
                kwargs["policy"] = RetryPolicy(
                    max_attempts=3, retry_on_failed=True, retry_on_unknown=True
                )
                return await super().execute(*args, **kwargs)

    return {"retries-unknown": RetriesUnknown}
