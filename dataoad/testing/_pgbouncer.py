"""A throwaway PgBouncer (Debian's ``pgbouncer``) in transaction pooling mode, for tests.

It listens on 127.0.0.1 in front of one PostgreSQL server, trusts local
connections like the throwaway servers, and hands each transaction whatever
server connection is free: exactly what breaks a client that keeps state in
a session (a named prepared statement, a ``SET``). It refuses no startup
parameter a test sets on purpose (``ignore_startup_parameters`` lists them),
so the contract tests' isolation settings reach PgBouncer and are dropped
there, as they would be in production.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from types import TracebackType
from urllib.parse import urlsplit

from dataoad.testing._postgres_server import PostgresUnavailableError, _free_port, _server_user

__all__ = ["PgBouncer", "find_pgbouncer"]


def find_pgbouncer() -> str | None:
    """The ``pgbouncer`` binary (Debian installs it in /usr/sbin), or None."""
    return shutil.which("pgbouncer") or (
        "/usr/sbin/pgbouncer" if Path("/usr/sbin/pgbouncer").exists() else None
    )


class PgBouncer:
    """PgBouncer in transaction mode in front of the server at ``upstream_dsn``."""

    def __init__(self, upstream_dsn: str, *, pool_size: int = 20) -> None:
        binary = find_pgbouncer()
        if binary is None:
            raise PostgresUnavailableError(
                "pgbouncer not found (install Debian's 'pgbouncer' package)"
            )
        upstream = urlsplit(upstream_dsn)
        self.upstream_host = upstream.hostname or "127.0.0.1"
        self.upstream_port = upstream.port or 5432
        self.binary = binary
        self.pool_size = pool_size
        self.port = _free_port()
        self.user = _server_user()
        self._root = Path(tempfile.mkdtemp(prefix="dataoad-pgbouncer-"))
        self._process: subprocess.Popen[bytes] | None = None

    @property
    def dsn(self) -> str:
        """The DSN a client uses to go through PgBouncer."""
        return f"postgresql://postgres@127.0.0.1:{self.port}/postgres"

    def _write_config(self) -> None:
        (self._root / "users.txt").write_text('"postgres" ""\n')
        (self._root / "pgbouncer.ini").write_text(
            "[databases]\n"
            f"* = host={self.upstream_host} port={self.upstream_port}\n"
            "[pgbouncer]\n"
            "listen_addr = 127.0.0.1\n"
            f"listen_port = {self.port}\n"
            "unix_socket_dir =\n"
            "auth_type = trust\n"
            f"auth_file = {self._root / 'users.txt'}\n"
            "pool_mode = transaction\n"
            "max_client_conn = 500\n"
            f"default_pool_size = {self.pool_size}\n"
            # A test restarts servers: try a failed login again after 1 s, not 15 s.
            "server_login_retry = 1\n"
            "ignore_startup_parameters = extra_float_digits,default_transaction_isolation\n"
            f"logfile = {self._root / 'pgbouncer.log'}\n"
        )

    def start(self) -> PgBouncer:
        """Write the configuration, start PgBouncer, wait until it accepts connections."""
        self._write_config()
        command = [self.binary, str(self._root / "pgbouncer.ini")]
        if self.user is not None:
            # PgBouncer will not run as root.
            os.chown(self._root, self.user.pw_uid, self.user.pw_gid)
            for item in self._root.iterdir():
                os.chown(item, self.user.pw_uid, self.user.pw_gid)
            command[1:1] = ["-u", self.user.pw_name]
        self._process = subprocess.Popen(
            command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=self._root
        )
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if self._process.poll() is not None:
                raise PostgresUnavailableError(f"pgbouncer exited: {self.log_tail()}")
            with socket.socket() as probe:
                if probe.connect_ex(("127.0.0.1", self.port)) == 0:
                    return self
            time.sleep(0.05)
        raise PostgresUnavailableError(f"pgbouncer did not start: {self.log_tail()}")

    def repoint(self, upstream_dsn: str) -> None:
        """Send new transactions to another server (a promoted standby), as an operator's
        failover script does: rewrite the configuration and reload it (SIGHUP).

        PgBouncer closes its connections to the old server and opens new ones
        to this one; clients stay connected to PgBouncer throughout.
        """
        upstream = urlsplit(upstream_dsn)
        self.upstream_host = upstream.hostname or "127.0.0.1"
        self.upstream_port = upstream.port or 5432
        self._write_config()
        if self.user is not None:
            for item in self._root.iterdir():
                os.chown(item, self.user.pw_uid, self.user.pw_gid)
        if self._process is None or self._process.poll() is not None:
            raise PostgresUnavailableError("pgbouncer is not running")
        self._process.send_signal(signal.SIGHUP)

    def log_tail(self, size: int = 2000) -> str:
        """The end of PgBouncer's log."""
        try:
            return (self._root / "pgbouncer.log").read_text(errors="replace")[-size:]
        except OSError:
            return ""

    def cleanup(self) -> None:
        """Stop PgBouncer and delete its folder."""
        process, self._process = self._process, None
        if process is not None and process.poll() is None:
            process.terminate()
            try:
                process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        shutil.rmtree(self._root, ignore_errors=True)

    def __enter__(self) -> PgBouncer:
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
