"""A primary with a streaming standby (Debian's binaries, ``ReplicatedPostgres``): what
``durability()``, ``require_durable`` and the doctor say of asynchronous and synchronous
replication, and a ledger that follows a failover through a multi-host DSN."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import pytest

from dataoad import (
    ActionPersistenceError,
    ActionRunner,
    LedgerDurabilityError,
    NothingInvokedError,
    PostgresLedger,
)
from suite_support.services import replicated_postgres


def replicated(synchronous: bool) -> Iterator[object]:
    with replicated_postgres(synchronous=synchronous) as pair:
        yield pair


@pytest.fixture
def asynchronous_pair() -> Iterator[object]:
    yield from replicated(False)


@pytest.fixture
def synchronous_pair() -> Iterator[object]:
    yield from replicated(True)


def doctor(url: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "dataoad", "ledger", "doctor", "--ledger", url, "--json"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


async def test_an_asynchronous_standby_is_unsafe_and_require_durable_refuses_it(
    asynchronous_pair: object,
) -> None:
    dsn = asynchronous_pair.dsn  # type: ignore[attr-defined]
    async with PostgresLedger(dsn, min_size=1, max_size=1) as ledger:
        report = await ledger.durability()
    assert not report.safe
    assert report.settings["standbys"] == [
        {"application_name": "standby1", "state": "streaming", "sync_state": "async"}
    ]
    (reason,) = report.reasons
    assert "none synchronous" in reason
    assert "synchronous_standby_names" in reason
    with pytest.raises(LedgerDurabilityError, match="none synchronous"):
        await PostgresLedger.open(dsn, require_durable=True)
    done = doctor(dsn)
    assert done.returncode == 1, done.stderr
    assert json.loads(done.stdout)["reasons"] == [reason]


async def test_a_synchronous_standby_is_safe_and_so_is_local_commit_refused(
    synchronous_pair: object,
) -> None:
    dsn = synchronous_pair.dsn  # type: ignore[attr-defined]
    async with PostgresLedger(dsn, min_size=1, max_size=1) as ledger:
        report = await ledger.durability()
    assert report.safe, report.reasons
    assert report.settings["standbys"][0]["sync_state"] == "sync"
    assert doctor(dsn).returncode == 0
    local = dsn + "&synchronous_commit=local"
    async with PostgresLedger(local, min_size=1, max_size=1) as ledger:
        report = await ledger.durability()
    assert not report.safe
    assert "synchronous_commit is local while standbys exist" in report.reasons[0]


async def test_after_a_failover_the_ledger_writes_to_the_new_primary_and_lost_nothing(
    synchronous_pair: object,
) -> None:
    pair = synchronous_pair
    ledger = PostgresLedger(pair.dsn, min_size=1, max_size=2, command_timeout=5)  # type: ignore[attr-defined]
    try:
        await ledger.migrate()
        runner = ActionRunner(ledger, lease=None)
        before = [
            await runner.execute("charge", lambda: "ch", request={"i": i}, idempotency_key=f"k{i}")
            for i in range(5)
        ]
        # A partition outlasting a write's time limit: the write's backend is ended
        # while it waits for the standby, and its commit stays on the primary alone.
        # Taken for proven, the claim would charge, and the failover would lose it.
        charges: list[str] = []

        def charge() -> str:
            charges.append("k8")
            return "ch"

        pair.pause_replication()  # type: ignore[attr-defined]
        partitioned = PostgresLedger(pair.dsn, min_size=1, max_size=2, command_timeout=0.5)  # type: ignore[attr-defined]
        try:
            with pytest.raises(NothingInvokedError):
                await ActionRunner(partitioned).execute(
                    "charge", charge, request={"i": 8}, idempotency_key="k8"
                )
        finally:
            await partitioned.close()
        assert charges == []
        pair.kill_primary()  # type: ignore[attr-defined]
        pair.promote()  # type: ignore[attr-defined]
        # The pool's connections to the dead primary fail; new ones find the new primary.
        after = None
        refused: list[ActionPersistenceError] = []
        for _ in range(5):
            try:
                after = await runner.execute(
                    "charge", lambda: "ch", request={"i": 9}, idempotency_key="k9"
                )
                break
            except ActionPersistenceError as exc:
                refused.append(exc)
        # A call the broken connection refused ran nothing it did not record.
        assert not any(exc.operation_invoked for exc in refused)
        assert after is not None
        assert after.status.value == "CONFIRMED"
        # The partitioned claim never reached the standby: the key is new there, and
        # its one charge is this one.
        again = await runner.execute("charge", charge, request={"i": 8}, idempotency_key="k8")
        assert again.status.value == "CONFIRMED"
        assert not again.replayed
        assert charges == ["k8"]
        # Every claim acknowledged before the crash is on the new primary, unchanged.
        for i, result in enumerate(before):
            stored = await ledger.find("charge", f"k{i}")
            assert stored is not None
            assert stored.action_id == result.receipt.action_id
            assert stored.final_status == result.status
        async with PostgresLedger(pair.dsn, min_size=1, max_size=1) as fresh:  # type: ignore[attr-defined]
            assert not (await fresh.durability()).settings["in_recovery"]
    finally:
        await ledger.close()


async def test_a_role_that_may_not_read_the_standbys_is_told_what_to_grant(
    asynchronous_pair: object,
) -> None:
    pair: Any = asynchronous_pair
    pair._query(pair.primary, "CREATE ROLE app LOGIN")
    dsn = pair.dsn.replace("postgres@", "app@")
    async with PostgresLedger(dsn, min_size=1, max_size=1) as ledger:
        report = await ledger.durability()
    assert not report.safe
    assert report.settings["standbys_unreadable"] is True
    (reason,) = report.reasons
    assert "grant pg_monitor" in reason
    done = doctor(dsn)
    assert done.returncode == 1
    assert json.loads(done.stdout)["reasons"] == [reason]
    pair._query(pair.primary, "GRANT pg_monitor TO app")
    async with PostgresLedger(dsn, min_size=1, max_size=1) as ledger:
        report = await ledger.durability()
    assert "none synchronous" in report.reasons[0]
