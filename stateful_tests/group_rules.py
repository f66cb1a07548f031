"""The runner machine on one SQLite connection: contenders' writes committed in one group.

Mixed into a runner machine whose contenders share one ``SQLiteLedger`` (one
process, many tasks) instead of one connection each. A rule holds the
connection's thread, releases several contenders parked before a ledger
write at once, lets each queue its write, and then lets the thread run them:
their writes are committed as one group, or the group's COMMIT fails (drawn)
and nothing of it is stored. Every property of the runner machine is
checked after it, as after any step; a contender whose write the failed
COMMIT took back has that fault noted at its write's gate
(``LedgerFault.GROUP_COMMIT_FAILED``), as the progress properties need.

Runs must replay: the same choices must end in the same state. So the
contenders' ungated reads before a write are made from the file, not on the
held connection (where whether they came back within the rule's loop turns
decided which writes made the group), and only the group formed behind the
held thread may fail: which later writes share a flush is timing. After
the group each contender goes on alone (it parks once its write returned or
raised, at ``AFTER_GROUP``): the ledger's clock moves per read and a flush
reads it once, so unparked writes racing to one flush moved later lease ends.
"""

from __future__ import annotations

import asyncio
import sqlite3
import threading
from typing import Any

from hypothesis import event
from hypothesis import strategies as st
from hypothesis.stateful import precondition

from dataoad import ActionReceipt, SQLiteLedger
from dataoad.ledgers import _sqlite_live as live
from dataoad.ledgers._sqlite_group import QueuedWrite
from stateful_tests.harness import AFTER_GROUP, LedgerFault, current_contender
from stateful_tests.reach import rule
from stateful_tests.sqlite_files import SQLiteStorageReads

__all__ = ["GroupCommitRules", "WRITE_GATES"]

#: The gates before a ledger write that may share a group.
WRITE_GATES = frozenset(
    {
        "ledger.claim",
        "ledger.start_attempt",
        "ledger.record",
        "ledger.take_over",
        "ledger.retire",
        "ledger.release",
    }
)
#: Loop turns for released contenders to reach the held thread's queue (no I/O needed).
_TURNS = 50


