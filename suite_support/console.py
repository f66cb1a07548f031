"""A ledger for the console tests: unresolved receipts whose stored strings try to break the page.

Keys, metadata, verifier reasons and errors hold ``<script>``, quotes and
control characters; every page must show them as text.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from dataoad import (
    ActionPersistenceError,
    ActionRunner,
    DefinitiveFailure,
    PostgresLedger,
    SQLiteLedger,
    VerificationResult,
)
from dataoad.testing import FaultyLedger, LedgerFault, ManualClock
from suite_support import unstarted
from suite_support.services import PostgresTestTable

#: Breaks out of HTML, attributes and lines if anything is not escaped.
HOSTILE = "<script>alert('x')</script>\"'&\x07\x1b[31m"

VERIFIERS = """
from dataoad import VerificationResult

def confirms(receipt):
    return VerificationResult.confirmed(
        verified_provider_reference=receipt.provider_reference, provider_request_id="ch_1"
    )

VERIFIERS = {"charge": confirms}
"""


@dataclasses.dataclass
class ConsoleStore:
    """A ledger (SQLite file or PostgreSQL table) and what is in it."""

    url: str
    table: str | None
    folder: Path
    unknown_id: str
    stale_id: str
    failed_id: str

    def args(self) -> list[str]:
        """``--ledger`` (and ``--table``) for the CLI."""
        return ["--ledger", self.url] + ([] if self.table is None else ["--table", self.table])


async def fill(ledger: Any, clock: ManualClock | None = None) -> tuple[str, str, str]:
    """An UNKNOWN charge, a stale unstarted claim and a FAILED charge, all hostile."""
    runner = ActionRunner(ledger)

    def lost() -> None:
        raise TimeoutError(f"lost {HOSTILE}")

    def unknown_answer(receipt: Any) -> VerificationResult:
        return VerificationResult.unknown(reason=f"provider says {HOSTILE}")

    unknown = await runner.execute(
        "charge",
        lost,
        request={"n": 1},
        idempotency_key=f"key {HOSTILE}",
        provider_reference="ref-1",
        metadata={"note": HOSTILE},
        verifier=unknown_answer,
    )
    held = await unstarted(
        ledger, f"stale {HOSTILE}", provider_reference=None, owner=f"gone {HOSTILE}", lease=0.001
    )

    def declined() -> None:
        raise DefinitiveFailure(f"declined {HOSTILE}")

    failed = await runner.execute("charge", declined, request={"n": 3}, idempotency_key="declined")
    await asyncio.sleep(0.01)  # the stale claim's lease has run out
    return unknown.receipt.action_id, held.action_id, failed.receipt.action_id


@contextmanager
def console_store(kind: str, folder: Path) -> Iterator[ConsoleStore]:
    """A filled ledger of ``kind`` ("sqlite" or "postgres"), dropped afterwards."""
    (folder / "ops_verifiers.py").write_text(VERIFIERS)
    if kind == "sqlite":
        path = folder / "ledger.sqlite3"

        async def make_sqlite() -> tuple[str, str, str]:
            async with SQLiteLedger(path) as ledger:
                return await fill(ledger)

        ids = asyncio.run(make_sqlite())
        yield ConsoleStore(f"sqlite:///{path}", None, folder, *ids)
        return
    table = PostgresTestTable()
    asyncio.run(table.create())

    async def make_postgres() -> tuple[str, str, str]:
        ledger = table.client()
        try:
            return await fill(ledger)
        finally:
            await ledger.close()

    try:
        ids = asyncio.run(make_postgres())
        yield ConsoleStore(table.dsn, f"public.{table.table}", folder, *ids)
    finally:
        asyncio.run(table.drop())


def add_tenant_failure(store: ConsoleStore) -> str:
    """A FAILED charge of namespace ``tenant`` under the default namespace's key ``declined``; its id."""

    def declined() -> None:
        raise DefinitiveFailure("declined")

    async def add(ledger: Any) -> str:
        runner = ActionRunner(ledger, namespace="tenant")
        failed = await runner.execute(
            "charge", declined, request={"n": 4}, idempotency_key="declined"
        )
        return failed.receipt.action_id

    return _in_store(store, add)


def add_started_claim(store: ConsoleStore, key: str, *, lease: float) -> str:
    """A PENDING charge with one attempt started, its lease ``lease`` seconds (its
    worker's outcome write failed, as when it dies after the provider call); its id."""

    async def add(ledger: Any) -> str:
        faulty = FaultyLedger(ledger)
        faulty.inject("record", LedgerFault.FAIL_BEFORE_WRITE)
        runner = ActionRunner(faulty, lease=lease, owner="worker-A")
        with pytest.raises(ActionPersistenceError) as info:
            await runner.execute(
                "charge", lambda: "ok", request={}, idempotency_key=key, provider_reference=key
            )
        assert info.value.receipt is not None
        return info.value.receipt.action_id

    return _in_store(store, add)


def _in_store(store: ConsoleStore, add: Callable[[Any], Awaitable[str]]) -> str:
    async def in_store() -> str:
        if store.table is None:
            async with SQLiteLedger(store.folder / "ledger.sqlite3") as ledger:
                return await add(ledger)
        schema, _, table = store.table.rpartition(".")
        postgres = PostgresLedger(store.url, schema=schema, table=table)
        try:
            return await add(postgres)
        finally:
            await postgres.close()

    return asyncio.run(in_store())
