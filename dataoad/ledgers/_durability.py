"""Whether a ledger keeps what it acknowledged: through a crash, a power loss or a failover.

A claim the ledger acknowledged and then lost is the double charge Dataoad
exists to prevent: the next caller claims the key afresh and invokes again.
Each backend reads its settings here and one rule per setting judges them;
every reason names what to set. ``DurabilityReport.safe`` is False when any
acknowledged claim could be lost, and when the settings could not be read
(the doctor never guesses "safe").
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Awaitable, Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, Final

from dataoad._errors import LedgerDurabilityError

__all__ = [
    "DurabilityReport",
    "judge_memory",
    "judge_postgres",
    "judge_sqlite",
    "opened",
    "postgres_durability",
    "sqlite_durability",
]

#: SQLite journal modes that keep a committed transaction (the issue's rule: WAL or DELETE).
SQLITE_JOURNALS: Final = ("wal", "delete")
#: ``PRAGMA synchronous`` values, by number.
SQLITE_SYNCHRONOUS: Final = {0: "OFF", 1: "NORMAL", 2: "FULL", 3: "EXTRA"}
#: File systems whose contents a reboot loses.
VOLATILE_FILE_SYSTEMS: Final = frozenset({"tmpfs", "ramfs", "devtmpfs"})
#: File systems on which SQLite's locks and fsync are not to be trusted.
NETWORK_FILE_SYSTEMS: Final = frozenset(
    {"nfs", "nfs4", "cifs", "smb3", "smbfs", "9p", "fuse.sshfs", "glusterfs", "ceph", "afs"}
)
#: ``pg_stat_replication.sync_state`` values whose standby confirms each commit.
SYNCHRONOUS_STATES: Final = frozenset({"sync", "quorum"})


@dataclasses.dataclass(frozen=True)
class DurabilityReport:
    """What a ledger does with an acknowledged claim, and why it is (not) safe.

    ``safe``: no acknowledged claim can be lost by a crash, a power loss or a
    failover. ``reasons``: each way it could be, with what to set.
    ``settings``: what was read (for PostgreSQL ``synchronous_commit``,
    ``fsync``, ``full_page_writes``, the standbys; for SQLite the journal
    mode, ``synchronous`` and the file system).
    """

    backend: str
    safe: bool
    reasons: tuple[str, ...]
    settings: Mapping[str, Any]

    def to_json(self) -> dict[str, Any]:
        """A JSON object of the report."""
        return {
            "backend": self.backend,
            "safe": self.safe,
            "reasons": list(self.reasons),
            "settings": dict(self.settings),
        }


def _report(backend: str, reasons: Sequence[str], settings: Mapping[str, Any]) -> DurabilityReport:
    return DurabilityReport(backend, not reasons, tuple(reasons), dict(settings))


def judge_postgres(settings: Mapping[str, Any]) -> DurabilityReport:
    """The report for PostgreSQL settings as ``postgres_durability`` reads them."""
    reasons: list[str] = []
    commit = str(settings.get("synchronous_commit", "")).lower()
    standbys: Sequence[Mapping[str, Any]] = settings.get("standbys", ())
    synchronous = [s for s in standbys if str(s.get("sync_state")).lower() in SYNCHRONOUS_STATES]
    if settings.get("in_recovery"):
        reasons.append(
            "the ledger is connected to a standby (in recovery), which cannot take a claim: "
            "connect to the primary (target_session_attrs=read-write in the DSN)"
        )
    if str(settings.get("fsync", "")).lower() != "on":
        reasons.append(
            "fsync is off: a crash of the server or its host can lose or corrupt committed "
            "claims; set fsync = on"
        )
    if str(settings.get("full_page_writes", "")).lower() != "on":
        reasons.append(
            "full_page_writes is off: a crash in the middle of a page write can corrupt "
            "committed claims; set full_page_writes = on"
        )
    if commit == "off":
        reasons.append(
            "synchronous_commit is off: a claim is acknowledged before it is on disk, and a "
            "crash loses it; set synchronous_commit = on"
        )
    elif commit == "local" and standbys:
        reasons.append(
            "synchronous_commit is local while standbys exist: a claim is acknowledged before "
            "any standby has it, and a failover loses it; set synchronous_commit = on (or "
            "remote_apply)"
        )
    if settings.get("standbys_unreadable"):
        reasons.append(
            "the standbys' synchronous state could not be read (pg_stat_replication needs the "
            "pg_monitor role): grant pg_monitor to the ledger's role so this can be checked"
        )
    elif standbys and not synchronous:
        names = ", ".join(str(s.get("application_name") or "?") for s in standbys)
        reasons.append(
            f"{len(standbys)} standby(s) ({names}), none synchronous: a failover to one can "
            "lose acknowledged claims; set synchronous_standby_names (for example "
            f"'ANY 1 ({names})') so every commit waits for a standby"
        )
    return _report("postgresql", reasons, settings)


def judge_memory() -> DurabilityReport:
    """The in-memory ledger's report: nothing it acknowledged survives the process."""
    return _report(
        "memory",
        [
            "the receipts are held in this process's memory: its exit or crash loses every one; "
            "use SQLiteLedger or PostgresLedger"
        ],
        {},
    )


