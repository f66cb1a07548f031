"""A throwaway PostgreSQL server for tests and benchmarks.

It runs the locally installed server binaries on 127.0.0.1 with a temporary
data directory, trusts local connections (nothing else can reach it), and is
stopped and deleted afterwards. ``restart()`` and ``kill()`` let fault tests
take the server away under a live client.

PostgreSQL refuses to run as root; when this process is root the server runs
as the ``postgres`` system user (Debian's packages create it) or ``nobody``.
"""

from __future__ import annotations

import atexit
import contextlib
import glob
import os
import pwd
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from types import TracebackType
from typing import Any

__all__ = [
    "PostgresServer",
    "PostgresUnavailableError",
    "find_server_binaries",
    "shared_test_dsn",
]


class PostgresUnavailableError(RuntimeError):
    """No PostgreSQL server binaries are installed, or the server did not start."""


def find_server_binaries() -> Path | None:
    """The folder holding ``initdb`` and ``postgres``, newest version first, or None."""
    if configured := os.environ.get("DATAOAD_PG_BINDIR"):
        candidates = [configured]  # explicit configuration wins, even when wrong
    else:
        candidates = sorted(glob.glob("/usr/lib/postgresql/*/bin"), reverse=True)
        candidates += ["/usr/local/pgsql/bin", "/usr/local/bin", "/usr/bin"]
    for folder in candidates:
        path = Path(folder)
        if (path / "initdb").exists() and (path / "postgres").exists():
            return path
    return None


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _server_user() -> pwd.struct_passwd | None:
    if os.geteuid() != 0:
        return None
    for name in ("postgres", "nobody"):
        with contextlib.suppress(KeyError):
            return pwd.getpwnam(name)
    raise PostgresUnavailableError("running as root and no 'postgres' or 'nobody' user exists")


