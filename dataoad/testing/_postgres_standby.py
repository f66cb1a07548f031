"""A throwaway PostgreSQL primary with one streaming standby, for failover tests.

Both run Debian's server binaries on 127.0.0.1 with temporary data
directories, like ``PostgresServer``. The standby is a ``pg_basebackup`` of
the primary, streaming through one physical replication slot; with
``synchronous=True`` the primary names it in ``synchronous_standby_names``,
so every commit waits until the standby has flushed it. ``kill_primary()``
crashes the primary (SIGKILL: no shutdown checkpoint, nothing sent after);
``pause_replication()`` freezes the primary's WAL sender first, as a
partition would (an asynchronous primary goes on acknowledging);
``promote()`` makes the standby the new primary. ``dsn`` names both hosts
with ``target_session_attrs=read-write``, so a client finds whichever is
the primary.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import time
from types import TracebackType

from dataoad.testing._postgres_server import PostgresServer, PostgresUnavailableError

__all__ = ["ReplicatedPostgres", "StandbyServer"]

#: The standby's name: its ``cluster_name``, hence its ``application_name`` on the primary.
STANDBY_NAME = "standby1"


class StandbyServer(PostgresServer):
    """A streaming standby of ``primary``: its data directory is a base backup of it."""

    def __init__(self, primary: PostgresServer, *, max_connections: int = 100) -> None:
        super().__init__(
            durable=True,
            max_connections=max_connections,
            settings={"cluster_name": STANDBY_NAME, "hot_standby": "on"},
        )
        self.primary = primary

    def _initialise(self) -> None:
        # -R writes standby.signal and primary_conninfo; -C -S creates the slot.
        self._run(
            str(self.bindir / "pg_basebackup"),
            "-h",
            "127.0.0.1",
            "-p",
            str(self.primary.port),
            "-U",
            "postgres",
            "-D",
            str(self.datadir),
            "-R",
            "-C",
            "-S",
            STANDBY_NAME,
            "-X",
            "stream",
            "--no-sync",
        )


class ReplicatedPostgres:
    """A primary and its streaming standby; synchronous or asynchronous replication."""

    def __init__(self, *, synchronous: bool, max_connections: int = 100) -> None:
        self.synchronous = synchronous
        settings = {"wal_level": "replica", "max_wal_senders": "5", "max_replication_slots": "5"}
        if synchronous:
            settings["synchronous_standby_names"] = STANDBY_NAME
        self.primary = PostgresServer(
            durable=True, max_connections=max_connections, settings=settings
        )
        self.standby = StandbyServer(self.primary, max_connections=max_connections)
        self.promoted = False
        self._sender = 0

    @property
    def dsn(self) -> str:
        """Both hosts; the client connects to whichever accepts writes."""
        return (
            f"postgresql://postgres@127.0.0.1:{self.primary.port},127.0.0.1:{self.standby.port}"
            "/postgres?target_session_attrs=read-write"
        )

    def start(self) -> ReplicatedPostgres:
        """Start the primary, copy it into the standby, start that, and wait until it streams."""
        self.primary.start()
        self.standby.start()
        self.wait_streaming()
        return self

    def _query(self, server: PostgresServer, sql: str) -> str:
        psql = shutil.which("psql") or str(server.bindir / "psql")
        done = subprocess.run(
            [psql, "-h", "127.0.0.1", "-p", str(server.port), "-U", "postgres", "-AtXqc", sql],
            capture_output=True,
            text=True,
            check=False,
            timeout=30,
        )
        if done.returncode != 0:
            raise PostgresUnavailableError(f"psql failed: {done.stderr.strip()[-500:]}")
        return done.stdout.strip()

    def wait_streaming(self, timeout: float = 60.0) -> None:
        """Wait until the primary sees the standby streaming (and synchronous, if asked)."""
        wanted = "sync" if self.synchronous else "async"
        deadline = time.monotonic() + timeout
        state = ""
        while time.monotonic() < deadline:
            state = self._query(
                self.primary,
                "SELECT state || ':' || sync_state FROM pg_stat_replication "
                f"WHERE application_name = '{STANDBY_NAME}'",
            )
            if state == f"streaming:{wanted}":
                return
            time.sleep(0.1)
        raise PostgresUnavailableError(f"the standby never streamed ({state!r})")

    def pause_replication(self) -> None:
        """Freeze the primary's WAL sender (SIGSTOP), as a partition would: nothing more
        reaches the standby, and an asynchronous primary goes on acknowledging commits."""
        self._sender = int(
            self._query(
                self.primary,
                f"SELECT pid FROM pg_stat_replication WHERE application_name = '{STANDBY_NAME}'",
            )
        )
        os.kill(self._sender, signal.SIGSTOP)

    def kill_primary(self) -> None:
        """Crash the primary: SIGKILL, so nothing more reaches the standby (a frozen WAL
        sender is killed too, before it could send what it holds)."""
        if self._sender:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self._sender, signal.SIGKILL)
            self._sender = 0
        process, self.primary._process = self.primary._process, None
        if process is not None and process.poll() is None:
            process.send_signal(signal.SIGKILL)
            process.wait(timeout=30)

    def promote(self, timeout: float = 60.0) -> None:
        """Make the standby the primary, and wait until it accepts writes."""
        self.standby._run(
            str(self.standby.bindir / "pg_ctl"), "promote", "-D", str(self.standby.datadir), "-w"
        )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self._query(self.standby, "SELECT pg_is_in_recovery()") == "f":
                self.promoted = True
                return
            time.sleep(0.1)
        raise PostgresUnavailableError("the standby was not promoted in time")

    def cleanup(self) -> None:
        """Stop both servers (a killed primary's orphans too) and delete their data."""
        self.standby.cleanup()
        self.primary.cleanup()

    def __enter__(self) -> ReplicatedPostgres:
        try:
            return self.start()
        except BaseException:
            self.cleanup()
            raise

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.cleanup()