def judge_sqlite(settings: Mapping[str, Any]) -> DurabilityReport:
    """The report for SQLite settings as ``sqlite_durability`` reads them."""
    reasons: list[str] = []
    journal = str(settings.get("journal_mode", "")).lower()
    if journal not in SQLITE_JOURNALS:
        reasons.append(
            f"journal_mode is {journal or 'unknown'}: a crash can lose or corrupt committed "
            "claims; use WAL (what SQLiteLedger sets) or DELETE"
        )
    synchronous = settings.get("synchronous")
    if synchronous not in ("FULL", "EXTRA"):
        reasons.append(
            f"synchronous is {synchronous}: a power loss can lose the last acknowledged claims; "
            "use synchronous='FULL' (SQLiteLedger's default)"
        )
    file_system = settings.get("file_system")
    if file_system in VOLATILE_FILE_SYSTEMS:
        reasons.append(
            f"the ledger file is on {file_system}, which a reboot empties: put it on a disk"
        )
    elif file_system in NETWORK_FILE_SYSTEMS:
        reasons.append(
            f"the ledger file is on {file_system}: SQLite's locks and fsync are not reliable on "
            "a network file system; put it on a local disk, or use PostgreSQL"
        )
    return _report("sqlite", reasons, settings)


def file_system_of(path: Path, mounts: str = "/proc/mounts") -> str | None:
    """The type of the file system holding ``path`` (Linux; None where it cannot be read)."""
    try:
        lines = Path(mounts).read_text(encoding="utf-8", errors="replace").splitlines()
    except OSError:
        return None
    target = os.path.realpath(path)
    best: tuple[int, str] | None = None
    for line in lines:
        fields = line.split()
        if len(fields) < 3:
            continue
        point = fields[1].replace("\\040", " ")
        inside = target == point or target.startswith(point.rstrip("/") + "/")
        if inside and (best is None or len(point) > best[0]):
            best = (len(point), fields[2])
    return None if best is None else best[1]


async def sqlite_durability(
    read: Callable[[str], Awaitable[list[Any]]], path: Path
) -> DurabilityReport:
    """Read a SQLite ledger's journal mode, ``synchronous`` and file system, and judge them."""
    journal = (await read("PRAGMA journal_mode"))[0][0]
    level = (await read("PRAGMA synchronous"))[0][0]
    return judge_sqlite(
        {
            "journal_mode": str(journal).lower(),
            "synchronous": SQLITE_SYNCHRONOUS.get(int(level), str(level)),
            "file_system": file_system_of(path),
            "path": str(path),
        }
    )


async def postgres_durability(read: Callable[[str], Awaitable[list[Any]]]) -> DurabilityReport:
    """Read the server's durability settings and standbys, and judge them."""
    row = (
        await read(
            "SELECT current_setting('synchronous_commit'), current_setting('fsync'), "
            "current_setting('full_page_writes'), current_setting('synchronous_standby_names'), "
            "pg_is_in_recovery(), current_setting('server_version')"
        )
    )[0]
    settings: dict[str, Any] = {
        "synchronous_commit": row[0],
        "fsync": row[1],
        "full_page_writes": row[2],
        "synchronous_standby_names": row[3],
        "in_recovery": bool(row[4]),
        "server_version": row[5],
    }
    standbys = await read(
        "SELECT application_name, state, sync_state FROM pg_stat_replication "
        "WHERE state IS DISTINCT FROM 'backup'"
    )
    settings["standbys"] = [
        {"application_name": r[0], "state": r[1], "sync_state": r[2]} for r in standbys
    ]
    # Without pg_monitor (or superuser) the rows are there but their states are not.
    settings["standbys_unreadable"] = any(r[2] is None for r in standbys)
    return judge_postgres(settings)


async def opened(ledger: Any, require_durable: bool) -> Any:
    """``ledger``, connected; with ``require_durable``, LedgerDurabilityError (and closed)
    unless its ``durability()`` report is safe."""
    try:
        await ledger.__aenter__()
        if require_durable:
            report = await ledger.durability()
            if not report.safe:
                raise LedgerDurabilityError(
                    "the ledger is not durable: " + "; ".join(report.reasons), report=report
                )
    except BaseException:
        await ledger.close()
        raise
    return ledger
