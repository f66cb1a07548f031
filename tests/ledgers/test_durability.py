"""``ledger.durability()``, ``require_durable`` and ``dataoad ledger doctor``: every rule on
both sides, on real SQLite files and real PostgreSQL servers (one durable, one with fsync off)."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from dataoad import (
    DurabilityReport,
    InMemoryLedger,
    LedgerDurabilityError,
    LedgerUnusableError,
    PostgresLedger,
    SQLiteLedger,
)
from dataoad.ledgers import _durability
from dataoad.ledgers._durability import file_system_of, judge_postgres, judge_sqlite
from suite_support.services import unavailable

SAFE_PG: dict[str, Any] = {
    "synchronous_commit": "on",
    "fsync": "on",
    "full_page_writes": "on",
    "in_recovery": False,
    "standbys": [],
    "standbys_unreadable": False,
}
SYNC = {"application_name": "s1", "state": "streaming", "sync_state": "sync"}
ASYNC = {"application_name": "s2", "state": "streaming", "sync_state": "async"}


def pg(**changes: Any) -> DurabilityReport:
    return judge_postgres({**SAFE_PG, **changes})


@pytest.mark.parametrize(
    ("changes", "safe", "says"),
    [
        ({}, True, None),
        ({"fsync": "off"}, False, "set fsync = on"),
        ({"full_page_writes": "off"}, False, "set full_page_writes = on"),
        ({"synchronous_commit": "off"}, False, "set synchronous_commit = on"),
        ({"synchronous_commit": "local"}, True, None),  # no standby to lose it to
        ({"synchronous_commit": "local", "standbys": [SYNC]}, False, "synchronous_commit is local"),
        ({"synchronous_commit": "remote_apply", "standbys": [SYNC]}, True, None),
        ({"synchronous_commit": "remote_write", "standbys": [SYNC]}, True, None),
        ({"standbys": [ASYNC]}, False, "none synchronous"),
        ({"standbys": [ASYNC, {**SYNC, "sync_state": "quorum"}]}, True, None),
        ({"standbys": [ASYNC, SYNC]}, True, None),
        ({"standbys": [{**SYNC, "sync_state": "potential"}]}, False, "none synchronous"),
        (
            {"standbys": [{**SYNC, "sync_state": None}], "standbys_unreadable": True},
            False,
            "pg_monitor",
        ),
        ({"in_recovery": True}, False, "target_session_attrs=read-write"),
    ],
)
def test_every_postgres_rule_on_both_sides(
    changes: dict[str, Any], safe: bool, says: str | None
) -> None:
    report = pg(**changes)
    assert report.safe is safe, report.reasons
    assert bool(report.reasons) is not safe
    if says is not None:
        assert any(says in r for r in report.reasons), report.reasons


def test_each_unsafe_setting_gives_its_own_reason() -> None:
    report = pg(fsync="off", full_page_writes="off", synchronous_commit="off", standbys=[ASYNC])
    assert len(report.reasons) == 4


@pytest.mark.parametrize(
    ("journal", "synchronous", "file_system", "safe"),
    [
        ("wal", "FULL", "ext4", True),
        ("delete", "FULL", "xfs", True),
        ("wal", "EXTRA", None, True),  # the file system could not be read: not held against it
        ("wal", "NORMAL", "ext4", False),
        ("wal", "OFF", "ext4", False),
        ("truncate", "FULL", "ext4", False),
        ("persist", "FULL", "ext4", False),
        ("memory", "FULL", "ext4", False),
        ("off", "FULL", "ext4", False),
        ("wal", "FULL", "tmpfs", False),
        ("wal", "FULL", "nfs4", False),
        ("wal", "FULL", "fuse.sshfs", False),
    ],
)
def test_every_sqlite_rule_on_both_sides(
    journal: str, synchronous: str, file_system: str | None, safe: bool
) -> None:
    report = judge_sqlite(
        {"journal_mode": journal, "synchronous": synchronous, "file_system": file_system}
    )
    assert report.safe is safe, report.reasons
    assert len(report.reasons) == (0 if safe else 1)


def test_the_file_system_is_the_longest_mount_point_holding_the_file(tmp_path: Path) -> None:
    mounts = tmp_path / "mounts"
    mounts.write_text(
        "/dev/vda / ext4 rw 0 0\n"
        "tmpfs /srv/fast tmpfs rw 0 0\n"
        "server:/x /srv/fast\\040share nfs4 rw 0 0\n"
        "tmpfs /srv/fastx tmpfs rw 0 0\n"
    )
    assert file_system_of(Path("/srv/fast/ledger.db"), str(mounts)) == "tmpfs"
    assert file_system_of(Path("/srv/fast share/ledger.db"), str(mounts)) == "nfs4"
    assert file_system_of(Path("/srv/fastlane/ledger.db"), str(mounts)) == "ext4"
    assert file_system_of(Path("/x"), str(tmp_path / "missing")) is None


async def test_a_sqlite_ledger_reads_its_own_settings(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(_durability, "file_system_of", lambda path: "ext4")
    async with SQLiteLedger(tmp_path / "full.sqlite3") as ledger:
        report = await ledger.durability()
    assert report.safe, report.reasons
    assert report.settings["journal_mode"] == "wal"
    assert report.settings["synchronous"] == "FULL"
    async with SQLiteLedger(tmp_path / "normal.sqlite3", synchronous="NORMAL") as ledger:
        report = await ledger.durability()
    assert not report.safe
    assert report.settings["synchronous"] == "NORMAL"
    monkeypatch.setattr(_durability, "file_system_of", lambda path: "tmpfs")
    async with SQLiteLedger(tmp_path / "full.sqlite3") as ledger:
        assert "a reboot empties" in (await ledger.durability()).reasons[0]


async def test_require_durable_refuses_an_unsafe_sqlite_ledger_and_closes_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(_durability, "file_system_of", lambda path: "ext4")
    with pytest.raises(LedgerDurabilityError, match="synchronous is NORMAL") as info:
        await SQLiteLedger.open(tmp_path / "l.sqlite3", synchronous="NORMAL", require_durable=True)
    assert isinstance(info.value, LedgerUnusableError)
    assert info.value.report.safe is False
    ledger = await SQLiteLedger.open(tmp_path / "l.sqlite3", require_durable=True)
    try:
        assert (await ledger.durability()).safe
    finally:
        await ledger.close()
    # Without require_durable an unsafe ledger opens (the check is the caller's to ask for).
    unsafe = await SQLiteLedger.open(tmp_path / "l.sqlite3", synchronous="NORMAL")
    await unsafe.close()


async def test_the_memory_ledger_is_never_durable() -> None:
    report = await InMemoryLedger().durability()
    assert not report.safe
    assert "memory" in report.reasons[0]


# -- real PostgreSQL servers -------------------------------------------------------


@pytest.fixture(scope="module")
def servers() -> Iterator[dict[str, str]]:
    """Two throwaway servers: one durable, one with fsync and full_page_writes off."""
    from dataoad.testing._postgres_server import PostgresServer, PostgresUnavailableError

    started = []
    try:
        for durable in (True, False):
            server = PostgresServer(durable=durable, max_connections=20)
            server.guard_against_abandonment()
            started.append(server.start())
    except (PostgresUnavailableError, OSError) as exc:
        for server in started:
            server.cleanup()
        unavailable(f"PostgreSQL unavailable: {exc}")
    yield {"durable": started[0].dsn, "fast": started[1].dsn}
    for server in started:
        server.cleanup()


async def test_a_durable_server_is_safe_until_a_session_lowers_synchronous_commit(
    servers: dict[str, str],
) -> None:
    async with PostgresLedger(servers["durable"], min_size=1, max_size=1) as ledger:
        report = await ledger.durability()
    assert report.safe, report.reasons
    assert report.settings["fsync"] == "on"
    assert report.settings["standbys"] == []
    # asyncpg passes unknown DSN parameters on as the session's settings.
    lowered = servers["durable"] + "?synchronous_commit=off"
    async with PostgresLedger(lowered, min_size=1, max_size=1) as ledger:
        report = await ledger.durability()
    assert not report.safe
    assert report.settings["synchronous_commit"] == "off"
    local = servers["durable"] + "?synchronous_commit=local"
    async with PostgresLedger(local, min_size=1, max_size=1) as ledger:
        assert (await ledger.durability()).safe  # no standby exists to fail over to


async def test_require_durable_refuses_a_server_with_fsync_off_and_writes_nothing(
    servers: dict[str, str],
) -> None:
    with pytest.raises(LedgerDurabilityError, match="fsync is off") as info:
        await PostgresLedger.open(servers["fast"], require_durable=True, table="t_refused")
    assert "full_page_writes" in " ".join(info.value.report.reasons)
    probe = PostgresLedger(servers["fast"], table="t_refused", min_size=1, max_size=1)
    try:
        assert await probe.schema_version() is None  # nothing was created
    finally:
        await probe.close()
    ledger = await PostgresLedger.open(servers["durable"], require_durable=True)
    await ledger.close()


def doctor(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "dataoad", "ledger", "doctor", *args],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_the_doctor_on_safe_and_unsafe_servers(servers: dict[str, str]) -> None:
    safe = doctor("--ledger", servers["durable"])
    assert safe.returncode == 0, safe.stderr
    assert "durable: every acknowledged claim survives" in safe.stdout
    unsafe = doctor("--ledger", servers["fast"])
    assert unsafe.returncode == 1
    assert "NOT durable" in unsafe.stdout
    assert "set fsync = on" in unsafe.stdout
    assert "set full_page_writes = on" in unsafe.stdout
    report = json.loads(doctor("--ledger", servers["fast"], "--json").stdout)
    assert report["safe"] is False
    assert report["settings"]["fsync"] == "off"
    assert len(report["reasons"]) == 2


@pytest.mark.parametrize(
    ("url", "code", "says"),
    [
        ("postgresql://[bad", 2, "not a usable PostgreSQL URL"),
        ("mysql://host/db", 2, "unsupported ledger URL scheme"),
        ("postgresql://postgres@127.0.0.1:1/x", 1, "cannot reach the ledger"),
        (
            "postgresql://postgres@127.0.0.1:1,127.0.0.1:2/x?target_session_attrs=read-write",
            1,
            "cannot reach the ledger",
        ),
    ],
)
def test_the_doctor_gives_one_line_errors(url: str, code: int, says: str) -> None:
    done = doctor("--ledger", url)
    assert done.returncode == code, done.stderr
    assert says in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert done.stdout == ""


def test_the_doctor_on_sqlite_files_reads_without_writing(tmp_path: Path) -> None:
    missing = doctor("--ledger", str(tmp_path / "none.sqlite3"))
    assert missing.returncode == 1
    assert "no ledger file" in missing.stderr
    assert not (tmp_path / "none.sqlite3").exists()
    table = doctor("--ledger", str(tmp_path / "none.sqlite3"), "--table", "x")
    assert table.returncode == 2

    async def make(path: Path) -> None:
        async with SQLiteLedger(path):
            pass

    ledger = tmp_path / "ledger.sqlite3"
    asyncio.run(make(ledger))
    before = ledger.read_bytes()
    done = doctor("--ledger", f"sqlite:///{ledger}", "--json")
    report = json.loads(done.stdout)
    assert report["settings"]["journal_mode"] == "wal"
    assert report["settings"]["synchronous"] == "FULL"
    assert report["settings"]["file_system"] == file_system_of(ledger)
    assert done.returncode == (0 if report["safe"] else 1)
    assert ledger.read_bytes() == before


def test_the_doctor_says_a_ledger_on_tmpfs_is_not_durable(tmp_path: Path) -> None:
    shm = Path("/dev/shm")
    if file_system_of(shm) != "tmpfs":
        pytest.fail("this test needs /dev/shm on tmpfs (Linux)")
    folder = shm / f"dataoad-{tmp_path.name}"
    folder.mkdir()
    try:

        async def make() -> None:
            async with SQLiteLedger(folder / "ledger.sqlite3"):
                pass

        asyncio.run(make())
        done = doctor("--ledger", str(folder / "ledger.sqlite3"))
        assert done.returncode == 1
        assert "tmpfs, which a reboot empties" in done.stdout
    finally:
        for item in folder.iterdir():
            item.unlink()
        folder.rmdir()
