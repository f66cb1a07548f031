"""Ctrl-C, ``sys.exit()`` and a hung verifier inside a sync callable.

A sync operation of a ``SyncActionRunner`` runs on its caller's thread,
where Ctrl-C lands. Raised into the runner's loop, KeyboardInterrupt (or
SystemExit) stopped that loop: every call it served hung, and the leases
it renewed ran out under operations still running, so another runner took
a live claim over. Now the interrupt is an ordinary failure on the loop's
side (the attempt is recorded UNKNOWN) and goes on to its caller. A sync
verifier ran on the caller's thread too, so its time limit freed no one.
"""

from __future__ import annotations

import asyncio
import sys
import threading
from pathlib import Path
from typing import Any

import pytest

from dataoad import (
    ActionRunner,
    ActionStatus,
    ClaimState,
    InMemoryLedger,
    SQLiteLedger,
    SyncActionRunner,
    VerificationResult,
)

REF = "ref-1"


def _ledger(kind: str, tmp_path: Path) -> Any:
    return InMemoryLedger() if kind == "memory" else SQLiteLedger(tmp_path / "l.sqlite3")


def _stored(kind: str, ledger: Any, tmp_path: Path, key: str) -> Any:
    if kind == "memory":
        return _only(ledger, key)

    async def find() -> Any:
        async with SQLiteLedger(tmp_path / "l.sqlite3") as reopened:
            return await reopened.find("charge", key)

    return asyncio.run(find())


def _only(ledger: InMemoryLedger, key: str) -> Any:
    [stored] = [r for r in ledger.snapshot() if r.idempotency_key == key]
    return stored


@pytest.mark.parametrize("kind", ["memory", "sqlite"])
@pytest.mark.parametrize("interrupt", [KeyboardInterrupt, SystemExit])
def test_an_interrupt_in_a_sync_operation_stops_its_caller_and_not_the_runner(
    kind: str, interrupt: type[BaseException], tmp_path: Path
) -> None:
    ledger = _ledger(kind, tmp_path)
    runner = SyncActionRunner(ledger, lease=30.0)
    calls: list[int] = []
    try:
        release = threading.Event()
        other_running = threading.Event()
        other: dict[str, Any] = {}

        def slow_charge() -> str:
            other_running.set()
            release.wait(30)
            return "ch-other"

        def call_other() -> None:
            other["result"] = runner.execute(
                "charge", slow_charge, request={"n": 2}, idempotency_key="other"
            )

        thread = threading.Thread(target=call_other)
        thread.start()
        assert other_running.wait(10)

        def interrupted() -> str:
            calls.append(1)
            raise interrupt()

        with pytest.raises(interrupt):
            runner.execute("charge", interrupted, request={"n": 1}, idempotency_key="k")
        # The runner's loop lives: the call in flight on another thread ends,
        # and a new call is served.
        release.set()
        thread.join(10)
        assert not thread.is_alive()
        assert other["result"].status is ActionStatus.CONFIRMED
        served = runner.execute("charge", lambda: "ch", request={"n": 3}, idempotency_key="k3")
        assert served.status is ActionStatus.CONFIRMED
    finally:
        runner.close()  # waits for the interrupted call's record
    assert calls == [1]
    stored = _stored(kind, ledger, tmp_path, "k")
    assert stored.claim_state is ClaimState.COMPLETED
    assert stored.final_status is ActionStatus.UNKNOWN  # interrupted after it was invoked
    # Which is written first, the interrupt as the operation's failure or the
    # caller's leaving as a cancellation, is a race; both say UNKNOWN.
    assert stored.attempt_records[0].error in {
        f"Interrupted: {interrupt.__name__}",
        "CancelledError: cancelled after the operation was invoked",
    }


def test_an_interrupted_attempt_is_recorded_unknown_and_never_run_again() -> None:
    ledger = InMemoryLedger()
    runner = SyncActionRunner(ledger)
    calls: list[int] = []

    def interrupted() -> str:
        calls.append(1)
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        runner.execute("charge", interrupted, request={}, idempotency_key="k")
    replay = runner.execute("charge", interrupted, request={}, idempotency_key="k")
    assert replay.replayed
    assert replay.status is ActionStatus.UNKNOWN
    assert calls == [1]
    [stored] = ledger.snapshot()
    assert stored.claim_state is ClaimState.COMPLETED
    runner.close()


async def test_sys_exit_in_a_worker_thread_operation_is_an_unknown_outcome() -> None:
    # Off the main thread, sys.exit() ends only that thread, as Python has it:
    # for the async runner, whose sync operations run on worker threads, it
    # is an operation that failed mid-way.
    ledger = InMemoryLedger()

    def exits() -> str:
        sys.exit(3)

    result = await ActionRunner(ledger).execute("charge", exits, request={}, idempotency_key="k")
    assert result.status is ActionStatus.UNKNOWN
    assert result.receipt.error == "Interrupted: SystemExit"
    assert asyncio.get_running_loop().is_running()


def test_a_sync_verifier_past_its_time_limit_frees_the_sync_caller() -> None:
    runner = SyncActionRunner(InMemoryLedger(), verifier_timeout=0.05)
    release = threading.Event()
    still_reading = threading.Event()
    done_reading = threading.Event()

    def hung_read(receipt: Any) -> VerificationResult:
        still_reading.set()
        release.wait(5)  # held on the caller's thread, the call would return only after this
        done_reading.set()
        return VerificationResult.confirmed(verified_provider_reference=REF)

    def lost() -> None:
        raise TimeoutError("response lost")

    try:
        result = runner.execute(
            "charge",
            lost,
            request={},
            idempotency_key="k",
            provider_reference=REF,
            verifier=hung_read,
        )
        # Returned while the verifier still reads: the limit freed the caller.
        # (On a loaded machine its thread may start reading after the limit.)
        assert still_reading.wait(10)
        assert not done_reading.is_set()
        assert result.status is ActionStatus.UNKNOWN
        [observation] = result.receipt.observations
        assert observation.error == "verifier raised TimeoutError: no answer within 0.05 s"
    finally:
        release.set()
        runner.close()


def test_one_sqlite_ledger_opened_from_two_loops_at_once_serves_both(tmp_path: Path) -> None:
    # An async runner (the application's loop) and a sync runner (its own
    # loop) share one ledger, as LangGraph's invoke and ainvoke do. The
    # second loop's first call waited on the first loop's opening lock and
    # was never woken.
    ledger = SQLiteLedger(tmp_path / "shared.sqlite3")
    sync = SyncActionRunner(ledger)
    answers: dict[str, Any] = {}
    waiting = threading.Event()

    def sync_call() -> None:
        waiting.set()
        answers["sync"] = sync.execute("a", lambda: "ok", request={}, idempotency_key="s1")

    async def main() -> threading.Thread:
        first = asyncio.create_task(
            ActionRunner(ledger).execute("a", lambda: "ok", request={}, idempotency_key="a1")
        )
        await asyncio.sleep(0)  # the first call is opening the file
        thread = threading.Thread(target=sync_call)
        thread.start()
        waiting.wait(10)
        # Hold this loop a moment: the sync side's first call now contends
        # for the opening with the first one, from another loop.
        threading.Event().wait(0.05)
        answers["async"] = await first
        return thread

    thread = asyncio.run(main())
    thread.join(10)
    try:
        assert not thread.is_alive()
        assert answers["async"].status is ActionStatus.CONFIRMED
        assert answers["sync"].status is ActionStatus.CONFIRMED
    finally:
        sync.close()
