"""``dataoad reopen``, ``dataoad receipts prune`` and ``--namespace``, run as an operator runs them."""

from __future__ import annotations

import argparse
import asyncio
import errno
import json
import os
import stat
from collections.abc import Iterator
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from dataoad import ActionRunner, ActionStatus, InvalidArgumentError, SQLiteLedger
from dataoad._cli_lifecycle import parse_age
from dataoad._receipt import utc_now
from dataoad.ledgers.sqlite_reader import SQLiteReader
from dataoad.testing import make_receipt
from dataoad.testing._contract_receipts import completed, started
from suite_support.cli import Store, as_nobody, dataoad, read_only_copy
from suite_support.services import PostgresTestTable

DAY = timedelta(days=1)


class _LedgerTime:
    """A ledger clock the fixture sets: receipts are aged by the ledger's own clock."""

    def __init__(self) -> None:
        self.now = utc_now()

    def __call__(self) -> datetime:
        return self.now


async def _put(
    ledger: Any,
    clock: _LedgerTime,
    key: str,
    status: ActionStatus | None,
    age: timedelta,
    ns: str = "",
) -> None:
    # The writer's own clock says "now": only the ledger's stamps are aged.
    clock.now = utc_now() - age
    at = utc_now()
    claim, created = await ledger.claim(
        make_receipt(idempotency_key=key, namespace=ns, created_at=at, updated_at=at)
    )
    assert created
    if status is not None:
        one = started(claim)
        assert await ledger.start_attempt(one)
        assert await ledger.record(completed(one, status))


@pytest.fixture(params=["sqlite", "postgres"])
def aged(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Store]:
    """Receipts 40 days old in every state, one day-old CONFIRMED, and a tenant's."""
    table: PostgresTestTable | None = None
    if request.param == "postgres":
        table = PostgresTestTable()
        asyncio.run(table.create())
        env = {"DATAOAD_LEDGER": table.dsn, "DATAOAD_LEDGER_TABLE": table.table}
    else:
        env = {"DATAOAD_LEDGER": f"sqlite:///{tmp_path / 'ledger.sqlite3'}"}

    async def build() -> None:
        clock = _LedgerTime()
        ledger = (
            table.client(clock=clock)
            if table is not None
            else SQLiteLedger(tmp_path / "ledger.sqlite3", clock=clock)
        )
        async with ledger:
            await _put(ledger, clock, "old-ok", ActionStatus.CONFIRMED, 40 * DAY)
            await _put(ledger, clock, "old-failed", ActionStatus.FAILED, 40 * DAY)
            await _put(ledger, clock, "old-unknown", ActionStatus.UNKNOWN, 40 * DAY)
            await _put(ledger, clock, "old-pending", None, 40 * DAY)
            await _put(ledger, clock, "young", ActionStatus.CONFIRMED, DAY)
            await _put(ledger, clock, "tenant-ok", ActionStatus.CONFIRMED, 40 * DAY, ns="tenant")

    asyncio.run(build())
    yield Store(env["DATAOAD_LEDGER"], env, tmp_path)
    if table is not None:
        asyncio.run(table.drop())


def keys(store: Store, *args: str) -> set[str]:
    done = dataoad("receipts", "list", "--json", *args, cwd=store.cwd, env=store.env)
    assert done.returncode == 0, done.stderr
    return {r["idempotency_key"] for r in json.loads(done.stdout)}


ALL = {"old-ok", "old-failed", "old-unknown", "old-pending", "young", "tenant-ok"}


