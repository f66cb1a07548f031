"""The runner machine's SQLite files: a copied empty ledger, and direct reads of it.

The machine judges every step by what ``SQLiteStorageReads`` reads, so those
reads must be exactly what the ledger's own ``find`` and ``get`` return, for
every kind of receipt a run leaves behind.
"""

from __future__ import annotations

import stat
from pathlib import Path

import pytest

from dataoad import ActionRunner, ActionStatus, DataoadError, DefinitiveFailure, SQLiteLedger
from dataoad.ledgers._sqlite_file import SCHEMA_VERSION, inspect_file
from dataoad.testing import FaultyLedger, LedgerFault
from stateful_tests.planted_bugs import ReopeningSQLiteLedger
from stateful_tests.sqlite_files import SQLiteStorageReads, new_ledger_file


def test_a_new_ledger_file_is_a_current_owner_only_ledger(tmp_path: Path) -> None:
    path = tmp_path / "ledger.sqlite3"
    new_ledger_file(path)
    assert inspect_file(path) == SCHEMA_VERSION
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    second = tmp_path / "second.sqlite3"
    new_ledger_file(second)
    assert second.read_bytes() == path.read_bytes()


async def test_direct_reads_equal_the_ledgers_own(tmp_path: Path) -> None:
    path = tmp_path / "ledger.sqlite3"
    new_ledger_file(path)
    ledger = SQLiteLedger(path)
    runner = ActionRunner(ledger, owner="worker-a")

    def declined() -> None:
        raise DefinitiveFailure("card declined")

    def lost() -> None:
        raise TimeoutError("no answer")

    done = await runner.execute("charge", lambda: "ch_1", request={"n": 1}, idempotency_key="a")
    failed = await runner.execute("charge", declined, request={"n": 2}, idempotency_key="b")
    unknown = await ActionRunner(ledger, namespace="t").execute(
        "charge", lost, request={"n": 3}, idempotency_key="c", provider_reference="ref-3"
    )
    faulty = FaultyLedger(ledger)
    faulty.inject("record", LedgerFault.FAIL_BEFORE_WRITE)
    with pytest.raises(DataoadError):  # its outcome not recorded: PENDING, leased
        await ActionRunner(faulty, owner="worker-b", lease=30.0).execute(
            "charge", lambda: "ch_4", request={"n": 4}, idempotency_key="d"
        )
    (pending,) = await ledger.receipts(pending=True)
    assert pending.lease_expires_at is not None
    await runner.reopen(failed.receipt.action_id)  # retires "b": find no longer sees it
    assert [done.status, failed.status, unknown.status] == [
        ActionStatus.CONFIRMED,
        ActionStatus.FAILED,
        ActionStatus.UNKNOWN,
    ]
    reads = SQLiteStorageReads(path)
    assert reads.ready()
    try:
        keys = (("", "a"), ("", "b"), ("t", "c"), ("", "d"), ("", "missing"), ("t", "a"))
        for namespace, key in keys:
            own = await ledger.find("charge", key, namespace)
            assert reads.find("charge", key, namespace) == own
        assert reads.find("charge", "b", "") is None
        ids = [r.receipt.action_id for r in (done, failed, unknown)] + [pending.action_id, "no"]
        for action_id in ids:
            direct, own = reads.get(action_id), await ledger.get(action_id)
            assert direct == own
            if own is not None:  # and the fields equality ignores
                assert direct is not None
                assert (direct.stored_at, direct.lease_expires_at, direct.operator_records) == (
                    own.stored_at,
                    own.lease_expires_at,
                    own.operator_records,
                )
        assert reads.get(failed.receipt.action_id) is not None  # retired, still readable
        # A row read again unchanged is decoded once; a changed row anew.
        before = reads.get(pending.action_id)
        assert reads.get(pending.action_id) is before
        assert await ledger.renew(pending.action_id, pending.fencing_token, 60.0)
        after = reads.get(pending.action_id)
        assert after is not before
        assert after == await ledger.get(pending.action_id)
        assert after is not None
        assert before is not None
        assert after.lease_expires_at != before.lease_expires_at
    finally:
        reads.close()
        await ledger.close()


def test_a_ledger_whose_reads_differ_is_read_through_itself(tmp_path: Path) -> None:
    assert SQLiteStorageReads.reads_like_the_ledger(SQLiteLedger(tmp_path / "a.sqlite3"))
    # ReopeningSQLiteLedger changes writes only; a subclass with its own find does not qualify.

    class FindsOtherwise(SQLiteLedger):
        async def find(self, action_name: str, idempotency_key: str, namespace: str = "") -> None:  # type: ignore[override]
            return None

    assert SQLiteStorageReads.reads_like_the_ledger(ReopeningSQLiteLedger(tmp_path / "b.sqlite3"))
    assert not SQLiteStorageReads.reads_like_the_ledger(FindsOtherwise(tmp_path / "c.sqlite3"))
    assert not SQLiteStorageReads.reads_like_the_ledger(object())