class GroupCommitRules:
    """Rules for a runner machine whose SQLite contenders share one connection."""

    backend: str
    contenders_list: list[Any]
    history: Any
    loop: Any
    scheduler: Any
    clients: list[Any]
    storage_reads: SQLiteStorageReads | None

    def new_client(self) -> Any:
        if self.clients:
            return self.clients[0]
        return super().new_client()  # type: ignore[misc]

    def _parked_before_writes(self) -> list[Any]:
        return [
            c
            for c in self.contenders_list
            if c.parked_at in WRITE_GATES and not c.finished and not c.crashed
        ]

    @precondition(lambda self: len(self._parked_before_writes()) >= 2)
    @rule(data=st.data())
    def writes_in_one_group(self, data: st.DataObject) -> None:
        """Several contenders' next writes run as one group on the shared connection."""
        parked = {c.name: c for c in self._parked_before_writes()}
        names = data.draw(
            st.lists(st.sampled_from(sorted(parked)), min_size=2, max_size=3, unique=True),
            label="contenders",
        )
        chosen = [parked[name] for name in sorted(names)]
        commit = data.draw(st.sampled_from(["commits", "commits", "commit fails"]), label="commit")
        ledger: SQLiteLedger = self.clients[0]
        group = ledger._group
        real_flush, real_put = group.flush, group.put
        #: Each write queued during this rule and its contender, so that the
        #: fault is noted on whoever's write it took back (a contender not
        #: chosen may reach a write too, on a timer of its own).
        writers: list[tuple[QueuedWrite, Any]] = []

        def put(entry: QueuedWrite) -> QueuedWrite:
            writers.append((entry, current_contender()))
            return real_put(entry)

        sizes: list[int] = []
        # Only the group formed behind the held thread may fail (armed just
        # before the thread is let go): which other writes share a flush is
        # timing, and a fault drawn for them would make runs of the same
        # choices differ.
        armed = [False]
        struck: list[int] = []
        failed: list[Any] = []  # the contenders whose write the failed COMMIT took back

        #: Flushes under way on the connection's thread: a flush answers its
        #: callers before it returns here, so a caller may be settled (and the
        #: rule read ``failed``) while what struck is not yet noted.
        flushing = threading.Condition()
        under_way = [0]

        def flush(db: sqlite3.Connection) -> None:
            with flushing:
                under_way[0] += 1
            try:
                noted_flush(db)
            finally:
                with flushing:
                    under_way[0] -= 1
                    flushing.notify_all()

        def noted_flush(db: sqlite3.Connection) -> None:
            with group._lock:
                size = len(group._queue)
            if not size:
                real_flush(db)
                return
            sizes.append(size)
            if not armed[0]:
                real_flush(db)
                return
            armed[0] = False
            faulty = _FailingCommit(db)
            real_flush(faulty)  # type: ignore[arg-type]
            if faulty.struck:
                struck.append(size)
                failed.extend(
                    who
                    for entry, who in writers
                    if who is not None and isinstance(entry.error, _CommitFails)
                )

        group.flush = flush  # type: ignore[method-assign]
        group.put = put  # type: ignore[method-assign]
        gate = threading.Event()
        try:
            conn = self.loop.run(ledger._connection())
            holder = self.loop.get_loop().create_task(live.on_thread(conn, lambda: gate.wait(30)))
            self.history.step += 1
            self.history.add(
                "SQLite connection",
                f"{', '.join(c.name for c in chosen)} write together "
                f"({', '.join(str(c.parked_at) for c in chosen)}); the group {commit}",
            )
            for c in chosen:
                c.park = self.loop.get_loop().create_future()
                c.park_after_write = True
                assert c.go is not None
                c.go.set_result(LedgerFault.NONE)
            self.loop.run(_turns(_TURNS))  # each reaches the held thread's queue
            with group._lock:
                held = len(group._queue)
            armed[0] = commit == "commit fails"
            gate.set()
            self.loop.run(_done(holder))
            for c in chosen:
                self.scheduler._settle(c)  # parked once its write returned or raised
            with flushing:
                if not flushing.wait_for(lambda: under_way[0] == 0, timeout=30):
                    raise AssertionError("a group's flush did not end within 30 s")
        finally:
            group.flush, group.put = real_flush, real_put  # type: ignore[method-assign]
            gate.set()
        for c in failed:
            # Its write's gate, its last passed, let it through; its group
            # then failed: noted there.
            method, fault = c.ledger_faults[-1]
            if fault is LedgerFault.NONE:
                c.ledger_faults[-1] = (method, LedgerFault.GROUP_COMMIT_FAILED)
        # Each goes on to its next gate alone. Let go together, their unparked
        # writes after the group (an audit record, a refused takeover) raced to
        # the connection's thread and shared a flush or not by timing; a flush
        # reads the ledger's clock once, and the clock moves a microsecond per
        # read, so every later lease end (and which claims a clock set to one
        # lease's end found stale) differed between runs of the same choices.
        for c in chosen:
            if c.parked_at == AFTER_GROUP:
                self.scheduler.release(c, LedgerFault.NONE)
            self._after(c)  # type: ignore[attr-defined]
        event(f"writes in one group: held group of {min(held, 3)}")
        if struck:
            event("writes in one group: a group's COMMIT failed")
        self.history.add(
            "SQLite connection",
            f"{held} writes queued behind the held thread; groups run: {sizes}"
            + (f"; the COMMIT of the group of {struck[0]} failed" if struck else ""),
        )

    def gated(self, client: Any) -> Any:
        """A contender's view of the shared ``client``, its ungated reads made from the file.

        A write's read of the claim before it (``GatedLedger.pre_reads``)
        would otherwise wait behind the held connection, and whether it
        came back within the rule's loop turns would decide the group.
        Read before the group, it misses what an earlier write of the same
        group did to that claim; but every transition is conditional on the
        claim's version, so of two transitions of one claim in a group only
        the first can land, and one that lands read true (but for its lease,
        which a renewal in the same group may have moved).
        """
        gated = super().gated(client)  # type: ignore[misc]
        if self.storage_reads is not None:
            gated.pre_reads = _FileReads(self.storage_reads)
        return gated


class _FileReads:
    """``get`` from the ledger file on the loop's own thread: it never waits for a connection."""

    def __init__(self, reads: SQLiteStorageReads) -> None:
        self._reads = reads

    async def get(self, action_id: str) -> ActionReceipt | None:
        assert self._reads.ready()
        return self._reads.get(action_id)


class _CommitFails(sqlite3.OperationalError):
    """The machine's failed COMMIT (a full disk, say): the whole group fails."""


class _FailingCommit:
    """The connection as one flush sees it: every statement runs, the COMMIT fails.

    A lone write runs in autocommit, with no COMMIT of its own: it is stored.
    """

    def __init__(self, db: sqlite3.Connection) -> None:
        self._db = db
        self.struck = False

    def __getattr__(self, name: str) -> Any:
        return getattr(self._db, name)

    def execute(self, sql: str, *args: Any) -> Any:
        if sql.split(None, 1)[0].upper() == "COMMIT":
            self.struck = True
            raise _CommitFails("injected: the group's COMMIT failed")
        return self._db.execute(sql, *args)


async def _done(task: asyncio.Future[Any]) -> None:
    await task


async def _turns(count: int) -> None:
    for _ in range(count):
        await asyncio.sleep(0)
