"""What every engine example shares: the payment provider's adapter, its faults, a ledger.

The step's provider call is ``PaymentAdapter.perform`` and its read-only
check is ``PaymentAdapter.verify``: the adapter ``dataoad check`` tests
(``dataoad check examples/engines/dbos_checkout.py:PaymentAdapter``) is the
code the engine's step runs.
"""

from __future__ import annotations

import atexit
import os
import shutil
import sqlite3
import sys
import tempfile
from pathlib import Path
from typing import Any

from dataoad import ActionRunner, SQLiteLedger
from dataoad.testing import ReadFault, SandboxFault
from examples.adapters.payment_adapter import PaymentAdapter

__all__ = ["ORDER", "PaymentAdapter", "Shop"]

ORDER = {"customer_id": "cus_7", "amount_cents": 2500}


class Shop:
    """A provider whose first charge commits and then times out, and a ledger in a temp folder.

    The folder is removed when the process exits.

    ``lookup_down`` reads of the provider fail first (the verifier then cannot
    tell, and the outcome stays UNKNOWN).
    """

    def __init__(self, *, lookup_down: int = 0) -> None:
        self.adapter = PaymentAdapter()
        self.adapter.reset()
        self.adapter.stage_sandbox_fault(SandboxFault.TIMEOUT_AFTER_COMMIT)
        for _ in range(lookup_down):
            self.adapter.stage_read_fault(ReadFault.UNAVAILABLE)
        self.folder = Path(tempfile.mkdtemp(prefix="dataoad-engine-"))
        # The folder holds this run's ledger and engine state only; nothing
        # reads it after the run, so it goes when the process ends.
        atexit.register(shutil.rmtree, self.folder, ignore_errors=True)
        self.ledger = SQLiteLedger(self.folder / "ledger.sqlite3")
        self.runner = ActionRunner(self.ledger)

    def options(self) -> dict[str, Any]:
        """The guard's request, reference and verifier: the step takes (request, reference)."""
        return {
            "request": lambda request, reference: request,
            "provider_reference": lambda request, reference: reference,
            "verifier": self.adapter.verify,
        }

    def dbos_system_database(self) -> str:
        """Where DBOS keeps its workflows: ``DATAOAD_EXAMPLE_DBOS_URL``, else a SQLite file here.

        DBOS's SQLite system database needs SQLite 3.42+ on Python 3.12+;
        with an older SQLite, point the variable at a PostgreSQL database.
        """
        url = os.environ.get("DATAOAD_EXAMPLE_DBOS_URL")
        if url:
            return url
        if sys.version_info >= (3, 12) and sqlite3.sqlite_version_info < (3, 42):
            raise SystemExit(
                f"DBOS's SQLite system database needs SQLite 3.42+ on Python 3.12+ (this one "
                f"has {sqlite3.sqlite_version}): set DATAOAD_EXAMPLE_DBOS_URL to a PostgreSQL URL"
            )
        return f"sqlite:///{self.folder}/dbos.sqlite"

    def charges(self, reference: str) -> int:
        """How many charges the provider holds for ``reference``."""
        return self.adapter.effects(reference)
