"""``python -m benchmarks``: runs without the dev extra, keeps what it measured, judges goals.

(The figures themselves are not checked here: timings belong in benchmarks,
never in tests.)
"""

from __future__ import annotations

import itertools
import json
import subprocess
import sys
from pathlib import Path

import pytest

from dataoad import ActionReceipt

ROOT = Path(__file__).resolve().parents[2]

# Runs the benchmark with the dev tools made unimportable, as in an install
# without the dev extra.
WITHOUT_DEV_TOOLS = (
    "import runpy, sys\n"
    "for name in ('hypothesis', 'pytest', 'stateful_tests', 'models'):\n"
    "    sys.modules[name] = None\n"
    "sys.argv = ['benchmarks', *sys.argv[1:]]\n"
    "runpy.run_module('benchmarks', run_name='__main__', alter_sys=True)\n"
)


def run_benchmarks(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", WITHOUT_DEV_TOOLS, *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


def same_first_call(a: ActionReceipt, b: ActionReceipt) -> bool:
    """Whether two receipts of a first call stored the same outcome and attempt."""
    fields = (
        "claim_state",
        "final_status",
        "execution_status",
        "verification_status",
        "attempts",
        "version",
        "fencing_token",
        "lease_expires_at",
    )
    record = ("number", "execution_status", "verification_status", "retry_decision")
    return [getattr(a, f) for f in fields] == [getattr(b, f) for f in fields] and [
        [getattr(r, f) for f in record] for r in a.attempt_records
    ] == [[getattr(r, f) for f in record] for r in b.attempt_records]


def test_runs_without_the_dev_extra_and_marks_every_goal(tmp_path: Path) -> None:
    out = tmp_path / "bench.json"
    done = run_benchmarks(
        "--quick",
        "--no-postgres",
        "--rounds",
        "1",
        "--sections",
        "calls",
        "floors",
        "suite",
        "--json",
        str(out),
    )
    assert done.returncode == 0, done.stdout + done.stderr
    report = json.loads(out.read_text())
    assert "memory: Dataoad" in report["results"]
    assert "sqlite NORMAL: aiosqlite floor" in report["results"]
    # Counts, not timings: these goals hold on any machine.
    for goal in (
        "commits per first call (goal <= 2)",
        "commits added by a retry (goal <= 1)",
        "writes per replay (goal <= 0)",
        "ledger calls per replay (goal <= 1)",
    ):
        assert report["verdicts"][goal] == "met", goal
    # Without --peers each peer's goal says it was not measured, never met.
    assert report["verdicts"]["memory: first call / Powertools (goal <= 0.5)"] == "not measured"
    assert report["results"]["verification suite speed"].startswith("skipped: needs the dev extra")
    goals = [name for name in report["ratios"] if "(goal " in name]
    assert goals
    assert set(report["verdicts"]) == set(goals)
    assert set(report["verdicts"].values()) <= {"met", "missed", "not measured"}
    for name in goals:
        line = next(line for line in done.stdout.splitlines() if line.startswith(name))
        assert line.endswith((" met", " missed", " not measured")), line


def test_no_postgres_starts_no_server(tmp_path: Path) -> None:
    done = run_benchmarks("--quick", "--no-postgres", "--sections", "postgres")
    assert done.returncode == 0, done.stderr
    assert "PostgreSQL" not in done.stdout
    assert "pgbench" not in done.stdout


def test_a_failing_measurement_keeps_the_figures_measured_so_far(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import benchmarks.__main__ as bench

    async def broken(*args: object) -> None:
        raise OSError("disk full")

    monkeypatch.setattr(bench, "run_growth", broken)
    out = tmp_path / "bench.json"
    code = bench.main(
        ["--quick", "--no-postgres", "--sections", "floors", "growth", "--json", str(out)]
    )
    assert code == 1
    report = json.loads(out.read_text())
    assert "request check and hash (Dataoad)" in report["results"]  # measured before the failure
    assert report["results"]["growth: FAILED"] == "OSError: disk full"
    printed = capsys.readouterr().out
    assert "request check and hash (Dataoad)" in printed
    assert "growth: FAILED" in printed


async def test_the_structure_trace_follows_one_first_call_through_the_library() -> None:
    from benchmarks._structure import first_call_path, structure_figures

    path = await first_call_path()
    assert path[0] == "dataoad._runner"  # execute is where the call enters
    assert {"dataoad._attempts", "dataoad._proven", "dataoad.ledgers.memory"} <= set(path)
    assert all(module.startswith("dataoad") for module in path)
    assert all(a != b for a, b in itertools.pairwise(path))  # a stop is a change
    figures = await structure_figures()
    assert figures["first call: library modules entered, #40 (goal <= 8)"] == len(set(path))
    assert figures["first call: module changes along the way"] == len(path)


async def test_each_sqlite_layer_writes_what_a_first_call_writes(tmp_path: Path) -> None:
    # "ledger alone" and "Dataoad's statements" split the runner's, the
    # ledger's and the table's costs only if their two writes store what a
    # first call's store.
    from benchmarks._concurrency import (
        open_dataoad,
        open_ledger_alone,
        open_sqlite_statements,
        open_sqlite_statements_encoded_once,
    )
    from benchmarks.peers import Storage
    from dataoad import SQLiteLedger

    storage = Storage("sqlite", tmp_path, synchronous="FULL")
    layers = {
        "runner": (open_dataoad, "dataoad"),
        "alone": (open_ledger_alone, "dataoad"),
        "statements": (open_sqlite_statements, "statements"),
        "once": (open_sqlite_statements_encoded_once, "statements"),
    }
    stored = {}
    for name, (opener, file) in layers.items():
        session = await opener(storage, f"{name}-")
        await session.first(1)
        await session.first(2)
        await session.close()
        async with SQLiteLedger(tmp_path / f"{name}-{file}.sqlite3") as ledger:
            receipts = await ledger.receipts()
        assert len(receipts) == 2, name  # one receipt per call: each call wrote its own
        stored[name] = receipts[0]
    for name in ("alone", "statements", "once"):
        assert same_first_call(stored[name], stored["runner"]), name


async def test_dataoads_statements_on_aiosqlite_write_and_replay_what_a_first_call_does(
    tmp_path: Path,
) -> None:
    # The calls section divides the two-statement floor by this layer to say
    # what Dataoad's table and SQL cost: it must store what a first call does.
    from benchmarks._calls import open_aiosqlite_statements
    from benchmarks._concurrency import open_dataoad
    from benchmarks.peers import Storage
    from dataoad import SQLiteLedger

    storage = Storage("sqlite", tmp_path, synchronous="FULL")
    runner = await open_dataoad(storage, "runner-")
    await runner.first(1)
    await runner.close()
    layer = await open_aiosqlite_statements(storage, "layer-")  # writes call 0
    await layer.first(1)
    found = await layer.replay(0)
    await layer.close()
    async with SQLiteLedger(tmp_path / "runner-dataoad.sqlite3") as ledger:
        (expected,) = await ledger.receipts()
    async with SQLiteLedger(tmp_path / "layer-statements.sqlite3") as ledger:
        stored = await ledger.receipts()
    assert len(stored) == 2  # one receipt per call
    assert all(same_first_call(receipt, expected) for receipt in stored)
    assert len(found) == 1  # the replay's look-up finds call 0's receipt


def test_a_server_that_does_not_sync_is_flagged_and_one_that_does_is_not() -> None:
    from benchmarks._postgres import durability_verdict

    assert durability_verdict("on", "on").endswith("commits are durable")
    assert durability_verdict("on", "remote_apply").endswith("commits are durable")
    for fsync, synchronous_commit in (("off", "on"), ("on", "off"), ("off", "off")):
        verdict = durability_verdict(fsync, synchronous_commit)
        assert verdict.startswith(f"fsync={fsync}, synchronous_commit={synchronous_commit}")
        assert "NOT durable" in verdict


async def test_the_report_reads_the_servers_own_settings() -> None:
    # The suite's own server runs with fsync off (a DSN of the caller's may
    # not): whichever it is, the report states what the server says.
    import asyncpg

    from benchmarks._postgres import durability_verdict, server_durability
    from suite_support.services import postgres_dsn

    dsn = postgres_dsn()
    conn = await asyncpg.connect(dsn)
    try:  # read another way than the report reads them
        fsync, synchronous_commit = await conn.fetchrow(
            "SELECT current_setting('fsync'), current_setting('synchronous_commit')"
        )
    finally:
        await conn.close()
    verdict = await server_durability(dsn)
    assert verdict == durability_verdict(fsync, synchronous_commit)
    assert verdict.startswith(f"fsync={fsync}, synchronous_commit={synchronous_commit}: ")


async def test_the_call_with_no_runner_layers_writes_and_answers_what_execute_does(
    tmp_path: Path,
) -> None:
    # "no runner layers" stands for #40's hot path only if it does a first
    # call's and a replay's whole work, with nothing of the layers'.
    from benchmarks._calls import open_dataoad, open_no_layers
    from benchmarks.peers import Storage
    from dataoad import ActionStatus, ClaimState

    storage = Storage("memory", tmp_path)
    answers = {}
    for name, opener in (("runner", open_dataoad), ("bare", open_no_layers)):
        session = await opener(storage, f"{name}-")
        answers[name] = (await session.first(1), await session.replay(0))
        await session.close()
    (bare_first, bare_replay), (first, replay) = answers["bare"], answers["runner"]
    assert same_first_call(bare_first.receipt, first.receipt)
    assert bare_first.receipt.metadata == first.receipt.metadata
    assert bare_first.receipt.claim_state is ClaimState.COMPLETED
    assert bare_first.status is first.status is ActionStatus.CONFIRMED
    assert (bare_first.replayed, bare_first.value) == (first.replayed, first.value)
    assert bare_replay.replayed
    assert replay.replayed
    assert bare_replay.status is replay.status is ActionStatus.CONFIRMED


async def test_the_receipts_the_benchmarks_fill_in_are_old_enough_to_prune(tmp_path: Path) -> None:
    """The retention benchmark prunes receipts bulk-inserted as last changed on
    2026-01-01; prune judges age by ``stored_at``, which a bulk insert must set
    too (left unset, the benchmark pruned nothing and stopped)."""
    from datetime import UTC, datetime

    from benchmarks import _growth as growth
    from benchmarks import _postgres as pg
    from dataoad import ActionStatus
    from suite_support.services import PostgresTestTable

    before = datetime(2026, 6, 1, tzinfo=UTC)
    done = (ActionStatus.CONFIRMED, ActionStatus.FAILED)
    async with await growth.sqlite_with(tmp_path / "filled.sqlite3", 30) as ledger:
        assert await ledger.prune(completed_before=before, statuses=done) == 30
    table = PostgresTestTable()
    await table.create()
    try:
        async with table.client() as ledger:
            await pg.fill(ledger, 30, growth.filler_receipt)
            assert await ledger.prune(completed_before=before, statuses=done) == 30
    finally:
        await table.drop()
