"""A payment provider whose charges live in a SQLite file, so they survive a SIGKILL.

The crash tests kill worker processes at every point of a guarded step and
count the charges afterwards. ``charge`` is deliberately not idempotent (no
unique reference): a second call for one order is a second charge, as with a
provider that takes no idempotency key.
"""

from __future__ import annotations

import contextlib
import sqlite3
import uuid
from collections.abc import Iterator
from pathlib import Path

from dataoad import ActionReceipt, VerificationResult

__all__ = ["FilePayments"]


class FilePayments:
    """Charges in ``path``: one row per charge, committed before ``charge`` returns."""

    def __init__(self, path: str | Path) -> None:
        self.path = str(path)
        with self._connect() as db:
            db.execute(
                "CREATE TABLE IF NOT EXISTS charges (id TEXT PRIMARY KEY, reference TEXT, cents INT)"
            )

    @contextlib.contextmanager
    def _connect(self) -> Iterator[sqlite3.Connection]:
        # Closed on the way out: a connection's own ``with`` only commits.
        db = sqlite3.connect(self.path, timeout=30, isolation_level=None)
        try:
            db.execute("PRAGMA journal_mode=WAL")
            db.execute("PRAGMA synchronous=FULL")
            yield db
        finally:
            db.close()

    def charge(self, reference: str, cents: int) -> str:
        """Charge ``cents`` for ``reference``; the charge is durable when this returns."""
        charge_id = f"ch_{uuid.uuid4().hex[:12]}"
        with self._connect() as db:
            db.execute("INSERT INTO charges VALUES (?, ?, ?)", (charge_id, reference, cents))
        return charge_id

    def charges(self, reference: str | None = None) -> list[tuple[str, str, int]]:
        """Every charge (of ``reference``), oldest first."""
        with self._connect() as db:
            if reference is None:
                rows = db.execute("SELECT id, reference, cents FROM charges ORDER BY rowid")
            else:
                rows = db.execute(
                    "SELECT id, reference, cents FROM charges WHERE reference = ? ORDER BY rowid",
                    (reference,),
                )
            return [tuple(row) for row in rows]

    def verify(self, receipt: ActionReceipt) -> VerificationResult:
        """A read-only verifier: the charge for the receipt's reference, or its absence."""
        reference = receipt.provider_reference
        assert reference is not None
        found = self.charges(reference)
        if found:
            return VerificationResult.confirmed(
                verified_provider_reference=reference, provider_request_id=found[0][0]
            )
        return VerificationResult.absent(verified_provider_reference=reference, retry_safe=True)
