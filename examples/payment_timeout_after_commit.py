"""A payment whose response is lost after the charge committed.

Run it with ``dataoad test examples/payment_timeout_after_commit.py`` (or
``python examples/payment_timeout_after_commit.py``). It prints what a naive
retry loop does next to what Dataoad does, then runs twelve deterministic
safety checks against the real ActionRunner and ledger.

Every check builds a fresh fake provider and ledger, drives the real runner,
and compares the outcome, the number of provider calls and the number of
committed charges with what the specification requires.
"""

from __future__ import annotations

import asyncio
import contextvars
import warnings
from collections.abc import Callable
from typing import Any

from dataoad import (
    ActionInProgressError,
    ActionRunner,
    ActionStatus,
    IdempotencyConflictError,
    Ledger,
    RetryPolicy,
    VerificationHealth,
    VerificationResult,
)
from dataoad.testing import (
    ChargeFault,
    FakePaymentProvider,
    LedgerFactory,
    LookupFault,
    PaymentVerifier,
    SafetyCheck,
    SafetyReport,
    expect,
    run_checks,
)
from dataoad.testing import default_ledgers as _default_ledgers

ACTION = "charge_customer"
CUSTOMER = "customer_123"
AMOUNT = 2_500
ORDER = "order-123"
REQUEST = {"customer_id": CUSTOMER, "amount_cents": AMOUNT}
#: Retries of FAILED are allowed here, so the checks show they stay evidence-bound.
RETRY_FAILED = RetryPolicy(max_attempts=2, retry_on_failed=True)

#: The runner the checks use; tests swap in deliberately broken runners.
_runner_factory: contextvars.ContextVar[Callable[[Ledger], ActionRunner]] = contextvars.ContextVar(
    "runner_factory", default=ActionRunner
)


def new_runner(ledger: Ledger) -> ActionRunner:
    return _runner_factory.get()(ledger)


def charge_op(provider: FakePaymentProvider, amount: int = AMOUNT) -> Any:
    """The mutation: one charge, bound to the order as the client reference."""
    return lambda: provider.charge(
        customer_id=CUSTOMER, amount_cents=amount, client_reference=ORDER
    )


async def charge(
    runner: ActionRunner,
    provider: FakePaymentProvider,
    *,
    verifier: Any = None,
    policy: RetryPolicy | None = None,
    amount: int = AMOUNT,
) -> Any:
    return await runner.execute(
        ACTION,
        charge_op(provider, amount),
        request={"customer_id": CUSTOMER, "amount_cents": amount},
        idempotency_key=ORDER,
        provider_reference=ORDER,
        verifier=verifier,
        risk="financial",
        policy=policy,
    )


def counts(provider: FakePaymentProvider) -> dict[str, int]:
    return {"calls": provider.charge_calls, "charges": len(provider.charges)}


class StaleReadTrustingVerifier:
    """A careless verifier: it reports a stale empty read as retry-safe absence.

    The runner must not believe it, because the read was not healthy.
    """

    def __init__(self, provider: FakePaymentProvider) -> None:
        self.provider = provider

    async def verify(self, receipt: Any) -> VerificationResult:
        lookup = await self.provider.lookup(receipt.provider_reference)
        if lookup.charges:
            return VerificationResult.confirmed(verified_provider_reference=lookup.reference)
        return VerificationResult.absent(
            verified_provider_reference=lookup.reference,
            retry_safe=True,
            health=VerificationHealth.DEGRADED if lookup.stale else VerificationHealth.HEALTHY,
        )


class BlindAbsenceVerifier:
    """A careless verifier: any empty read is called fenced absence, whatever it read.

    With the provider answering about the wrong reference, only the runner's
    binding check stands between this verifier and a duplicate charge.
    """

    def __init__(self, provider: FakePaymentProvider) -> None:
        self.provider = provider

    async def verify(self, receipt: Any) -> VerificationResult:
        lookup = await self.provider.lookup(receipt.provider_reference)
        if lookup.charges:
            return VerificationResult.confirmed(verified_provider_reference=lookup.reference)
        return VerificationResult.absent(
            verified_provider_reference=lookup.reference, retry_safe=True
        )


