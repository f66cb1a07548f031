"""A partial refund, with a provider that may commit late after a timeout.

Here an empty read is not proof: the refund can still be processing. Only a
verifier that first cancels (fences) the pending request may call the
absence final, and only then may a retry happen.
"""

from __future__ import annotations

from typing import Any

from dataoad import ActionRunner, DefinitiveFailure, Ledger, RetryPolicy, VerificationResult
from dataoad.testing import (
    LedgerFactory,
    SafetyCheck,
    SafetyReport,
    expect,
)
from fault_scenarios._kit import (
    Fault,
    FaultScript,
    ProviderState,
    RunnerFactory,
    fencing_token,
    read_back,
    run_scenario,
    zombie_and_taker,
)

ACTION = "refund_charge"
REF = "refund-ch_9-1"
CHARGED = 10_000
RETRY_FAILED = RetryPolicy(max_attempts=2, retry_on_failed=True)


class FakeRefundProvider:
    """Refunds part of a charge; requests may sit in flight and commit later."""

    def __init__(self, *faults: Fault) -> None:
        self.state = ProviderState()
        self.script = FaultScript(faults)

    def refunded(self) -> int:
        return sum(r["amount"] for records in self.state.effects.values() for r in records)

    async def refund(
        self, *, amount: int, refund_ref: str, fencing_token: int | None = None
    ) -> dict[str, Any]:
        self.state.check_fence(refund_ref, fencing_token)
        if amount > CHARGED - self.refunded():
            self.state.calls += 1
            raise DefinitiveFailure("refund exceeds the remaining charge")
        fault = self.script.next()
        record = {"id": self.state.new_id("re"), "amount": amount}
        return self.state.apply(refund_ref, record, fault)

    @property
    def refunds(self) -> int:
        return self.state.count(REF)


class LookOnlyVerifier:
    """Reads refunds by reference without cancelling anything pending."""

    def __init__(self, provider: FakeRefundProvider) -> None:
        self.provider = provider

    def verify(self, receipt: Any) -> VerificationResult:
        return read_back(
            self.provider.state,
            receipt.provider_reference,
            fence=False,
            request_id=lambda r: r["id"],
        )


class CancellingVerifier(LookOnlyVerifier):
    """Cancels pending requests for the reference first, so absence becomes final.

    It fences at the receipt's fencing token too: a worker whose claim was
    taken over can no longer have its late refund accepted.
    """

    def verify(self, receipt: Any) -> VerificationResult:
        return read_back(
            self.provider.state,
            receipt.provider_reference,
            fence=True,
            request_id=lambda r: r["id"],
            fencing_token=receipt.fencing_token,
        )


async def refund(
    runner: ActionRunner, provider: FakeRefundProvider, amount: int = 2_500, **kw: Any
) -> Any:
    return await runner.execute(
        ACTION,
        lambda: provider.refund(amount=amount, refund_ref=REF),
        request={"charge": "ch_9", "amount_cents": amount},
        idempotency_key=REF,
        provider_reference=REF,
        risk="financial",
        **kw,
    )