def test_prune_dry_run_then_for_real_with_an_export(aged: Store) -> None:
    env, cwd = aged.env, aged.cwd
    dry = dataoad("receipts", "prune", "--older-than", "30d", "--dry-run", cwd=cwd, env=env)
    assert dry.returncode == 0, dry.stderr
    assert "would delete 3 confirmed,failed receipt(s)" in dry.stdout
    assert keys(aged) == ALL
    refused = dataoad("receipts", "prune", "--older-than", "30d", cwd=cwd, env=env)
    assert refused.returncode == 2
    assert "without --yes" in refused.stderr
    assert keys(aged) == ALL
    export = cwd / "pruned.jsonl"
    done = dataoad(
        "receipts", "prune", "--older-than", "30d", "--yes", "--export", str(export),
        "--batch-size", "2", cwd=cwd, env=env,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "deleted 3 receipt(s)" in done.stdout
    assert keys(aged) == {"old-unknown", "old-pending", "young"}
    lines = [json.loads(line) for line in export.read_text().splitlines()]
    assert {r["idempotency_key"] for r in lines} == {"old-ok", "old-failed", "tenant-ok"}
    assert {r["namespace"] for r in lines} == {"", "tenant"}
    assert all(r["claim_state"] == "COMPLETED" for r in lines)
    assert stat.S_IMODE(export.stat().st_mode) == 0o600
    # UNKNOWN only when named; PENDING never, whatever is named.
    unknown = dataoad(
        "receipts", "prune", "--older-than", "30d", "--status", "unknown", "--yes",
        cwd=cwd, env=env,
    )  # fmt: skip
    assert unknown.returncode == 0, unknown.stderr
    assert keys(aged) == {"old-pending", "young"}
    pending = dataoad(
        "receipts", "prune", "--older-than", "1s", "--status", "pending", "--yes",
        cwd=cwd, env=env,
    )  # fmt: skip
    assert pending.returncode == 2
    assert "never pruned" in pending.stderr
    assert keys(aged) == {"old-pending", "young"}


@pytest.mark.parametrize("aged", ["sqlite"], indirect=True)
def test_an_export_is_owner_only_never_through_a_link_and_its_failure_named(
    aged: Store,
) -> None:
    env, cwd = aged.env, aged.cwd
    prune = ("receipts", "prune", "--older-than", "30d", "--yes", "--batch-size", "1", "--export")
    # A link someone placed where the export goes is not followed.
    elsewhere = cwd / "elsewhere.jsonl"
    link = cwd / "link.jsonl"
    link.symlink_to(elsewhere)
    through_link = dataoad(*prune, str(link), cwd=cwd, env=env)
    assert through_link.returncode == 1
    assert through_link.stderr.startswith(f"dataoad receipts: error: --export {link}: ")
    assert not elsewhere.exists()
    assert keys(aged) == ALL
    # A file that was there already is made owner-only before a receipt goes in.
    existing = cwd / "existing.jsonl"
    existing.write_text("")
    existing.chmod(0o644)
    done = dataoad(*prune, str(existing), cwd=cwd, env=env)
    assert done.returncode == 0, done.stderr
    assert stat.S_IMODE(existing.stat().st_mode) == 0o600
    assert len(existing.read_text().splitlines()) == 3


async def test_an_export_that_cannot_be_written_is_named_and_deletes_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from dataoad._cli_common import CommandError
    from dataoad._cli_lifecycle import _Export

    path = tmp_path / "ledger.sqlite3"
    async with SQLiteLedger(path) as ledger:
        runner = ActionRunner(ledger)
        for n in range(3):
            await runner.execute("charge", lambda: "ok", request={"n": n}, idempotency_key=f"k{n}")
        export = _Export(tmp_path / "pruned.jsonl")

        def disk_full(fd: int) -> None:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

        monkeypatch.setattr(os, "fsync", disk_full)
        with pytest.raises(CommandError) as failed:
            await ledger.prune(older_than=0, before_delete=export)
        export.close()
        assert str(failed.value) == (
            f"--export {tmp_path / 'pruned.jsonl'}: No space left on device; "
            "this batch was not deleted"
        )
        assert len(await ledger.receipts()) == 3
        (record,) = await ledger.audit()
        assert record.outcome.startswith("failed: CommandError after deleting 0 ")


def test_prune_in_one_namespace_and_bad_ages(aged: Store) -> None:
    env, cwd = aged.env, aged.cwd
    done = dataoad(
        "receipts", "prune", "--older-than", "4w", "--namespace", "tenant", "--yes",
        cwd=cwd, env=env,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "deleted 1 receipt(s) in namespace 'tenant'" in done.stdout
    assert keys(aged) == ALL - {"tenant-ok"}
    for age in ("30", "thirty days", "-3d", "0d", "1y"):
        bad = dataoad("receipts", "prune", "--older-than", age, "--yes", cwd=cwd, env=env)
        assert bad.returncode == 2, age
        assert "age" in bad.stderr or "more than 0" in bad.stderr
    assert keys(aged) == ALL - {"tenant-ok"}


def test_list_and_show_by_namespace(aged: Store) -> None:
    env, cwd = aged.env, aged.cwd
    assert keys(aged, "--namespace", "tenant") == {"tenant-ok"}
    assert keys(aged, "--namespace", "") == ALL - {"tenant-ok"}
    table = dataoad("receipts", "list", cwd=cwd, env=env)
    assert "NAMESPACE" in table.stdout
    shown = dataoad("receipts", "show", "--key", "tenant-ok", cwd=cwd, env=env)
    assert shown.returncode == 0, shown.stderr
    assert "namespace            tenant" in shown.stdout
    missing = dataoad(
        "receipts", "show", "--key", "tenant-ok", "--namespace", "other", cwd=cwd, env=env
    )
    assert missing.returncode == 1
    bad = dataoad("receipts", "list", "--namespace", "a\udcff", cwd=cwd, env=env)
    assert bad.returncode == 2


def test_reopen_a_definitive_failure_only(aged: Store) -> None:
    env, cwd = aged.env, aged.cwd

    def action_id(key: str) -> str:
        done = dataoad("receipts", "list", "--json", cwd=cwd, env=env)
        rows: list[dict[str, Any]] = json.loads(done.stdout)
        found: str = next(r["action_id"] for r in rows if r["idempotency_key"] == key)
        return found

    failed = action_id("old-failed")
    asked = dataoad("reopen", failed, cwd=cwd, env=env)
    assert asked.returncode == 2
    done = dataoad("reopen", failed, "--yes", cwd=cwd, env=env)
    assert done.returncode == 0, done.stderr
    assert "is free again" in done.stdout
    assert "retired_at" in done.stdout
    shown = dataoad("receipts", "show", failed, "--json", cwd=cwd, env=env)
    assert json.loads(shown.stdout)["retired_at"] is not None
    for key in ("old-ok", "old-unknown", "old-pending"):
        refused = dataoad("reopen", action_id(key), "--yes", cwd=cwd, env=env)
        assert refused.returncode == 1, key
        assert "only a definitive FAILED receipt can be reopened" in refused.stderr
        assert len(refused.stderr.strip().splitlines()) == 1
    # A second reopen changes nothing, and says so instead of "reopened" again.
    twice = dataoad("reopen", failed, "--yes", cwd=cwd, env=env)
    assert twice.returncode == 0, twice.stderr
    assert "already gave up its key" in twice.stdout
    assert "nothing changed" in twice.stdout
    assert "reopened" not in twice.stdout
    assert (
        json.loads(dataoad("receipts", "show", failed, "--json", cwd=cwd, env=env).stdout)[
            "retired_at"
        ]
        == json.loads(shown.stdout)["retired_at"]
    )
    tenant = action_id("tenant-ok")
    elsewhere = dataoad("reopen", tenant, "--namespace", "", "--yes", cwd=cwd, env=env)
    assert elsewhere.returncode == 1
    assert "no action" in elsewhere.stderr


def test_prune_speaks_json(aged: Store) -> None:
    env, cwd = aged.env, aged.cwd
    dry = dataoad(
        "receipts", "prune", "--older-than", "30d", "--dry-run", "--json", cwd=cwd, env=env
    )
    assert dry.returncode == 0, dry.stderr
    seen = json.loads(dry.stdout)
    assert seen["dry_run"] is True
    assert seen["deleted"] == 0
    assert seen["matching"] >= 1
    done = dataoad("receipts", "prune", "--older-than", "30d", "--yes", "--json", cwd=cwd, env=env)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["deleted"] == seen["matching"]
    again = dataoad("receipts", "prune", "--older-than", "30d", "--yes", "--json", cwd=cwd, env=env)
    assert json.loads(again.stdout)["matching"] == 0


@pytest.mark.parametrize("aged", ["sqlite"], indirect=True)
def test_a_prune_dry_run_needs_only_read_access(aged: Store) -> None:
    # Like list and show, a dry run is an operator's look: it must work for
    # someone who may only read the file, and write nothing (no lock file).
    with read_only_copy(aged.cwd / "ledger.sqlite3") as db:
        folder = db.parent
        argv = ["receipts", "prune", "--ledger", str(db), "--older-than", "30d"]
        dry = as_nobody([*argv, "--status", "unknown", "--dry-run"], folder)
        assert dry.returncode == 0, dry.stderr
        assert "would delete 1 unknown receipt(s)" in dry.stdout
        assert sorted(p.name for p in folder.iterdir()) == ["ledger.sqlite3"]
        # Deleting needs write access, and says so.
        real = as_nobody([*argv, "--yes"], folder)
        assert real.returncode == 1
        assert "no read and write permission" in real.stderr
        assert "corrupt" not in real.stderr
        assert sorted(p.name for p in folder.iterdir()) == ["ledger.sqlite3"]


async def test_a_reader_counts_what_a_prune_would_delete_and_deletes_nothing(
    tmp_path: Path,
) -> None:
    path = tmp_path / "ledger.sqlite3"
    clock = _LedgerTime()
    async with SQLiteLedger(path, clock=clock) as ledger:
        await _put(ledger, clock, "old-ok", ActionStatus.CONFIRMED, 40 * DAY)
        await _put(ledger, clock, "old-unknown", ActionStatus.UNKNOWN, 40 * DAY)
        await _put(ledger, clock, "tenant-ok", ActionStatus.CONFIRMED, 40 * DAY, ns="tenant")
        await _put(ledger, clock, "young", ActionStatus.CONFIRMED, DAY)
        await _put(ledger, clock, "old-pending", None, 40 * DAY)
    cut = utc_now() - 30 * DAY
    reader = SQLiteReader(path)
    try:
        assert await reader.prune(completed_before=cut) == 2
        assert await reader.prune(completed_before=cut, namespace="tenant") == 1
        unknown = await reader.prune(completed_before=cut, statuses=[ActionStatus.UNKNOWN])
        assert unknown == 1
        assert await reader.prune(completed_before=cut, batch_size=1) == 2
        with pytest.raises(InvalidArgumentError, match="deletes nothing"):
            await reader.prune(completed_before=cut, dry_run=False)
        with pytest.raises(InvalidArgumentError):
            await reader.prune(
                completed_before=cut,
                statuses=["pending"],  # type: ignore[list-item]
            )
        assert len(await reader.receipts()) == 5
    finally:
        await reader.close()


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("90s", 90), ("90m", 5_400), ("12h", 43_200), ("30d", 2_592_000), ("2w", 1_209_600)],
)
def test_every_age_unit_means_what_the_docs_say(text: str, seconds: int) -> None:
    assert parse_age(text) == timedelta(seconds=seconds)


def test_an_age_of_a_hundred_years_is_accepted_and_a_second_more_refused() -> None:
    hundred_years = 100 * 365 * 86_400
    assert parse_age(f"{hundred_years}s") == timedelta(seconds=hundred_years)
    for past in (f"{hundred_years + 1}s", "0s", "0d"):
        with pytest.raises(argparse.ArgumentTypeError):
            parse_age(past)
