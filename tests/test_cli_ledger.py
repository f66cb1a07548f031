"""Operator commands against real SQLite files, run as a person runs them."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from dataoad import ActionPersistenceError, ActionRunner, SQLiteLedger
from dataoad.testing import ChargeFault, FakePaymentProvider, FaultyLedger, LedgerFault
from stateful_tests.services import PostgresTestTable

ROOT = Path(__file__).resolve().parent.parent

VERIFIER = """
from dataoad import VerificationResult

class Confirms:
    def verify(self, receipt):
        return VerificationResult.confirmed(
            verified_provider_reference=receipt.provider_reference, provider_request_id="ch_1"
        )
"""


def dataoad(
    *args: str, cwd: Path, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "dataoad", *args],
        capture_output=True,
        text=True,
        cwd=cwd,
        env={**os.environ, **(env or {})},
        check=False,
        stdin=subprocess.DEVNULL,
    )


@dataclasses.dataclass
class Store:
    """A ledger the commands run against: a SQLite file or a PostgreSQL table."""

    url: str
    env: dict[str, str]
    cwd: Path


@pytest.fixture(params=["sqlite", "postgres"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Store]:
    """A ledger with one UNKNOWN charge, one CONFIRMED one and one stranded claim."""
    table: PostgresTestTable | None = None
    if request.param == "postgres":
        table = PostgresTestTable()
        asyncio.run(table.create())
        url = table.dsn
        env = {"DATAOAD_LEDGER": url, "DATAOAD_LEDGER_TABLE": table.table}
    else:
        path = tmp_path / "ledger.sqlite3"
        url = f"sqlite:///{path}"
        env = {"DATAOAD_LEDGER": url}

    async def build() -> None:
        provider = FakePaymentProvider(charge_faults=[ChargeFault.TIMEOUT_AFTER_COMMIT])
        ledger = table.client() if table is not None else SQLiteLedger(tmp_path / "ledger.sqlite3")
        async with ledger:
            runner = ActionRunner(ledger)
            for key in ("order-1", "order-2"):
                await runner.execute(
                    "charge",
                    lambda key=key: provider.charge(
                        customer_id="c", amount_cents=1, client_reference=key
                    ),
                    request={"key": key},
                    idempotency_key=key,
                    provider_reference=key,
                )
            faulty = FaultyLedger(ledger)
            faulty.inject("start_attempt", LedgerFault.FAIL_BEFORE_WRITE)
            with pytest.raises(ActionPersistenceError):
                await ActionRunner(faulty).execute(
                    "refund", lambda: None, request={}, idempotency_key="order-3"
                )

    asyncio.run(build())
    (tmp_path / "ops_verifier.py").write_text(VERIFIER)
    yield Store(url, env, tmp_path)
    if table is not None:
        asyncio.run(table.drop())


def listing(store: Store, *args: str) -> list[dict[str, object]]:
    done = dataoad("receipts", "list", "--json", *args, cwd=store.cwd, env=store.env)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)  # type: ignore[no-any-return]


def test_list_filters_and_table(store: Store) -> None:
    assert len(listing(store)) == 3
    unknown = listing(store, "--status", "UNKNOWN")
    assert [r["idempotency_key"] for r in unknown] == ["order-1"]
    pending = listing(store, "--pending")
    assert [r["idempotency_key"] for r in pending] == ["order-3"]
    assert [r["action_name"] for r in listing(store, "--action", "refund")] == ["refund"]
    assert listing(store, "--since", "2999-01-01") == []
    assert len(listing(store, "--since", "2000-01-01T00:00:00+02:00")) == 3
    assert len(listing(store, "--limit", "2")) == 2
    table = dataoad("receipts", "list", cwd=store.cwd, env=store.env)
    assert table.returncode == 0
    assert "(3 receipts)" in table.stdout
    assert "UNKNOWN" in table.stdout


def test_show_recover_and_release(store: Store) -> None:
    env, cwd = store.env, store.cwd
    unknown_id = str(listing(store, "--status", "UNKNOWN")[0]["action_id"])
    shown = dataoad("receipts", "show", unknown_id, cwd=cwd, env=env)
    assert shown.returncode == 0
    assert "final_status         UNKNOWN" in shown.stdout
    assert "#1 started" in shown.stdout
    refused = dataoad(
        "recover", unknown_id, "--verifier", "ops_verifier:Confirms", cwd=cwd, env=env
    )
    assert refused.returncode == 2, "recover without --yes and without a terminal must refuse"
    assert listing(store, "--status", "UNKNOWN"), "a refused recover changed something"
    done = dataoad(
        "recover", unknown_id, "--verifier", "ops_verifier:Confirms", "--yes", cwd=cwd, env=env
    )
    assert done.returncode == 0, done.stderr
    assert "final_status         CONFIRMED" in done.stdout
    assert not listing(store, "--status", "UNKNOWN")
    stranded_id = str(listing(store, "--pending")[0]["action_id"])
    released = dataoad("release-unstarted", stranded_id, "--yes", cwd=cwd, env=env)
    assert released.returncode == 0, released.stderr
    assert not listing(store, "--pending")
    again = dataoad("release-unstarted", unknown_id, "--yes", cwd=cwd, env=env)
    assert again.returncode == 1
    assert "only a claim that never invoked" in again.stderr


@pytest.mark.parametrize(
    ("args", "code", "message"),
    [
        (("receipts", "show", "no-such-id"), 1, "no action with id"),
        (("receipts", "list", "--ledger", "/nonexistent/ledger.sqlite3"), 1, "no ledger file"),
        (("receipts", "list", "--ledger", "postgresql://127.0.0.1:1/y"), 1, "cannot reach"),
        (("recover", "x", "--verifier", "missing_module:X", "--yes"), 1, "cannot import"),
        (("recover", "x", "--verifier", "no-colon", "--yes"), 2, "module:attribute"),
        (("receipts", "list", "--since", "yesterday"), 2, "ISO 8601"),
    ],
)
def test_problems_are_one_line_errors(
    store: Store, args: tuple[str, ...], code: int, message: str
) -> None:
    done = dataoad(*args, cwd=store.cwd, env=store.env)
    assert done.returncode == code, done.stderr
    assert message in done.stderr
    assert "Traceback" not in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1


def test_bad_table_name_is_a_one_line_error() -> None:
    table = PostgresTestTable()
    done = dataoad(
        "receipts", "list", "--ledger", table.dsn, "--table", "x.Bad-Name", cwd=ROOT, env={}
    )
    assert done.returncode == 1
    assert "SQL identifier" in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1


def test_no_ledger_given_is_a_usage_error(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k != "DATAOAD_LEDGER"}
    done = subprocess.run(
        [sys.executable, "-m", "dataoad", "receipts", "list"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env=env,
        check=False,
    )
    assert done.returncode == 2
    assert "DATAOAD_LEDGER" in done.stderr
    assert not list(tmp_path.iterdir()), "inspection created a file"


def test_ledger_migrate_on_postgres_from_several_processes_at_once() -> None:
    table = PostgresTestTable()
    command = [sys.executable, "-m", "dataoad", "ledger", "migrate", table.dsn]
    children = [
        subprocess.Popen(
            [*command, "--table", f"public.{table.table}"],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(4)
    ]
    outputs = [child.communicate(timeout=120) for child in children]
    assert all(child.returncode == 0 for child in children), outputs
    lines = sorted(out.strip() for out, _ in outputs)
    assert (
        lines
        == [f"public.{table.table}: ledger schema 0 -> 1"]
        + [f"public.{table.table}: ledger schema 1, up to date"] * 3
    )

    async def usable() -> None:
        ledger = table.client()
        try:
            assert await ledger.schema_version() == 1
            assert await ledger.receipts() == []
        finally:
            await ledger.close()
            await table.drop()

    asyncio.run(usable())


def test_ledger_migrate_creates_a_sqlite_file(tmp_path: Path) -> None:
    path = tmp_path / "new.sqlite3"
    first = dataoad("ledger", "migrate", str(path), cwd=tmp_path)
    assert first.returncode == 0, first.stderr
    assert first.stdout.strip() == f"{path}: ledger schema 0 -> 2"
    second = dataoad("ledger", "migrate", f"sqlite:///{path}", cwd=tmp_path)
    assert second.stdout.strip() == f"{path}: ledger schema 2, up to date"
    assert (path.stat().st_mode & 0o777) == 0o600
