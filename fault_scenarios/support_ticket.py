"""Creating a support ticket: the provider honours an idempotency key.

Provider idempotency and Dataoad's claim work together: the provider
deduplicates what reaches it, Dataoad keeps the caller from blindly acting
on ambiguity and records what is known.
"""

from __future__ import annotations

import warnings
from typing import Any

from dataoad import ActionRunner, Ledger, RetryPolicy
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
    raises_conflict,
    read_back,
    run_scenario,
)

ACTION = "create_ticket"
KEY = "ticket-order-77"
RETRY_FAILED = RetryPolicy(max_attempts=2, retry_on_failed=True)


class FakeTicketProvider:
    """Creates tickets; a repeated idempotency key returns the existing ticket."""

    def __init__(self, *faults: Fault) -> None:
        self.state = ProviderState()
        self.script = FaultScript(faults)

    async def create(self, *, title: str, idempotency_key: str) -> dict[str, Any]:
        fault = self.script.next()
        existing = self.state.effects.get(idempotency_key)
        if existing:
            self.state.calls += 1
            return existing[0]  # provider-side deduplication
        record = {"id": self.state.new_id("tkt"), "title": title}
        return self.state.apply(idempotency_key, record, fault)

    @property
    def tickets(self) -> int:
        return self.state.count(KEY)


class TicketLookup:
    """Looks the ticket up by the idempotency key the provider stored with it."""

    def __init__(self, provider: FakeTicketProvider) -> None:
        self.provider = provider

    def verify(self, receipt: Any) -> Any:
        return read_back(
            self.provider.state,
            receipt.provider_reference,
            fence=True,
            request_id=lambda r: r["id"],
        )


async def create(runner: ActionRunner, provider: FakeTicketProvider, **kwargs: Any) -> Any:
    title = kwargs.pop("title", "Order 77 arrived damaged")
    return await runner.execute(
        ACTION,
        lambda: provider.create(title=title, idempotency_key=KEY),
        request={"title": title},
        idempotency_key=KEY,
        provider_reference=KEY,
        **kwargs,
    )


def checks(new_runner: RunnerFactory) -> list[tuple[str, Any]]:
    def observed(result: Any, provider: FakeTicketProvider) -> dict[str, Any]:
        return {
            "status": result.status.value,
            "calls": provider.state.calls,
            "tickets": provider.tickets,
        }

    async def normal_create(ledger: Ledger) -> SafetyCheck:
        provider = FakeTicketProvider()
        result = await create(new_runner(ledger), provider)
        return expect(
            "Normal create",
            {"status": "CONFIRMED", "calls": 1, "tickets": 1},
            observed(result, provider),
        )

    async def timeout_after_create_is_reconciled(ledger: Ledger) -> SafetyCheck:
        provider = FakeTicketProvider(Fault.TIMEOUT_AFTER_COMMIT)
        runner = new_runner(ledger)
        first = await create(runner, provider, policy=RETRY_FAILED)
        settled = await runner.reconcile(first.receipt.action_id, TicketLookup(provider))
        return expect(
            "Timeout after create: reconciled, not repeated",
            {"first": "UNKNOWN", "status": "CONFIRMED", "calls": 1, "tickets": 1},
            {"first": first.status.value, **observed(settled, provider)},
        )

    async def escape_hatch_is_absorbed_by_provider_idempotency(ledger: Ledger) -> SafetyCheck:
        # retry_on_unknown is only defensible downstream of real idempotency.
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            policy = RetryPolicy(max_attempts=2, retry_on_unknown=True)
            provider = FakeTicketProvider(Fault.RESET_AFTER_COMMIT)
            result = await create(new_runner(ledger), provider, policy=policy)
        return expect(
            "Escape hatch absorbed by provider idempotency",
            {"status": "CONFIRMED", "calls": 2, "tickets": 1},
            observed(result, provider),
        )

    async def refused_before_send_is_retried(ledger: Ledger) -> SafetyCheck:
        provider = FakeTicketProvider(Fault.REFUSED_BEFORE_SEND)
        result = await create(
            new_runner(ledger), provider, verifier=TicketLookup(provider), policy=RETRY_FAILED
        )
        return expect(
            "Refused before send: verified absent, created once",
            {"status": "CONFIRMED", "calls": 2, "tickets": 1},
            observed(result, provider),
        )

    async def changed_title_is_a_conflict(ledger: Ledger) -> SafetyCheck:
        provider = FakeTicketProvider()
        runner = new_runner(ledger)
        await create(runner, provider)
        refused = await raises_conflict(create(runner, provider, title="Something else"))
        return expect(
            "Same key, changed title is a conflict",
            {"refused": True, "calls": 1, "tickets": 1},
            {"refused": refused, "calls": provider.state.calls, "tickets": provider.tickets},
        )

    return [
        ("Normal create", normal_create),
        ("Timeout after create", timeout_after_create_is_reconciled),
        ("Escape hatch and provider idempotency", escape_hatch_is_absorbed_by_provider_idempotency),
        ("Refused before send", refused_before_send_is_retried),
        ("Same key, changed title", changed_title_is_a_conflict),
    ]


async def run_safety_suite(
    ledger_factory: LedgerFactory | None = None, runner_factory: RunnerFactory = ActionRunner
) -> SafetyReport:
    """Run the ticket checks, each on a fresh ledger (SQLite in a temporary file by default)."""
    return await run_scenario(ACTION, checks(runner_factory), ledger_factory)
