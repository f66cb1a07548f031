"""A fenced worker's evidence merged under a live owner never costs that owner its outcome (V1).

A worker A is paused past its lease while its attempt runs; B takes the
claim over, finds (read-only) that the charge is absent and retry-safe, and
starts attempt 2. A then returns: fenced, it merges what it saw into the
claim B still holds, which moves the claim's version. B's own outcome must
still be recorded, with A's evidence folded in, on every backend; and the
skewed clocks of the two workers' hosts play no part (only the ledger's).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest

import dataoad._clock as clock_module
import dataoad._ledger_rules as rules_module
import dataoad._receipt as receipt_module
from dataoad import (
    ActionInProgressError,
    ActionRunner,
    ActionStatus,
    ClaimFencedError,
    DefinitiveFailure,
    InMemoryLedger,
    NothingInvokedError,
    RetryPolicy,
    SQLiteLedger,
    VerificationResult,
)
from dataoad.testing import ManualClock
from suite_support.services import PostgresTestTable

REQUEST = {"amount": 100}
LEASE = 30.0


class PausedCall:
    """A provider call that waits until ``finish`` is set, then counts itself in ``calls``."""

    def __init__(self, name: str, calls: list[str], answer: Callable[[], str]) -> None:
        self.name, self.calls, self.answer = name, calls, answer
        self.started, self.finish = asyncio.Event(), asyncio.Event()

    async def __call__(self) -> str:
        self.started.set()
        await self.finish.wait()
        self.calls.append(self.name)
        return self.answer()


def charge_order_1(ledger: Any, owner: str, operation: Any, **options: Any) -> Any:
    """``owner``'s call of ``operation`` for the one charge every test here makes."""
    return ActionRunner(ledger, owner=owner, lease=LEASE).execute(
        "charge",
        operation,
        request=REQUEST,
        idempotency_key="k",
        provider_reference="order-1",
        **options,
    )


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock()


@pytest.fixture(params=["memory", "sqlite", "postgres"])
async def ledger(
    request: pytest.FixtureRequest, tmp_path: Path, clock: ManualClock
) -> AsyncIterator[Any]:
    if request.param == "memory":
        yield InMemoryLedger(clock=clock)
    elif request.param == "sqlite":
        async with SQLiteLedger(tmp_path / "ledger.sqlite3", clock=clock) as lite:
            yield lite
    else:
        table = PostgresTestTable()
        await table.create()
        pg = table.client(clock=clock)
        try:
            yield pg
        finally:
            await pg.close()
            await table.drop()


@pytest.mark.parametrize("zombie_saw", ["declined", "confirmed"])
async def test_the_owner_records_its_outcome_over_a_zombies_merged_evidence(
    ledger: Any, clock: ManualClock, zombie_saw: str
) -> None:
    charges: list[str] = []

    def a_answer() -> str:
        if zombie_saw == "declined":
            raise DefinitiveFailure("card declined")
        return "ch_A"

    a_charge = PausedCall("A", charges, a_answer)
    b_charge = PausedCall("B", charges, lambda: "ch_B")

    def verifier(receipt: Any) -> VerificationResult:
        # The provider's view: B's charge once made; before it, nothing yet
        # (A's request is still in flight when B looks).
        if "B" in charges:
            return VerificationResult.confirmed(
                verified_provider_reference="order-1", provider_request_id="ch_B"
            )
        return VerificationResult.absent(verified_provider_reference="order-1", retry_safe=True)

    policy = RetryPolicy(max_attempts=2, retry_on_failed=True)
    zombie = asyncio.create_task(charge_order_1(ledger, "A", a_charge))
    await a_charge.started.wait()
    clock.advance(LEASE + 1)  # A is paused past its lease
    owner = asyncio.create_task(
        charge_order_1(ledger, "B", b_charge, verifier=verifier, policy=policy)
    )
    await b_charge.started.wait()  # B took over, verified absence, and runs attempt 2
    a_charge.finish.set()
    with pytest.raises(ClaimFencedError) as fenced:
        await zombie
    assert fenced.value.operation_invoked is True
    assert fenced.value.receipt is not None
    merged = await ledger.get(fenced.value.receipt.action_id)
    assert merged.is_pending
    assert merged.owner == "B"
    assert merged.attempt_records[0].execution_status is not None  # A's evidence is in
    b_charge.finish.set()
    result = await owner  # before the fix: OutcomeNotRecordedError
    assert result.taken_over
    stored = await ledger.get(result.receipt.action_id)
    assert not stored.is_pending
    assert stored == result.receipt
    assert stored.owner == "B"
    # B's plain return is UNKNOWN pending read-back; its verifier confirmed it.
    assert stored.attempt_records[1].verification_status is ActionStatus.CONFIRMED
    expected_first = ActionStatus.FAILED if zombie_saw == "declined" else ActionStatus.CONFIRMED
    assert stored.attempt_records[0].execution_status is expected_first
    # A charge B saw succeed: CONFIRMED either way, judged from every attempt.
    assert stored.final_status is ActionStatus.CONFIRMED
    assert charges == ["A", "B"]
    # A's evidence named no other charge: B's value is still tied to the
    # retained id its own confirmation named, and is shown.
    assert stored.provider_request_id == "ch_B"
    assert result.value == "ch_B"


