"""DBOS (the real ``dbos`` package): a checkout workflow's worker killed at every point of
its charge step, then recovered by DBOS itself. With Dataoad the provider holds at most
one charge and the receipt says how the step ended; without it, DBOS charges twice."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.engines.crash_harness import CrashRun, crash_matrix, run_crash
from tests.engines.dbos_support import postgres_database
from tests.engines.ledger_view import stored_receipts

WORKER = "tests.engines.dbos_worker"


def check_guarded(run: CrashRun, ledger: Path, *, verifier: bool) -> None:
    """The rules every guarded scenario must keep, whatever the point."""
    assert run.killed, f"the worker never reached {run.point}"
    assert len(run.charges) <= 1, f"charged {len(run.charges)} times: {run.charges}"
    receipts = stored_receipts(ledger)
    assert len(receipts) == 1, receipts
    receipt = receipts[0]
    assert receipt.idempotency_key == "dbos:checkout-1:1"
    assert not receipt.is_pending
    assert receipt.final_status is not None
    # The receipt says how the step ended, and the provider agrees with it.
    assert run.outcome["receipt"] == receipt.final_status.value
    if receipt.final_status.value == "CONFIRMED":
        assert len(run.charges) == 1
    if verifier or run.point in ("before_claim", "after_outcome"):
        assert run.outcome["outcome"] == "CONFIRMED"
    else:
        # Attempted, no verifier: nothing may call it again, the workflow is told.
        assert run.outcome == {"outcome": "unresolved", "receipt": "UNKNOWN"}


@pytest.mark.parametrize(("point", "verifier"), crash_matrix())
def test_guarded_step_killed_and_recovered_by_dbos(
    tmp_path: Path, point: str, verifier: bool, dbos_system_database: str
) -> None:
    run = run_crash(
        WORKER,
        tmp_path,
        point,
        mode="guarded",
        verifier=verifier,
        system_database=dbos_system_database,
    )
    check_guarded(run, tmp_path / "ledger.sqlite3", verifier=verifier)
    # How it ended, point by point: the evidence, not only the count.
    if point == "before_claim":
        assert not run.outcome["replayed"]
        assert not run.outcome["taken_over"]
    elif point == "after_outcome":
        assert run.outcome["replayed"]
    elif verifier:
        assert run.outcome["taken_over"]  # the dead worker's claim, settled read-only first


@pytest.fixture
def dbos_postgres_database() -> Iterator[str]:
    """A fresh database for DBOS's system tables on the test server, dropped afterwards."""
    with postgres_database() as url:
        yield url


@pytest.mark.parametrize("verifier", [True, False])
def test_guarded_step_on_dbos_postgres_system_database(
    tmp_path: Path, dbos_postgres_database: str, verifier: bool
) -> None:
    run = run_crash(
        WORKER,
        tmp_path,
        "after_commit",
        mode="guarded",
        verifier=verifier,
        system_database=dbos_postgres_database,
    )
    check_guarded(run, tmp_path / "ledger.sqlite3", verifier=verifier)


def test_without_dataoad_dbos_charges_twice(
    tmp_path: Path, record_property: Callable[[str, object], None], dbos_system_database: str
) -> None:
    run = run_crash(
        WORKER,
        tmp_path,
        "after_commit",
        mode="plain",
        verifier=False,
        system_database=dbos_system_database,
    )
    assert run.killed
    # DBOS re-ran the plain step on recovery: the customer paid twice.
    assert len(run.charges) == 2, run.charges
    record_property(
        "without_dataoad",
        f"DBOS, plain step, killed after the provider committed: {len(run.charges)} charges "
        f"for one order ({', '.join(c[0] for c in run.charges)})",
    )
