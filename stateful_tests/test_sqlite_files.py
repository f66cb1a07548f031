"""The runner machine's SQLite files: a copied empty ledger, and direct reads of it.

The machine judges every step by what ``SQLiteStorageReads`` reads, so those
reads must be exactly what the ledger's own ``find`` and ``get`` return, for
every kind of receipt a run leaves behind.
"""

from __future__ import annotations

import stat
from pathlib import Path

from dataoad import SQLiteLedger
from dataoad.ledgers._sqlite_file import SCHEMA_VERSION, inspect_file
from stateful_tests.every_receipt import KEYS, every_receipt, read_alike
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
    made = await every_receipt(ledger)
    reads = SQLiteStorageReads(path)
    assert reads.ready()
    try:
        for namespace, key in KEYS:
            own = await ledger.find("charge", key, namespace)
            assert reads.find("charge", key, namespace) == own
        assert reads.find("charge", "b", "") is None
        for action_id in made.ids():
            assert read_alike(reads.get(action_id), await ledger.get(action_id))
        assert reads.get(made.failed.action_id) is not None  # retired, still readable
        # A row read again unchanged is decoded once; a changed row anew.
        before = reads.get(made.pending.action_id)
        assert reads.get(made.pending.action_id) is before
        assert await ledger.renew(made.pending.action_id, made.pending.fencing_token, 60.0)
        after = reads.get(made.pending.action_id)
        assert after is not before
        assert after == await ledger.get(made.pending.action_id)
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
        async def find(self, action_name: str, idempotency_key: str, namespace: str = "") -> None:
            return None

    assert SQLiteStorageReads.reads_like_the_ledger(ReopeningSQLiteLedger(tmp_path / "b.sqlite3"))
    assert not SQLiteStorageReads.reads_like_the_ledger(FindsOtherwise(tmp_path / "c.sqlite3"))
    assert not SQLiteStorageReads.reads_like_the_ledger(object())
