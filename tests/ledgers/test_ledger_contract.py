"""The ledger contract, run against every backend with the same checks."""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

import pytest

from dataoad import (
    ActionRunner,
    ClaimState,
    InMemoryLedger,
    Ledger,
    SQLiteLedger,
)
from dataoad.testing import (
    DurableLedgerContract,
    LeaseContract,
    LedgerContract,
    LifecycleContract,
    ManualClock,
)


class TestInMemoryLedger(LedgerContract, LeaseContract, LifecycleContract):
    """InMemoryLedger: one shared instance is the only kind of peer."""

    def make_ledger(self) -> Ledger:
        return InMemoryLedger()

    def make_leasing_ledger(self, clock: ManualClock) -> InMemoryLedger:
        return InMemoryLedger(clock=clock)


class TestSQLiteLedger(DurableLedgerContract, LeaseContract, LifecycleContract):
    """SQLiteLedger: peers are separate connections to the same file."""

    @pytest.fixture(autouse=True)
    def _folder(self, tmp_path: Path) -> None:
        self.folder = tmp_path

    def make_ledger(self) -> Ledger:
        return SQLiteLedger(self.folder / "ledger.sqlite3")

    def peer(self, ledger: Ledger) -> Ledger:
        assert isinstance(ledger, SQLiteLedger)
        return SQLiteLedger(ledger.path)

    def make_leasing_ledger(self, clock: ManualClock) -> SQLiteLedger:
        return SQLiteLedger(self.folder / "leases.sqlite3", clock=clock)

    def leasing_peer(self, ledger: Any, clock: ManualClock) -> SQLiteLedger:
        return SQLiteLedger(ledger.path, clock=clock)

    def reopen(self, ledger: Ledger) -> Ledger:
        assert isinstance(ledger, SQLiteLedger)
        return SQLiteLedger(ledger.path)


class TestSQLiteLedgerNormalSync(TestSQLiteLedger):
    """The same contract with synchronous=NORMAL."""

    def make_ledger(self) -> Ledger:
        return SQLiteLedger(self.folder / "ledger.sqlite3", synchronous="NORMAL")


def test_contract_tmp_helpers_do_not_leak() -> None:
    # tempfile is the documented way for third-party subclasses without pytest fixtures.
    with tempfile.TemporaryDirectory() as folder:
        assert Path(folder).is_dir()


async def test_ledger_contract_refuses_invalid_transitions() -> None:
    inner = InMemoryLedger()
    done = await ActionRunner(inner).execute("a", lambda: 1, request={}, idempotency_key="k")
    cur = done.receipt  # COMPLETED, attempts 1, version 3
    from dataoad import AttemptRecord
    from dataoad._receipt import utc_now

    extra = (*cur.attempt_records, AttemptRecord(number=2, started_at=utc_now()))
    assert not await inner.start_attempt(
        cur.evolve(
            claim_state=ClaimState.PENDING,
            attempts=2,
            attempt_records=extra,
            version=cur.version + 1,
        )
    )
    assert not await inner.record(
        cur.evolve(claim_state=ClaimState.PENDING, version=cur.version + 1)
    )
    assert not await inner.record(
        cur.evolve(attempts=2, attempt_records=extra, version=cur.version + 1)
    )
    assert not await inner.record(cur.evolve(request_hash="0" * 64, version=cur.version + 1))
    # pending claim: version skip, attempts jump, record count mismatch

    pend = cur.evolve(
        action_id="p",
        idempotency_key="k2",
        claim_state=ClaimState.PENDING,
        attempts=0,
        attempt_records=(),
        version=1,
        execution_status=None,
        verification_status=None,
        final_status=None,
    )
    assert (await inner.claim(pend))[1]
    r1 = (AttemptRecord(number=1, started_at=utc_now()),)
    assert not await inner.start_attempt(pend.evolve(attempts=1, attempt_records=r1, version=3))
    assert not await inner.start_attempt(pend.evolve(attempts=2, attempt_records=r1 * 2, version=2))
    assert not await inner.start_attempt(pend.evolve(attempts=1, attempt_records=(), version=2))
    assert not await inner.release("p", 2)
    assert await inner.release("p", 1)