# -- the twelve checks ------------------------------------------------------------


async def normal_success(ledger: Ledger) -> SafetyCheck:
    provider = FakePaymentProvider()
    result = await charge(new_runner(ledger), provider, verifier=PaymentVerifier(provider))
    return expect(
        "Normal success",
        {"status": "CONFIRMED", "calls": 1, "charges": 1},
        {"status": result.status.value, **counts(provider)},
    )


async def explicit_pre_side_effect_failure(ledger: Ledger) -> SafetyCheck:
    provider = FakePaymentProvider(charge_faults=[ChargeFault.DECLINED])
    result = await charge(new_runner(ledger), provider, policy=RETRY_FAILED)
    return expect(
        "Explicit pre-side-effect failure",
        {"status": "FAILED", "calls": 1, "charges": 0},
        {"status": result.status.value, **counts(provider)},
    )


async def replay_safety(ledger: Ledger) -> SafetyCheck:
    provider = FakePaymentProvider()
    runner = new_runner(ledger)
    first = await charge(runner, provider)
    again = await charge(runner, provider)
    return expect(
        "Replay safety",
        {"status": "CONFIRMED", "replayed": True, "same_receipt": True, "calls": 1, "charges": 1},
        {
            "status": again.status.value,
            "replayed": again.replayed,
            "same_receipt": again.receipt.action_id == first.receipt.action_id,
            **counts(provider),
        },
    )


async def concurrent_duplicate_safety(ledger: Ledger) -> SafetyCheck:
    provider = FakePaymentProvider()
    runner = new_runner(ledger)
    release = asyncio.Event()
    invocations = 0

    async def slow_charge() -> Any:
        nonlocal invocations
        invocations += 1
        if invocations > 1:
            release.set()  # a second invocation is already the failure: let it show
        # Hold the first claim in flight until every other contender has
        # answered: an event, never a head start in wall-clock time, so the
        # verdict is the same on an idle machine and a loaded one.
        await release.wait()
        return await charge_op(provider)()

    async def contender() -> str:
        try:
            result = await runner.execute(
                ACTION,
                slow_charge,
                request=REQUEST,
                idempotency_key=ORDER,
                provider_reference=ORDER,
            )
        except ActionInProgressError:
            return "in progress"
        return "replayed" if result.replayed else result.status.value

    tasks = [asyncio.create_task(contender()) for _ in range(8)]
    waiting = set(tasks)
    while len(waiting) > 1 and invocations <= 1:
        _, waiting = await asyncio.wait(waiting, return_when=asyncio.FIRST_COMPLETED)
    release.set()
    outcomes = sorted(await asyncio.gather(*tasks))
    return expect(
        "Concurrent duplicate safety",
        {"winners": 1, "refused": 7, "replayed": 0, "calls": 1, "charges": 1},
        {
            "winners": outcomes.count("CONFIRMED"),
            "refused": outcomes.count("in progress"),
            "replayed": outcomes.count("replayed"),
            **counts(provider),
        },
    )


async def same_key_body_conflict(ledger: Ledger) -> SafetyCheck:
    provider = FakePaymentProvider()
    runner = new_runner(ledger)
    await charge(runner, provider)
    try:
        await charge(runner, provider, amount=99_900)
        conflict = False
    except IdempotencyConflictError:
        conflict = True
    return expect(
        "Same-key/body conflict",
        {"conflict_raised": True, "calls": 1, "charges": 1},
        {"conflict_raised": conflict, **counts(provider)},
    )


async def timeout_before_commit_recovery(ledger: Ledger) -> SafetyCheck:
    provider = FakePaymentProvider(charge_faults=[ChargeFault.TIMEOUT_BEFORE_COMMIT])
    result = await charge(
        new_runner(ledger), provider, verifier=PaymentVerifier(provider), policy=RETRY_FAILED
    )
    return expect(
        "Timeout-before-commit recovery",
        {"status": "CONFIRMED", "attempts": 2, "calls": 2, "charges": 1},
        {"status": result.status.value, "attempts": result.receipt.attempts, **counts(provider)},
    )