async def test_a_sqlite_process_whose_clock_runs_ahead_never_takes_a_live_lease(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The SQLite file's own clock judges leases: a process's patched clock is never read."""
    path = tmp_path / "ledger.sqlite3"

    started, finish = asyncio.Event(), asyncio.Event()

    async def slow() -> str:
        started.set()
        await finish.wait()
        return "ok"

    async with SQLiteLedger(path) as ledger:
        holder = asyncio.create_task(
            ActionRunner(ledger, owner="A", lease=LEASE).execute(
                "charge", slow, request=REQUEST, idempotency_key="k"
            )
        )
        await started.wait()
        real = clock_module.utc_now

        def ahead() -> Any:
            return real().replace(year=2099)

        with monkeypatch.context() as patched:
            # Every clock of this process jumps 70 years ahead.
            for module in (clock_module, rules_module, receipt_module):
                patched.setattr(module, "utc_now", ahead)
            async with SQLiteLedger(path) as other:
                with pytest.raises(ActionInProgressError):
                    await ActionRunner(other, owner="B", lease=LEASE).execute(
                        "charge", slow, request=REQUEST, idempotency_key="k"
                    )
        finish.set()
        assert (await holder).status is ActionStatus.CONFIRMED


@pytest.mark.parametrize("zombie_saw", ["declined", "confirmed"])
async def test_the_holders_retry_starts_over_a_zombies_evidence_only_while_it_allows_one(
    ledger: Any, clock: ManualClock, zombie_saw: str
) -> None:
    """A's evidence lands between B's read-only check and B's attempt start.

    A retry-safe decline leaves B's retry allowed: the start is rebuilt over
    it and B's attempt runs. A success A saw is durable evidence that the
    charge may have happened: B must not start a second charge over it
    (nothing is invoked; the claim settles read-only).
    """
    a_started, a_finish, a_done = asyncio.Event(), asyncio.Event(), asyncio.Event()
    charges: list[str] = []

    async def a_charge() -> str:
        a_started.set()
        await a_finish.wait()
        charges.append("A")
        if zombie_saw == "declined":
            raise DefinitiveFailure("card declined", retryable=True)
        return "ch_A"

    async def b_charge() -> str:
        charges.append("B")
        return "ch_B"

    async def verifier(receipt: Any) -> VerificationResult:
        if "B" in charges:
            return VerificationResult.confirmed(verified_provider_reference="order-1")
        if not a_done.is_set():
            # B looked while A's request was in flight; A returns (fenced,
            # its evidence merged) before B can count its attempt.
            a_finish.set()
            await a_done.wait()
        return VerificationResult.absent(verified_provider_reference="order-1", retry_safe=True)

    async def zombie() -> None:
        try:
            with pytest.raises(ClaimFencedError):
                await charge_order_1(ledger, "A", a_charge)
        finally:
            a_done.set()

    a = asyncio.create_task(zombie())
    await a_started.wait()
    clock.advance(LEASE + 1)
    b = ActionRunner(ledger, owner="B", lease=LEASE)
    call = b.execute(
        "charge",
        b_charge,
        request=REQUEST,
        idempotency_key="k",
        provider_reference="order-1",
        verifier=verifier,
        policy=RetryPolicy(max_attempts=2, retry_on_failed=True),
    )
    if zombie_saw == "declined":
        result = await call
        await a
        assert charges == ["A", "B"]
        assert result.status is ActionStatus.CONFIRMED
        stored = await ledger.get(result.receipt.action_id)
        assert stored == result.receipt
        assert stored.attempt_records[0].execution_status is ActionStatus.FAILED  # A's, folded in
        assert stored.attempts == 2
    else:
        with pytest.raises(NothingInvokedError) as refused:
            await call
        await a
        assert charges == ["A"]  # never a second charge over A's success
        assert refused.value.operation_invoked is False
        assert refused.value.receipt is not None
        stored = await ledger.get(refused.value.receipt.action_id)
        assert stored.is_pending
        assert stored.owner == "B"
        assert stored.attempts == 1
        assert stored.attempt_records[0].execution_status is ActionStatus.CONFIRMED


@pytest.mark.parametrize("owner_names_its_charge", [True, False])
async def test_the_owners_value_is_withheld_once_a_zombies_other_charge_is_folded_in(
    ledger: Any, clock: ManualClock, owner_names_its_charge: bool
) -> None:
    """A's verified success (charge ``ch_A``) lands after B started attempt 2.

    B's own charge succeeds too, and its outcome is rebuilt over A's
    evidence. The receipt is CONFIRMED with ``ch_A`` retained (and, when B's
    verifier named ``ch_B``, both ids and a conflict). B's value belongs to
    ``ch_B``: it cannot be correlated to the retained id, so it is withheld,
    as the specification asks of any uncorrelated value.
    """
    charges: list[str] = []

    def no_response() -> str:
        raise TimeoutError("no response")  # ambiguous: A reads back

    a_charge = PausedCall("A", charges, no_response)
    b_charge = PausedCall("B", charges, lambda: "value of ch_B")

    def a_verifier(receipt: Any) -> VerificationResult:
        return VerificationResult.confirmed(
            verified_provider_reference="order-1", provider_request_id="ch_A"
        )

    def b_verifier(receipt: Any) -> VerificationResult:
        if "B" in charges:
            return VerificationResult.confirmed(
                verified_provider_reference="order-1",
                provider_request_id="ch_B" if owner_names_its_charge else None,
            )
        # B looks while A's request is still in flight: nothing yet.
        return VerificationResult.absent(verified_provider_reference="order-1", retry_safe=True)

    zombie = asyncio.create_task(charge_order_1(ledger, "A", a_charge, verifier=a_verifier))
    await a_charge.started.wait()
    clock.advance(LEASE + 1)
    owner = asyncio.create_task(
        charge_order_1(
            ledger,
            "B",
            b_charge,
            verifier=b_verifier,
            policy=RetryPolicy(max_attempts=2, retry_on_failed=True),
        )
    )
    await b_charge.started.wait()  # B's attempt 2 is running
    a_charge.finish.set()
    with pytest.raises(ClaimFencedError):
        await zombie
    b_charge.finish.set()
    result = await owner
    assert charges == ["A", "B"]
    stored = await ledger.get(result.receipt.action_id)
    assert stored == result.receipt
    assert stored.final_status is ActionStatus.CONFIRMED
    if owner_names_its_charge:
        assert sorted(stored.metadata["provider_request_ids"]) == ["ch_A", "ch_B"]
        assert stored.metadata["provider_request_id_conflict"] is True
    else:
        assert stored.provider_request_id == "ch_A"
        assert list(stored.metadata["provider_request_ids"]) == ["ch_A"]
    assert result.value_available is False