class PostgresServer:
    """One throwaway PostgreSQL cluster on 127.0.0.1.

    ``durable=False`` turns off ``fsync`` for speed: the tests check the
    client's protocol, not PostgreSQL's crash safety. Benchmarks keep it on.
    """

    def __init__(
        self,
        *,
        durable: bool = False,
        max_connections: int = 100,
        settings: dict[str, str] | None = None,
    ) -> None:
        bindir = find_server_binaries()
        if bindir is None:
            raise PostgresUnavailableError(
                "PostgreSQL server binaries not found (install Debian's 'postgresql' "
                "package, or set DATAOAD_PG_BINDIR)"
            )
        self.bindir = bindir
        self.durable = durable
        self.max_connections = max_connections
        #: More ``-c name=value`` settings for the server (replication, say).
        self.settings = dict(settings or {})
        self.port = _free_port()
        self.user = _server_user()
        self._root = Path(tempfile.mkdtemp(prefix="dataoad-pg-"))
        self.datadir = self._root / "data"
        self._process: subprocess.Popen[bytes] | None = None
        self._log = self._root / "server.log"
        self._guard: subprocess.Popen[bytes] | None = None

    @property
    def dsn(self) -> str:
        """A libpq connection string for the ``postgres`` superuser and database."""
        return f"postgresql://postgres@127.0.0.1:{self.port}/postgres"

    def _as_server_user(self) -> dict[str, Any]:
        """subprocess arguments that drop root for the server's processes."""
        if self.user is None:
            return {}
        return {"user": self.user.pw_uid, "group": self.user.pw_gid, "extra_groups": []}

    def _run(self, *args: str) -> None:
        result = subprocess.run(
            args, capture_output=True, check=False, cwd=self._root, **self._as_server_user()
        )
        if result.returncode != 0:
            output = (result.stdout + result.stderr).decode(errors="replace")
            raise PostgresUnavailableError(f"{args[0]} failed: {output.strip()[-2000:]}")

    def start(self) -> PostgresServer:
        """Create the cluster if needed and start the server; wait until it accepts connections."""
        if self.user is not None:
            os.chown(self._root, self.user.pw_uid, self.user.pw_gid)
        if not self.datadir.exists():
            self._initialise()
        options = [
            "-c",
            "listen_addresses=127.0.0.1",
            "-c",
            f"unix_socket_directories={self._root}",
            "-c",
            f"max_connections={self.max_connections}",
            "-c",
            f"fsync={'on' if self.durable else 'off'}",
            "-c",
            f"full_page_writes={'on' if self.durable else 'off'}",
        ]
        for name, value in self.settings.items():
            options += ["-c", f"{name}={value}"]
        log = open(self._log, "ab")  # noqa: SIM115 - handed to the child
        try:
            self._process = subprocess.Popen(
                [
                    str(self.bindir / "postgres"),
                    "-D",
                    str(self.datadir),
                    "-p",
                    str(self.port),
                    *options,
                ],
                **self._as_server_user(),
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=self._root,
            )
        finally:
            log.close()
        self._wait_ready()
        return self

    def _initialise(self) -> None:
        """Create the data directory (a new cluster; a standby copies its primary instead)."""
        self._run(
            str(self.bindir / "initdb"),
            "-D",
            str(self.datadir),
            "-U",
            "postgres",
            "--auth=trust",
            "--encoding=UTF8",
            "--no-sync",
        )

    def _wait_ready(self, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            assert self._process is not None
            if self._process.poll() is not None:
                raise PostgresUnavailableError(f"postgres exited: {self.log_tail()}")
            result = subprocess.run(
                [str(self.bindir / "pg_isready"), "-h", "127.0.0.1", "-p", str(self.port)],
                capture_output=True,
                check=False,
            )
            if result.returncode == 0:
                return
            time.sleep(0.05)
        raise PostgresUnavailableError(f"postgres did not start in {timeout} s: {self.log_tail()}")

    def log_tail(self, size: int = 2000) -> str:
        """The end of the server's log, for error messages."""
        try:
            return self._log.read_text(errors="replace")[-size:]
        except OSError:
            return ""

    def stop(self, *, mode: str = "fast") -> None:
        """Shut the server down (``fast``: disconnect clients, checkpoint; ``immediate``: crash)."""
        process, self._process = self._process, None
        if process is None or process.poll() is not None:
            return
        sig = {"smart": signal.SIGTERM, "fast": signal.SIGINT, "immediate": signal.SIGQUIT}[mode]
        process.send_signal(sig)
        try:
            process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()

    def kill(self) -> None:
        """Crash the server: immediate shutdown, no checkpoint; restart recovers from WAL."""
        self.stop(mode="immediate")

    def restart(self) -> None:
        """Stop the server and start it again on the same port and data."""
        self.stop()
        self.start()

    def cleanup(self) -> None:
        """Stop the server and delete its data directory."""
        self.stop()
        shutil.rmtree(self._root, ignore_errors=True)
        guard, self._guard = self._guard, None
        if guard is not None and guard.stdin is not None:
            # Tell the reaper all is tidy, so it never signals a reused pid.
            with contextlib.suppress(OSError):
                guard.stdin.write(b"done\n")
                guard.stdin.close()
            # Reaped here: a Popen collected while its child runs warns (ResourceWarning).
            with contextlib.suppress(subprocess.TimeoutExpired):
                guard.wait(timeout=10)

    def guard_against_abandonment(self) -> None:
        """Delete the server and its data even if this process dies without cleaning up.

        A small reaper process, in a session of its own (so Ctrl-C in a
        terminal does not stop it first), waits on a pipe from this process.
        When the pipe closes without a "done" (SIGKILL, SIGTERM, a crash), it
        shuts the server down and removes the temporary folder.
        """
        self._guard = subprocess.Popen(
            [sys.executable, "-c", _REAPER, str(self._root)],
            stdin=subprocess.PIPE,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )

    def __enter__(self) -> PostgresServer:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.cleanup()


#: The reaper (see PostgresServer.guard_against_abandonment): standard library
#: only, run as ``python -c`` with the server's temporary folder as argument.
_REAPER = """
import os, shutil, signal, sys, time
root = sys.argv[1]
if sys.stdin.buffer.read().startswith(b"done"):
    raise SystemExit(0)
try:
    with open(os.path.join(root, "data", "postmaster.pid")) as f:
        pid = int(f.readline())
    os.kill(pid, signal.SIGQUIT)
    for _ in range(100):
        time.sleep(0.1)
        os.kill(pid, 0)
    os.kill(pid, signal.SIGKILL)
except (OSError, ValueError):
    pass
time.sleep(0.2)
shutil.rmtree(root, ignore_errors=True)
"""

_shared_server: PostgresServer | None = None
_shared_failure: PostgresUnavailableError | None = None


def shared_test_dsn() -> str:
    """A DSN for tests: ``DATAOAD_TEST_POSTGRES_DSN`` when set, else one throwaway server.

    The throwaway server is started on first use and stopped when the
    process exits. Raises PostgresUnavailableError (every time, after the
    first failure) when no server can be had.
    """
    global _shared_server, _shared_failure
    if configured := os.environ.get("DATAOAD_TEST_POSTGRES_DSN"):
        return configured
    if _shared_failure is not None:
        raise _shared_failure
    if _shared_server is None:
        try:
            server = PostgresServer(max_connections=300)
            server.guard_against_abandonment()  # an interrupted run leaves nothing behind
            server.start()
        except PostgresUnavailableError as exc:
            _shared_failure = exc
            raise
        except OSError as exc:
            _shared_failure = PostgresUnavailableError(f"cannot start PostgreSQL: {exc}")
            raise _shared_failure from exc
        _shared_server = server
        atexit.register(server.cleanup)
    return _shared_server.dsn


def _serve(argv: list[str]) -> int:
    """``python -m dataoad.testing._postgres_server DSN_FILE``: run a server until SIGTERM.

    Writes the DSN to DSN_FILE once the server accepts connections; CI scripts
    start this in the background and export the DSN for the tests.
    """
    if len(argv) != 1:
        print("usage: python -m dataoad.testing._postgres_server DSN_FILE", file=sys.stderr)
        return 2
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    with PostgresServer(max_connections=300) as server:
        Path(argv[0]).write_text(server.dsn + "\n")
        stop.wait()
    return 0


if __name__ == "__main__":
    raise SystemExit(_serve(sys.argv[1:]))