async def timeout_after_commit_recovery(ledger: Ledger) -> SafetyCheck:
    provider = FakePaymentProvider(charge_faults=[ChargeFault.TIMEOUT_AFTER_COMMIT])
    runner = new_runner(ledger)
    first = await charge(runner, provider, policy=RETRY_FAILED)
    settled = await runner.reconcile(first.receipt.action_id, PaymentVerifier(provider))
    return expect(
        "Timeout-after-commit recovery",
        {
            "first": "UNKNOWN",
            "execution": "UNKNOWN",
            "verification": "CONFIRMED",
            "final": "CONFIRMED",
            "calls": 1,
            "charges": 1,
        },
        {
            "first": first.status.value,
            "execution": _value(settled.receipt.execution_status),
            "verification": _value(settled.receipt.verification_status),
            "final": settled.status.value,
            **counts(provider),
        },
    )


async def unknown_auto_retry_protection(ledger: Ledger) -> SafetyCheck:
    provider = FakePaymentProvider(
        charge_faults=[
            ChargeFault.CONNECTION_RESET_AFTER_COMMIT,
            ChargeFault.MALFORMED_RESPONSE_AFTER_COMMIT,
        ]
    )
    runner = new_runner(ledger)
    policy = RetryPolicy(max_attempts=3, retry_on_failed=True)
    first = await charge(runner, provider, policy=policy)
    again = await charge(runner, provider, policy=policy)  # a caller retrying by hand
    return expect(
        "Unknown auto-retry protection",
        {"status": "UNKNOWN", "attempts": 1, "replayed": True, "calls": 1, "charges": 1},
        {
            "status": again.status.value,
            "attempts": first.receipt.attempts,
            "replayed": again.replayed,
            **counts(provider),
        },
    )


async def verifier_unavailable_handling(ledger: Ledger) -> SafetyCheck:
    provider = FakePaymentProvider(
        charge_faults=[ChargeFault.TIMEOUT_AFTER_COMMIT], lookup_faults=[LookupFault.UNAVAILABLE]
    )
    runner = new_runner(ledger)
    during = await charge(runner, provider, verifier=PaymentVerifier(provider), policy=RETRY_FAILED)
    later = await runner.reconcile(during.receipt.action_id, PaymentVerifier(provider))
    return expect(
        "Verifier unavailable handling",
        {"during_outage": "UNKNOWN", "after_outage": "CONFIRMED", "calls": 1, "charges": 1},
        {
            "during_outage": during.status.value,
            "after_outage": later.status.value,
            **counts(provider),
        },
    )


async def unhealthy_false_negative_handling(ledger: Ledger) -> SafetyCheck:
    provider = FakePaymentProvider(
        charge_faults=[ChargeFault.TIMEOUT_AFTER_COMMIT], lookup_faults=[LookupFault.STALE_EMPTY]
    )
    result = await charge(
        new_runner(ledger),
        provider,
        verifier=StaleReadTrustingVerifier(provider),
        policy=RETRY_FAILED,
    )
    return expect(
        "Unhealthy false-negative handling",
        {"status": "UNKNOWN", "calls": 1, "charges": 1},
        {"status": result.status.value, **counts(provider)},
    )


async def wrong_verification_identity(ledger: Ledger) -> SafetyCheck:
    provider = FakePaymentProvider(
        charge_faults=[ChargeFault.TIMEOUT_AFTER_COMMIT],
        lookup_faults=[LookupFault.WRONG_REFERENCE],
    )
    result = await charge(
        new_runner(ledger), provider, verifier=BlindAbsenceVerifier(provider), policy=RETRY_FAILED
    )
    return expect(
        "wrong-verification-identity",
        {"status": "UNKNOWN", "calls": 1, "charges": 1},
        {"status": result.status.value, **counts(provider)},
    )


