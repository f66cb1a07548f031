"""The command line as an operator runs it: a child process, a ledger to run it on."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from dataoad import ActionRunner, SQLiteLedger
from suite_support.worker_forks import run_forked

__all__ = [
    "VERIFIER",
    "Store",
    "as_nobody",
    "charges",
    "dataoad",
    "listing",
    "read_only_copy",
]

#: Longest one command may take.
COMMAND_TIMEOUT = 120.0

VERIFIER = """
from dataoad import VerificationResult

class Confirms:
    def verify(self, receipt):
        return VerificationResult.confirmed(
            verified_provider_reference=receipt.provider_reference, provider_request_id="ch_1"
        )

class Down:
    def verify(self, receipt):
        raise ConnectionError("GET https://api.example/charges?customer=cus_42: refused")
"""


def dataoad(
    *args: str, cwd: Path, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """``python -m dataoad *args`` in ``cwd``: a process of its own, stdin empty.

    Forked from a process that imported the library once (``worker_forks``):
    each command otherwise spent most of its time importing it again.
    """
    done = run_forked("dataoad", list(args), {**os.environ, **(env or {})}, cwd, COMMAND_TIMEOUT)
    return subprocess.CompletedProcess(
        [sys.executable, "-m", "dataoad", *args], done.returncode, done.stdout, done.stderr
    )


@dataclasses.dataclass
class Store:
    """A ledger the commands run against: a SQLite file or a PostgreSQL table."""

    url: str
    env: dict[str, str]
    cwd: Path


def listing(store: Store, *args: str) -> list[dict[str, object]]:
    done = dataoad("receipts", "list", "--json", *args, cwd=store.cwd, env=store.env)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)  # type: ignore[no-any-return]


def charges(path: Path, count: int, *, also: tuple[str, str] | None = None) -> None:
    """A SQLite ledger at ``path`` with ``count`` confirmed charges k0, k1, ... (oldest first),
    then ``also`` = (action name, key) if given."""

    async def fill() -> None:
        async with SQLiteLedger(path) as ledger:
            runner = ActionRunner(ledger)
            for n in range(count):
                await runner.execute("charge", lambda: None, request={}, idempotency_key=f"k{n}")
            if also is not None:
                await runner.execute(also[0], lambda: None, request={}, idempotency_key=also[1])

    asyncio.run(fill())


def as_nobody(argv: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    """Run the CLI as an unprivileged user (root ignores file modes)."""
    script = (
        "import os, sys\n"
        "import dataoad._cli, dataoad._cli_ledger, dataoad._runner, dataoad.ledgers.sqlite_reader\n"
        "import dataoad.ledgers.postgres, dataoad._cli_render, sqlite3, json, asyncio\n"
        "import concurrent.futures.thread\n"
        "if os.geteuid() == 0:  # import first: the stdlib lives under /root\n"
        "    os.setgid(65534); os.setuid(65534)\n"
        f"sys.exit(dataoad._cli.main({argv!r}))\n"
    )
    return subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, cwd=cwd, check=False
    )


@contextmanager
def read_only_copy(ledger_file: Path) -> Iterator[Path]:
    """A copy of the ledger file that the unprivileged user may read, not write.

    Under /tmp, since that user cannot reach pytest's folders under /root.
    """
    folder = Path(f"/tmp/dataoad-ops-{os.getpid()}")
    folder.mkdir(mode=0o755, exist_ok=True)
    os.chmod(folder, 0o755)
    db = folder / "ledger.sqlite3"
    db.write_bytes(ledger_file.read_bytes())
    os.chmod(db, 0o444)
    try:
        yield db
    finally:
        for path in folder.iterdir():
            path.unlink()
        folder.rmdir()
