"""Sending an email: a provider with no idempotency at all.

A resend after a lost response is a second email in someone's inbox. The
only protection is Dataoad's claim plus a read-back of the provider's
outbox by the message reference we attach before sending.
"""

from __future__ import annotations

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

ACTION = "send_email"
REF = "msg-2024-0042"
RETRY_FAILED = RetryPolicy(max_attempts=2, retry_on_failed=True)


class FakeMailProvider:
    """Accepts messages into an outbox; every accepted send is one delivered email."""

    def __init__(self, *faults: Fault) -> None:
        self.state = ProviderState()
        self.script = FaultScript(faults)

    async def send(self, *, to: str, subject: str, message_ref: str) -> dict[str, Any]:
        fault = self.script.next()
        record = {"id": self.state.new_id("mail"), "to": to, "subject": subject}
        return self.state.apply(message_ref, record, fault)

    @property
    def delivered(self) -> int:
        return self.state.count(REF)


class OutboxVerifier:
    """Looks the message up in the outbox by its reference, fencing pending sends first."""

    def __init__(self, provider: FakeMailProvider) -> None:
        self.provider = provider

    def verify(self, receipt: Any) -> Any:
        return read_back(
            self.provider.state,
            receipt.provider_reference,
            fence=True,
            request_id=lambda r: r["id"],
        )


async def send(runner: ActionRunner, provider: FakeMailProvider, **kwargs: Any) -> Any:
    subject = kwargs.pop("subject", "Your receipt")
    return await runner.execute(
        ACTION,
        lambda: provider.send(to="ada@example.org", subject=subject, message_ref=REF),
        request={"to": "ada@example.org", "subject": subject},
        idempotency_key="receipt-email-42",
        provider_reference=REF,
        **kwargs,
    )


def checks(new_runner: RunnerFactory) -> list[tuple[str, Any]]:
    async def normal_send(ledger: Ledger) -> SafetyCheck:
        provider = FakeMailProvider()
        result = await send(new_runner(ledger), provider)
        return expect(
            "Normal send",
            {"status": "CONFIRMED", "calls": 1, "emails": 1},
            {
                "status": result.status.value,
                "calls": provider.state.calls,
                "emails": provider.delivered,
            },
        )

    async def refused_before_send_is_retried_after_read_back(ledger: Ledger) -> SafetyCheck:
        provider = FakeMailProvider(Fault.REFUSED_BEFORE_SEND)
        result = await send(
            new_runner(ledger), provider, verifier=OutboxVerifier(provider), policy=RETRY_FAILED
        )
        return expect(
            "Refused before send: verified absent, sent once",
            {"status": "CONFIRMED", "calls": 2, "emails": 1},
            {
                "status": result.status.value,
                "calls": provider.state.calls,
                "emails": provider.delivered,
            },
        )

    async def timeout_after_send_is_never_resent(ledger: Ledger) -> SafetyCheck:
        provider = FakeMailProvider(Fault.TIMEOUT_AFTER_COMMIT)
        runner = new_runner(ledger)
        first = await send(runner, provider, policy=RETRY_FAILED)
        again = await send(runner, provider, policy=RETRY_FAILED)
        return expect(
            "Timeout after send is never resent",
            {"status": "UNKNOWN", "replayed": True, "calls": 1, "emails": 1},
            {
                "status": first.status.value,
                "replayed": again.replayed,
                "calls": provider.state.calls,
                "emails": provider.delivered,
            },
        )

    async def reset_after_send_is_confirmed_by_read_back(ledger: Ledger) -> SafetyCheck:
        provider = FakeMailProvider(Fault.RESET_AFTER_COMMIT)
        result = await send(
            new_runner(ledger), provider, verifier=OutboxVerifier(provider), policy=RETRY_FAILED
        )
        return expect(
            "Reset after send: confirmed by read-back",
            {"status": "CONFIRMED", "calls": 1, "emails": 1},
            {
                "status": result.status.value,
                "calls": provider.state.calls,
                "emails": provider.delivered,
            },
        )

    async def changed_body_under_the_same_key_is_refused(ledger: Ledger) -> SafetyCheck:
        provider = FakeMailProvider()
        runner = new_runner(ledger)
        await send(runner, provider)
        refused = await raises_conflict(send(runner, provider, subject="Your receipt (again)"))
        return expect(
            "Changed body under the same key is refused",
            {"refused": True, "calls": 1, "emails": 1},
            {"refused": refused, "calls": provider.state.calls, "emails": provider.delivered},
        )

    return [
        ("Normal send", normal_send),
        ("Refused before send", refused_before_send_is_retried_after_read_back),
        ("Timeout after send", timeout_after_send_is_never_resent),
        ("Reset after send", reset_after_send_is_confirmed_by_read_back),
        ("Same key, changed body", changed_body_under_the_same_key_is_refused),
    ]


async def run_safety_suite(
    ledger_factory: LedgerFactory | None = None, runner_factory: RunnerFactory = ActionRunner
) -> SafetyReport:
    """Run the email checks, each on a fresh ledger (SQLite in a temporary file by default)."""
    return await run_scenario(ACTION, checks(runner_factory), ledger_factory)
