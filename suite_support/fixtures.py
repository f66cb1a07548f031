"""The ledger files earlier versions wrote (``tests/data``), read as they are."""

from __future__ import annotations

import contextlib
import sqlite3
from pathlib import Path


def read_only_fixture(path: Path) -> contextlib.closing[sqlite3.Connection]:
    """A connection to the fixture ``path`` that can neither change it nor leave files by it.

    ``immutable``: a read-only open of a WAL file still creates its ``-wal``
    and ``-shm`` files beside it, in the checkout (and fails where the
    checkout is read-only).
    """
    return contextlib.closing(
        sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro&immutable=1", uri=True)
    )
