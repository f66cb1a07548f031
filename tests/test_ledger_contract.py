"""The ledger contract, run against every backend with the same checks."""

from __future__ import annotations

import tempfile
from pathlib import Path

import pytest

from dataoad import InMemoryLedger, Ledger, SQLiteLedger
from dataoad.testing import DurableLedgerContract, LedgerContract


class TestInMemoryLedger(LedgerContract):
    """InMemoryLedger: one shared instance is the only kind of peer."""

    def make_ledger(self) -> Ledger:
        return InMemoryLedger()


class TestSQLiteLedger(DurableLedgerContract):
    """SQLiteLedger: peers are separate connections to the same file."""

    @pytest.fixture(autouse=True)
    def _folder(self, tmp_path: Path) -> None:
        self.folder = tmp_path

    def make_ledger(self) -> Ledger:
        return SQLiteLedger(self.folder / "ledger.sqlite3")

    def peer(self, ledger: Ledger) -> Ledger:
        assert isinstance(ledger, SQLiteLedger)
        return SQLiteLedger(ledger.path)

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