async def unknown_evidence_erasure(ledger: Ledger) -> SafetyCheck:
    # Only the loud escape hatch makes a second attempt after UNKNOWN possible;
    # even then, the later decline must not erase the first attempt's charge.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        policy = RetryPolicy(max_attempts=2, retry_on_unknown=True)
        provider = FakePaymentProvider(
            charge_faults=[ChargeFault.TIMEOUT_AFTER_COMMIT, ChargeFault.DECLINED]
        )
        result = await charge(new_runner(ledger), provider, policy=policy)
    return expect(
        "unknown-evidence-erasure",
        {"status": "UNKNOWN", "attempt_statuses": ["UNKNOWN", "FAILED"], "calls": 2, "charges": 1},
        {
            "status": result.status.value,
            "attempt_statuses": [
                _value(a.execution_status) for a in result.receipt.attempt_records
            ],
            **counts(provider),
        },
    )


CHECKS = [
    ("Normal success", normal_success),
    ("Explicit pre-side-effect failure", explicit_pre_side_effect_failure),
    ("Replay safety", replay_safety),
    ("Concurrent duplicate safety", concurrent_duplicate_safety),
    ("Same-key/body conflict", same_key_body_conflict),
    ("Timeout-before-commit recovery", timeout_before_commit_recovery),
    ("Timeout-after-commit recovery", timeout_after_commit_recovery),
    ("Unknown auto-retry protection", unknown_auto_retry_protection),
    ("Verifier unavailable handling", verifier_unavailable_handling),
    ("Unhealthy false-negative handling", unhealthy_false_negative_handling),
    ("wrong-verification-identity", wrong_verification_identity),
    ("unknown-evidence-erasure", unknown_evidence_erasure),
]


def _value(status: ActionStatus | None) -> str | None:
    return None if status is None else status.value


# -- the comparison ------------------------------------------------------------------


async def naive_retry() -> FakePaymentProvider:
    """What a plain retry loop does when the response is lost after commit."""
    provider = FakePaymentProvider(charge_faults=[ChargeFault.TIMEOUT_AFTER_COMMIT])
    for _ in range(2):
        try:
            await charge_op(provider)()
            break
        except TimeoutError:
            continue
    return provider


async def guarded_retry(ledger: Ledger) -> tuple[FakePaymentProvider, Any]:
    """The same retry loop around Dataoad: the second call replays and reconciles."""
    provider = FakePaymentProvider(charge_faults=[ChargeFault.TIMEOUT_AFTER_COMMIT])
    runner = new_runner(ledger)
    result = None
    for _ in range(2):
        result = await charge(runner, provider, verifier=PaymentVerifier(provider))
    return provider, result


async def comparison(ledger_factory: LedgerFactory) -> str:
    naive = await naive_retry()
    ledger = ledger_factory()
    try:
        guarded, result = await guarded_retry(ledger)
    finally:
        await ledger.close()
    receipt = result.receipt
    total = sum(c.amount_cents for c in naive.charges)
    return "\n".join(
        [
            "Timeout-after-commit comparison",
            f"  Naive retry: calls={naive.charge_calls}, charges={len(naive.charges)}, "
            f"total={total} cents",
            f"  Dataoad:    execution={_value(receipt.execution_status)}, "
            f"verification={_value(receipt.verification_status)}, "
            f"final={_value(receipt.final_status)}, calls={guarded.charge_calls}, "
            f"charges={len(guarded.charges)}",
        ]
    )


async def run_safety_suite(
    ledger_factory: LedgerFactory | None = None,
    runner_factory: Callable[[Ledger], ActionRunner] = ActionRunner,
) -> SafetyReport:
    """Run the comparison and the twelve checks; each check gets a fresh ledger.

    Without a factory, every check runs on the embedded default ledger
    (SQLite in a temporary file).
    """
    factory = ledger_factory if ledger_factory is not None else _default_ledgers()
    token = _runner_factory.set(runner_factory)
    try:
        return await run_checks(
            ACTION, CHECKS, ledger_factory=factory, comparison=await comparison(factory)
        )
    finally:
        _runner_factory.reset(token)


if __name__ == "__main__":
    report = asyncio.run(run_safety_suite())
    print(report.render())
    raise SystemExit(0 if report.passed else 1)
