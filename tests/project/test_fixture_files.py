"""The ledger files earlier versions wrote are read without a trace in the checkout."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from suite_support.fixtures import read_only_fixture

DATA = Path(__file__).parents[1] / "data"


@pytest.mark.parametrize("name", sorted(p.name for p in DATA.glob("*.sqlite3")))
def test_reading_a_fixture_leaves_it_and_its_folder_as_they_were(name: str, tmp_path: Path) -> None:
    copy = tmp_path / name
    shutil.copy(DATA / name, copy)
    before = copy.read_bytes()
    with read_only_fixture(copy) as db:
        assert db.execute("SELECT count(*) FROM receipts").fetchone()[0] > 0
    assert [p.name for p in tmp_path.iterdir()] == [name]  # no -wal, no -shm
    assert copy.read_bytes() == before
