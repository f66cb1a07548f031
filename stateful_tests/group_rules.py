"""The runner machine on one SQLite connection: contenders' writes committed in one group.

Mixed into a runner machine whose contenders share one ``SQLiteLedger`` (one
process, many tasks) instead of one connection each. A rule holds the
connection's thread, releases several contenders parked before a ledger
write at once, lets each queue its write, and then lets the thread run them:
their writes are committed as one group. Every property of the runner
machine is checked after it, as after any step.

A group whose COMMIT fails is not drawn here: with it, runs that made the
same choices ended in different states (which contenders were left parked
where), so Hypothesis could not replay them. Failed group commits are
driven by the group machine (``group_machine.py``) and, through the real
runner, by ``tests/ledgers/test_sqlite_group_commit.py``.
"""

from __future__ import annotations

import asyncio
import sqlite3
import threading
from typing import Any

from hypothesis import event
from hypothesis import strategies as st
from hypothesis.stateful import precondition, rule

from dataoad import SQLiteLedger
from dataoad.ledgers import _sqlite_live as live
from stateful_tests.harness import LedgerFault

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
        ledger: SQLiteLedger = self.clients[0]
        conn = self.loop.run(ledger._connection())
        group = ledger._group
        gate = threading.Event()
        holder = self.loop.get_loop().create_task(live.on_thread(conn, lambda: gate.wait(30)))
        self.history.step += 1
        self.history.add(
            "SQLite connection",
            f"{', '.join(c.name for c in chosen)} write together "
            f"({', '.join(str(c.parked_at) for c in chosen)})",
        )
        real_flush = group.flush
        sizes: list[int] = []

        def flush(db: sqlite3.Connection) -> None:
            with group._lock:
                size = len(group._queue)
            if size:
                sizes.append(size)
            real_flush(db)

        group.flush = flush  # type: ignore[method-assign]
        try:
            for c in chosen:
                c.park = self.loop.get_loop().create_future()
                assert c.go is not None
                c.go.set_result(LedgerFault.NONE)
            self.loop.run(_turns(_TURNS))  # each reaches the held thread's queue
            gate.set()
            self.loop.run(_done(holder))
            for c in chosen:
                self.scheduler._settle(c)
        finally:
            group.flush = real_flush  # type: ignore[method-assign]
            gate.set()
        for c in chosen:
            self._after(c)  # type: ignore[attr-defined]
        largest = max(sizes, default=0)
        event(f"writes in one group: largest group {min(largest, 3)}")
        self.history.add("SQLite connection", f"groups run: {sizes}")


async def _done(task: asyncio.Future[Any]) -> None:
    await task


async def _turns(count: int) -> None:
    for _ in range(count):
        await asyncio.sleep(0)
