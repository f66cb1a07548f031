"""Client-side bounds (issue 35, item 4): each refused or cut short before it can do harm.

Request and metadata sizes are refused with InvalidRequestError before any
ledger write (and at exactly the bound, accepted); a verifier that does not
answer in time is no evidence (UNKNOWN), never a hang; a DefinitiveFailure
whose attributes raise still yields an ActionResult; a file that holds no
ledger is never taken for a new one.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import sqlite3
import stat
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any, TypedDict

import pytest
import rfc8785

from dataoad import (
    ActionRunner,
    ActionStatus,
    DefinitiveFailure,
    InMemoryLedger,
    InvalidArgumentError,
    InvalidRequestError,
    LedgerFileError,
    RetryPolicy,
    SQLiteLedger,
    SyncActionRunner,
    VerificationResult,
)


class _Key(TypedDict):
    idempotency_key: str


KEY: _Key = {"idempotency_key": "k"}


def _request_of_size(size: int) -> dict[str, Any]:
    """A request whose canonical form is exactly ``size`` bytes."""
    base = len(rfc8785.dumps({"pad": ""}))
    request = {"pad": "x" * (size - base)}
    assert len(rfc8785.dumps(request)) == size
    return request


@pytest.mark.parametrize("bound", [64, 1 << 20])
async def test_a_request_over_its_bound_is_refused_before_any_write(bound: int) -> None:
    ledger = InMemoryLedger()
    runner = ActionRunner(ledger, max_request_bytes=bound)
    calls: list[int] = []

    def op() -> str:
        calls.append(1)
        return "ok"

    with pytest.raises(InvalidRequestError, match=f"max_request_bytes={bound}") as info:
        await runner.execute("charge", op, request=_request_of_size(bound + 1), **KEY)
    assert info.value.path == "request"
    assert ledger.snapshot() == []
    assert calls == []
    done = await runner.execute("charge", op, request=_request_of_size(bound), **KEY)
    assert done.status is ActionStatus.CONFIRMED


async def test_the_default_request_bound_is_one_mebibyte() -> None:
    runner = ActionRunner(InMemoryLedger())
    with pytest.raises(InvalidRequestError):
        await runner.execute("charge", lambda: 1, request=_request_of_size((1 << 20) + 1), **KEY)
    assert (
        await runner.execute("charge", lambda: 1, request=_request_of_size(1 << 20), **KEY)
    ).status is (ActionStatus.CONFIRMED)


async def test_metadata_over_its_bound_is_refused_before_any_write() -> None:
    ledger = InMemoryLedger()
    runner = ActionRunner(ledger, max_metadata_bytes=100)
    base = len('{"note":""}')
    fits = {"note": "y" * (100 - base)}
    over = {"note": "y" * (101 - base)}
    with pytest.raises(InvalidRequestError, match="max_metadata_bytes=100") as info:
        await runner.execute("charge", lambda: 1, request={}, metadata=over, **KEY)
    assert info.value.path == "metadata"
    assert ledger.snapshot() == []
    done = await runner.execute("charge", lambda: 1, request={}, metadata=fits, **KEY)
    assert done.receipt.metadata["note"] == fits["note"]


def test_the_default_metadata_bound_holds_on_a_sync_runner_too() -> None:
    sync = SyncActionRunner(InMemoryLedger())
    try:
        with pytest.raises(InvalidRequestError, match="65536"):
            sync.execute("charge", lambda: 1, request={}, metadata={"n": "z" * (64 << 10)}, **KEY)
        assert sync.ledger.snapshot() == []  # type: ignore[attr-defined]
    finally:
        sync.close()


@pytest.mark.parametrize(
    "options",
    [
        {"max_request_bytes": 0},
        {"max_request_bytes": (64 << 20) + 1},
        {"max_request_bytes": 1.5},
        {"max_request_bytes": True},
        {"max_metadata_bytes": -1},
        {"verifier_timeout": 0},
        {"verifier_timeout": -1.0},
        {"verifier_timeout": float("inf")},
        {"verifier_timeout": 3600.5},
        {"verifier_timeout": "30"},
    ],
)
def test_bad_bounds_are_refused_when_the_runner_is_built(options: dict[str, Any]) -> None:
    with pytest.raises(InvalidArgumentError):
        ActionRunner(InMemoryLedger(), **options)


@pytest.mark.parametrize("kind", ["async", "sync"])
async def test_a_verifier_that_does_not_answer_in_time_is_no_evidence(kind: str) -> None:
    ledger = InMemoryLedger()
    runner = ActionRunner(ledger, verifier_timeout=0.2)

    async def slow_async(receipt: Any) -> VerificationResult:
        await asyncio.sleep(30)
        raise AssertionError("never reached")

    answered = threading.Event()

    def slow_sync(receipt: Any) -> VerificationResult:
        # Answers only once execute has returned: a call that waited for it
        # would take the whole 30 s (judged by an event, not a tight clock).
        answered.wait(30)
        return VerificationResult.confirmed(verified_provider_reference="ref")

    started = time.monotonic()
    try:
        result = await runner.execute(
            "charge",
            lambda: "ok",
            request={},
            provider_reference="ref",
            verifier=slow_async if kind == "async" else slow_sync,
            **KEY,
        )
    finally:
        answered.set()
    assert time.monotonic() - started < 5  # the limit is 0.2 s; the verifier takes 30
    assert result.status is ActionStatus.UNKNOWN
    observation = result.receipt.observations[-1]
    assert observation.status is ActionStatus.UNKNOWN
    assert "no answer within 0.2 s" in (observation.error or "")


async def test_a_verifier_answering_in_time_is_heard() -> None:
    runner = ActionRunner(InMemoryLedger(), verifier_timeout=5)

    async def quick(receipt: Any) -> VerificationResult:
        await asyncio.sleep(0.05)
        return VerificationResult.confirmed(verified_provider_reference="ref")

    result = await runner.execute(
        "charge", lambda: "ok", request={}, provider_reference="ref", verifier=quick, **KEY
    )
    assert result.status is ActionStatus.CONFIRMED


class Hostile(DefinitiveFailure):
    """A DefinitiveFailure whose retry flag and message raise when read."""

    def __getattribute__(self, name: str) -> Any:
        if name == "retryable":
            raise RuntimeError("hostile retryable")
        return super().__getattribute__(name)

    def __str__(self) -> str:
        raise RuntimeError("hostile str")


async def test_a_hostile_definitive_failure_yields_a_result_and_no_retry() -> None:
    calls: list[int] = []

    def op() -> None:
        calls.append(1)
        raise Hostile("declined")

    runner = ActionRunner(InMemoryLedger())
    result = await runner.execute(
        "charge", op, request={}, policy=RetryPolicy(max_attempts=3, retry_on_failed=True), **KEY
    )
    assert result.status is ActionStatus.FAILED
    assert calls == [1]  # its retry flag could not be read: no evidence a retry is safe
    assert "Hostile" in (result.receipt.error or "")


def _ledger_files(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir())


@pytest.mark.parametrize("content", ["zero-length", "empty database"])
async def test_a_file_holding_no_ledger_is_refused_and_left_as_it_was(
    tmp_path: Path, content: str
) -> None:
    path = tmp_path / "ledger.sqlite3"
    if content == "zero-length":
        path.touch()
    else:
        sqlite3.connect(path).close()
    before = path.read_bytes()

    ledger = SQLiteLedger(path)
    with pytest.raises(LedgerFileError, match="holds no Dataoad ledger"):
        await ledger.get("x")
    await ledger.close()
    assert path.read_bytes() == before
    runner = ActionRunner(SQLiteLedger(tmp_path / "new.sqlite3"))
    done = await runner.execute("charge", lambda: 1, request={}, **KEY)
    assert done.status is ActionStatus.CONFIRMED
    await runner.ledger.close()
    assert stat.S_IMODE((tmp_path / "new.sqlite3").stat().st_mode) == 0o600


def test_processes_creating_one_new_ledger_at_once_all_open_it(tmp_path: Path) -> None:
    path = tmp_path / "ledger.sqlite3"
    program = (
        "import asyncio, sys\n"
        "from dataoad import ActionRunner, SQLiteLedger\n"
        "async def main():\n"
        "    async with SQLiteLedger(sys.argv[1]) as ledger:\n"
        "        await ActionRunner(ledger).execute('charge', lambda: 1, request={},"
        " idempotency_key=sys.argv[2])\n"
        "asyncio.run(main())\n"
    )
    workers = [
        subprocess.Popen(
            [sys.executable, "-c", program, str(path), f"k{i}"],
            stderr=subprocess.PIPE,
            text=True,
            env={**os.environ},
        )
        for i in range(6)
    ]
    for worker in workers:
        _, err = worker.communicate(timeout=60)
        assert worker.returncode == 0, err
    with contextlib.closing(sqlite3.connect(path)) as db:
        rows = db.execute("SELECT count(*) FROM receipts").fetchone()[0]
    assert rows == 6


@pytest.mark.parametrize("backend", ["sqlite", "postgres"])
async def test_a_ledger_that_is_not_set_up_says_so_not_how_to_recover(
    backend: str, tmp_path: Path
) -> None:
    """PostgreSQL before `migrate`, or a file that is not a ledger: the error names the set-up
    and gives no recovery advice (none applies), and nothing is invoked."""
    from dataoad import LedgerUnusableError, NothingInvokedError
    from suite_support.services import PostgresTestTable

    if backend == "postgres":
        ledger: Any = PostgresTestTable().client()  # its table was never migrated
    else:
        (tmp_path / "notes.sqlite3").write_text("not a ledger")
        ledger = SQLiteLedger(tmp_path / "notes.sqlite3")
    calls: list[int] = []
    try:
        with pytest.raises(NothingInvokedError) as raised:
            await ActionRunner(ledger).execute(
                "charge", lambda: calls.append(1), request={}, idempotency_key="k"
            )
    finally:
        await ledger.close()
    assert calls == []
    assert raised.value.operation_invoked is False
    assert isinstance(raised.value.__cause__, LedgerUnusableError)
    message = str(raised.value)
    assert "cannot be used as set up" in message
    assert "recover_pending" not in message
    assert "takeover" not in message
    if backend == "postgres":
        assert "migrate" in message
