"""DBOS Transact 3.4: a workflow started under the key as its workflow ID, its one step the no-op.

``with SetWorkflowID(key): await workflow(REQUEST)`` is DBOS's guarded call:
the workflow's start inserts its status row keyed by the ID, and a duplicate
finds that row and waits for its recorded result instead of running the body.
The workflow and step are ``async def``, so DBOS runs them on the caller's loop
and its (synchronous SQLAlchemy) database calls through ``asyncio.to_thread``.

DBOS is a process-wide singleton (``DBOS(config=...)``, ``DBOS.launch()``,
``DBOS.destroy()``), so one session is open at a time: ``open`` launches it on
the session's system database and ``close`` destroys it. The workflow and its
step are registered once per process, on first use (the registry outlives
``destroy``). Turned off: OTLP tracing and log export (``enable_otlp``),
Conductor (no key), LISTEN/NOTIFY (``use_listen_notify``), the scheduler's
polling after its startup minute, and logs below WARNING. DBOS has no admin
server in 3.x; its queue, background-jobs and notification-polling threads
cannot be turned off and poll the database about once a second.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import dataclasses
import hashlib
import os
import re
import sqlite3
from collections.abc import Awaitable, Callable
from typing import Any

import sqlalchemy as sa
from dbos import DBOS, DBOSConfig, SetWorkflowID

from benchmarks.peers import REQUEST, Peer, Session, Storage

__all__ = ["PEER"]

PROMISE = (
    "A first call commits three write transactions to the system database (workflow_status and"
    " workflow_input rows at start, the step's operation_outputs row, then SUCCESS and a"
    " workflow_output row) besides reading the step's checkpoint; a duplicate repeats the start's"
    " upsert, a write transaction that changes no value (on PostgreSQL it still writes a new row"
    " version), and reads the recorded output. A step that raises or times out after its effect"
    " committed has that error recorded as its outcome, so the call and every replay fail without"
    " running it again (unless retries_allowed reruns it at once), while a crash before the step's"
    " row commits leaves the workflow PENDING and recovery runs the step again: at-least-once."
)

_Workflow = Callable[[dict[str, Any]], Awaitable[int]]


@dataclasses.dataclass
class _Runs:
    """Runs of the guarded no-op, across sessions: the registered step can reach only globals."""

    count: int = 0


_RUNS = _Runs()
_REGISTERED: list[_Workflow] = []


def _workflow() -> _Workflow:
    """The guarded call, registered on first use: DBOS rejects a second function under a name."""
    if not _REGISTERED:

        @DBOS.step(name="dataoad_bench_noop")
        async def noop() -> int:
            _RUNS.count += 1
            return _RUNS.count

        @DBOS.workflow(name="dataoad_bench_call")
        async def call(request: dict[str, Any]) -> int:
            return await noop()

        _REGISTERED.append(call)
    return _REGISTERED[0]


def _database_name(prefix: str) -> str:
    """A PostgreSQL database name (at most 63 bytes) of its own for ``prefix``."""
    slug = re.sub(r"[^a-z0-9_]+", "_", prefix.lower()).strip("_")[:32]
    digest = hashlib.sha256(prefix.encode()).hexdigest()[:12]
    return f"dbos_{slug}_{digest}" if slug else f"dbos_{digest}"


def _sqlite_pragmas(path: str, synchronous: str) -> Callable[..., None]:
    """A pool "connect" listener giving DBOS's connections to ``path`` Dataoad's settings.

    DBOS sets neither journal_mode nor synchronous, builds its SQLite engine inside
    ``launch`` (``SQLiteSystemDatabase._create_engine``) and connects at once to migrate,
    offering no hook in between; so this listens on every SQLAlchemy pool in the process
    and touches only connections to ``path``.
    """
    target = os.path.realpath(path)

    def on_connect(dbapi_connection: Any, connection_record: Any) -> None:
        if not isinstance(dbapi_connection, sqlite3.Connection):
            return
        files = [row[2] for row in dbapi_connection.execute("PRAGMA database_list")]
        if target not in (os.path.realpath(f) for f in files if f):
            return
        dbapi_connection.execute("PRAGMA journal_mode=WAL")
        dbapi_connection.execute(f"PRAGMA synchronous={synchronous}")

    return on_connect


class _DBOS:
    """The DBOS peer; ``noop_runs`` counts every run of the guarded no-op, across sessions."""

    name = "DBOS"
    promise = PROMISE

    def __init__(self) -> None:
        self._open = False

    @property
    def noop_runs(self) -> int:
        """Runs of the guarded no-op so far in this process."""
        return _RUNS.count

    def unsupported(self, storage: Storage) -> str | None:
        """Why DBOS cannot run on ``storage`` (None: it can)."""
        if storage.kind == "sqlite":
            return None
        if storage.kind == "postgres":
            return None if storage.dsn is not None else "no PostgreSQL DSN"
        return f"no {storage.kind} system database (DBOS keeps its records in SQLite or PostgreSQL)"

    async def open(self, storage: Storage, prefix: str) -> Session:
        """DBOS launched on ``storage``, with one workflow ID (``{prefix}done``) already completed."""
        if why := self.unsupported(storage):
            raise ValueError(why)
        if self._open:
            raise RuntimeError("DBOS is a process-wide singleton: close the open session first")
        workflow = _workflow()

        listener: Callable[..., None] | None = None
        drop_url: str | None = None
        if storage.kind == "sqlite":
            path = str(storage.folder / "dbos.sqlite")
            url = f"sqlite:///{path}"
            listener = _sqlite_pragmas(path, storage.synchronous or "FULL")
        else:
            assert storage.dsn is not None
            # DBOS creates this database at launch (PostgresSystemDatabase.run_migrations).
            url = drop_url = (
                sa.make_url(storage.dsn)
                .set(database=_database_name(prefix))
                .render_as_string(hide_password=False)
            )
        config: DBOSConfig = {
            "name": "dataoad-bench",
            "system_database_url": url,
            "enable_otlp": False,
            # Only send/recv, events and streams wait on notifications; without them the
            # notifier thread waking every 10 ms and the LISTEN connection go too.
            "use_listen_notify": False,
            # No schedules here: after its fast startup minute, poll for them hourly.
            "scheduler_polling_interval_sec": 3600.0,
            "log_level": "WARNING",
        }
        loop = asyncio.get_running_loop()
        # Each workflow call makes DBOS's thread pool this loop's default executor
        # (DBOS._configure_asyncio_thread_pool), and destroy shuts that pool down: close
        # hands the loop back the executor it had.
        saved_executor: concurrent.futures.ThreadPoolExecutor | None = getattr(
            loop, "_default_executor", None
        )

        async def close() -> None:
            try:
                DBOS.destroy()
                loop.set_default_executor(saved_executor or concurrent.futures.ThreadPoolExecutor())
            finally:
                self._open = False
                if listener is not None:
                    sa.event.remove(sa.pool.Pool, "connect", listener)
            if drop_url is not None:
                DBOS.reset_system_database(system_database_url=drop_url)

        self._open = True
        if listener is not None:
            sa.event.listen(sa.pool.Pool, "connect", listener)
        completed = f"{prefix}done"
        before = _RUNS.count
        try:
            DBOS(config=config)
            # From the loop's thread, so DBOS adopts this loop as its main one.
            DBOS.launch()
            with SetWorkflowID(completed):
                await workflow(REQUEST)
            if _RUNS.count != before + 1:
                raise RuntimeError("DBOS did not run the no-op for a fresh workflow ID")
        except BaseException:
            # The launch or seeding error is the one worth seeing, not a failed cleanup.
            with contextlib.suppress(Exception):
                await close()
            raise

        # The counter checks cost nanoseconds and prove each step did what it is measured for.
        async def first(n: int) -> int:
            before = _RUNS.count
            with SetWorkflowID(f"{prefix}k{n}"):
                result = await workflow(REQUEST)
            if _RUNS.count != before + 1:
                raise RuntimeError(f"DBOS did not run the no-op once for workflow {prefix}k{n}")
            return result

        async def replay(n: int) -> int:
            before = _RUNS.count
            with SetWorkflowID(completed):
                result = await workflow(REQUEST)
            if _RUNS.count != before:
                raise RuntimeError("DBOS ran the no-op again for a completed workflow ID")
            return result

        return Session(first=first, replay=replay, close=close)


PEER: Peer = _DBOS()
