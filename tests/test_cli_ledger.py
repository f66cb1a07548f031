"""Operator commands against real SQLite files, run as a person runs them."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from dataoad import ActionPersistenceError, ActionRunner, SQLiteLedger
from dataoad.testing import ChargeFault, FakePaymentProvider, FaultyLedger, LedgerFault

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


@pytest.fixture
def ledger_file(tmp_path: Path) -> Path:
    """A ledger with one UNKNOWN charge, one CONFIRMED one and one stranded claim."""
    path = tmp_path / "ledger.sqlite3"

    async def build() -> None:
        provider = FakePaymentProvider(charge_faults=[ChargeFault.TIMEOUT_AFTER_COMMIT])
        async with SQLiteLedger(path) as ledger:
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
    return path


def listing(ledger_file: Path, *args: str) -> list[dict[str, object]]:
    done = dataoad(
        "receipts",
        "list",
        "--ledger",
        f"sqlite:///{ledger_file}",
        "--json",
        *args,
        cwd=ledger_file.parent,
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)  # type: ignore[no-any-return]


def test_list_filters_and_table(ledger_file: Path) -> None:
    assert len(listing(ledger_file)) == 3
    unknown = listing(ledger_file, "--status", "UNKNOWN")
    assert [r["idempotency_key"] for r in unknown] == ["order-1"]
    pending = listing(ledger_file, "--pending")
    assert [r["idempotency_key"] for r in pending] == ["order-3"]
    assert [r["action_name"] for r in listing(ledger_file, "--action", "refund")] == ["refund"]
    assert listing(ledger_file, "--since", "2999-01-01") == []
    table = dataoad(
        "receipts", "list", cwd=ledger_file.parent, env={"DATAOAD_LEDGER": str(ledger_file)}
    )
    assert table.returncode == 0
    assert "(3 receipts)" in table.stdout
    assert "UNKNOWN" in table.stdout


def test_show_recover_and_release(ledger_file: Path) -> None:
    env = {"DATAOAD_LEDGER": f"sqlite:///{ledger_file}"}
    cwd = ledger_file.parent
    unknown_id = str(listing(ledger_file, "--status", "UNKNOWN")[0]["action_id"])
    shown = dataoad("receipts", "show", unknown_id, cwd=cwd, env=env)
    assert shown.returncode == 0
    assert "final_status         UNKNOWN" in shown.stdout
    assert "#1 started" in shown.stdout
    refused = dataoad(
        "recover", unknown_id, "--verifier", "ops_verifier:Confirms", cwd=cwd, env=env
    )
    assert refused.returncode == 2, "recover without --yes and without a terminal must refuse"
    assert listing(ledger_file, "--status", "UNKNOWN"), "a refused recover changed something"
    done = dataoad(
        "recover", unknown_id, "--verifier", "ops_verifier:Confirms", "--yes", cwd=cwd, env=env
    )
    assert done.returncode == 0, done.stderr
    assert "final_status         CONFIRMED" in done.stdout
    assert not listing(ledger_file, "--status", "UNKNOWN")
    stranded_id = str(listing(ledger_file, "--pending")[0]["action_id"])
    released = dataoad("release-unstarted", stranded_id, "--yes", cwd=cwd, env=env)
    assert released.returncode == 0, released.stderr
    assert not listing(ledger_file, "--pending")
    again = dataoad("release-unstarted", unknown_id, "--yes", cwd=cwd, env=env)
    assert again.returncode == 1
    assert "only a claim that never invoked" in again.stderr


@pytest.mark.parametrize(
    ("args", "code", "message"),
    [
        (("receipts", "show", "no-such-id"), 1, "no action with id"),
        (("receipts", "list", "--ledger", "/nonexistent/ledger.sqlite3"), 1, "no ledger file"),
        (("receipts", "list", "--ledger", "postgresql://x/y"), 1, "not supported"),
        (("recover", "x", "--verifier", "missing_module:X", "--yes"), 1, "cannot import"),
        (("recover", "x", "--verifier", "no-colon", "--yes"), 2, "module:attribute"),
        (("receipts", "list", "--since", "yesterday"), 2, "ISO 8601"),
    ],
)
def test_problems_are_one_line_errors(
    ledger_file: Path, args: tuple[str, ...], code: int, message: str
) -> None:
    env = {"DATAOAD_LEDGER": str(ledger_file)}
    done = dataoad(*args, cwd=ledger_file.parent, env=env)
    assert done.returncode == code, done.stderr
    assert message in done.stderr
    assert "Traceback" not in done.stderr
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