def checks(new_runner: RunnerFactory) -> list[tuple[str, Any]]:
    def observed(result: Any, provider: FakeRefundProvider) -> dict[str, Any]:
        return {
            "status": result.status.value,
            "calls": provider.state.calls,
            "refunds": provider.refunds,
            "refunded": provider.refunded(),
        }

    async def normal_partial_refund(ledger: Ledger) -> SafetyCheck:
        provider = FakeRefundProvider()
        result = await refund(new_runner(ledger), provider)
        return expect(
            "Normal partial refund",
            {"status": "CONFIRMED", "calls": 1, "refunds": 1, "refunded": 2_500},
            observed(result, provider),
        )

    async def absence_while_in_flight_is_not_proof(ledger: Ledger) -> SafetyCheck:
        provider = FakeRefundProvider(Fault.TIMEOUT_IN_FLIGHT)
        runner = new_runner(ledger)
        first = await refund(
            runner, provider, verifier=LookOnlyVerifier(provider), policy=RETRY_FAILED
        )
        provider.state.settle_in_flight()  # the provider finishes the refund late
        later = await runner.reconcile(first.receipt.action_id, LookOnlyVerifier(provider))
        return expect(
            "Absence while in flight is not proof",
            {
                "first": "UNKNOWN",
                "status": "CONFIRMED",
                "calls": 1,
                "refunds": 1,
                "refunded": 2_500,
            },
            {"first": first.status.value, **observed(later, provider)},
        )

    async def fenced_absence_allows_one_retry(ledger: Ledger) -> SafetyCheck:
        provider = FakeRefundProvider(Fault.TIMEOUT_IN_FLIGHT)
        result = await refund(
            new_runner(ledger), provider, verifier=CancellingVerifier(provider), policy=RETRY_FAILED
        )
        provider.state.settle_in_flight()  # nothing left to land: it was cancelled
        return expect(
            "Fenced absence allows one retry",
            {"status": "CONFIRMED", "calls": 2, "refunds": 1, "refunded": 2_500},
            observed(result, provider),
        )

    async def timeout_after_commit_is_not_refunded_twice(ledger: Ledger) -> SafetyCheck:
        provider = FakeRefundProvider(Fault.TIMEOUT_AFTER_COMMIT)
        result = await refund(new_runner(ledger), provider, policy=RETRY_FAILED)
        return expect(
            "Timeout after commit is not refunded twice",
            {"status": "UNKNOWN", "calls": 1, "refunds": 1, "refunded": 2_500},
            observed(result, provider),
        )

    async def zombie_refund_is_refused(ledger: Ledger) -> SafetyCheck:
        provider = FakeRefundProvider()

        async def execute(runner: ActionRunner, before_send: Any) -> Any:
            async def send() -> dict[str, Any]:
                await before_send()
                return await provider.refund(
                    amount=2_500, refund_ref=REF, fencing_token=fencing_token()
                )

            return await runner.execute(
                ACTION,
                send,
                request={"charge": "ch_9", "amount_cents": 2_500},
                idempotency_key=REF,
                provider_reference=REF,
                risk="financial",
                verifier=CancellingVerifier(provider),
                policy=RETRY_FAILED,
            )

        taken, zombie = await zombie_and_taker(ledger, new_runner, execute)
        return expect(
            "A paused worker's late refund is refused after a takeover",
            {
                "taken_over": True,
                "zombie": "ClaimFencedError",
                "fenced_refusals": 1,
                "status": "CONFIRMED",
                "calls": 1,
                "refunds": 1,
                "refunded": 2_500,
            },
            {
                "taken_over": taken.taken_over,
                "zombie": type(zombie).__name__,
                "fenced_refusals": provider.state.fenced_refusals,
                **observed(taken, provider),
            },
        )

    async def over_refund_is_a_definitive_failure(ledger: Ledger) -> SafetyCheck:
        provider = FakeRefundProvider()
        result = await refund(new_runner(ledger), provider, amount=CHARGED + 1, policy=RETRY_FAILED)
        return expect(
            "Over-refund is a definitive failure",
            {"status": "FAILED", "calls": 1, "refunds": 0, "refunded": 0},
            observed(result, provider),
        )

    return [
        ("Normal partial refund", normal_partial_refund),
        ("Absence while in flight", absence_while_in_flight_is_not_proof),
        ("Fenced absence allows one retry", fenced_absence_allows_one_retry),
        ("Timeout after commit", timeout_after_commit_is_not_refunded_twice),
        ("Over-refund", over_refund_is_a_definitive_failure),
        ("Zombie refund after takeover", zombie_refund_is_refused),
    ]


async def run_safety_suite(
    ledger_factory: LedgerFactory | None = None, runner_factory: RunnerFactory = ActionRunner
) -> SafetyReport:
    """Run the refund checks, each on a fresh ledger (SQLite in a temporary file by default)."""
    return await run_scenario(ACTION, checks(runner_factory), ledger_factory)
