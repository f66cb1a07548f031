"""The SQLite ledger's connection thread outlives the event loops of its callers.

One ledger may serve several loops over its life (a ``SyncActionRunner``'s
and the application's, or ``asyncio.run`` called twice). A read still
queued on the connection's thread when its caller's loop closed once ended
that thread (aiosqlite handed the answer to the closed loop, and the
hand-over raised there): every later call of the ledger then waited for
good. And a claim that looked again after ``close()`` raised SQLite's own
error instead of ``LedgerClosedError``.
"""

from __future__ import annotations

import asyncio
import sqlite3
import threading
import time
from pathlib import Path

import aiosqlite
import pytest

from dataoad import ActionRunner, ActionStatus, LedgerClosedError, SQLiteLedger
from dataoad.ledgers import _sqlite_live as live
from dataoad.testing._legacy import unstarted_claim
from suite_support import REQUEST, CountingOperation


def _connection_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if "_connection_worker_thread" in t.name]


# Its own assertion says whether the thread ended; pytest's report of the thread's
# exception would only add an error beside that failure.
@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")
def test_a_read_whose_loop_closed_before_its_answer_leaves_the_ledger_serving(
    tmp_path: Path,
) -> None:
    ledger = SQLiteLedger(tmp_path / "l.sqlite3")
    left: list[asyncio.Future[object]] = []

    async def leave_a_read_behind() -> None:
        await ledger.get("0" * 32)  # opened
        assert ledger._conn is not None
        # The thread is busy (as while another group waits for the writer lock) ...
        live.queue_on_thread(ledger._conn, lambda: time.sleep(0.3))
        # ... so this read is still queued when asyncio.run cancels it and closes the loop.
        left.append(asyncio.ensure_future(ledger.get("1" * 32)))
        await asyncio.sleep(0.05)

    asyncio.run(leave_a_read_behind())
    time.sleep(0.5)  # the thread has answered the read, for a loop that is gone
    assert ledger._conn is not None
    assert live.alive(ledger._conn), "the connection's thread ended"

    async def go_on() -> None:
        operation = CountingOperation()
        result = await asyncio.wait_for(
            ActionRunner(ledger).execute("charge", operation, request=REQUEST, idempotency_key="k"),
            10,
        )
        assert result.status is ActionStatus.CONFIRMED
        assert operation.calls == 1
        await asyncio.wait_for(ledger.close(), 10)

    asyncio.run(go_on())


async def test_a_connection_whose_thread_ended_is_refused_and_closes_without_waiting(
    tmp_path: Path,
) -> None:
    ledger = SQLiteLedger(tmp_path / "l.sqlite3")
    await ledger.get("0" * 32)
    conn = ledger._conn
    assert conn is not None
    db = conn._conn
    before = set(_connection_threads())
    # Its thread ends, with the connection still marked running: as it did when a
    # hand-over to a closed loop raised on it.
    conn._tx.put_nowait((None, lambda: aiosqlite.core._STOP_RUNNING_SENTINEL))
    for _ in range(1000):  # until its thread has ended (bounded: 10 s)
        if not live.alive(conn):
            break
        await asyncio.sleep(0.01)
    assert not live.alive(conn)
    assert not set(_connection_threads()) - before
    with pytest.raises(LedgerClosedError, match="close the ledger and open it again"):
        await asyncio.wait_for(ledger.get("1" * 32), 10)
    with pytest.raises(LedgerClosedError):
        await asyncio.wait_for(ledger.claim(unstarted_claim("charge", "k", REQUEST)), 10)
    await asyncio.wait_for(ledger.close(), 10)  # nobody left to run its close: no wait
    with pytest.raises(sqlite3.ProgrammingError, match="closed"):
        db.execute("SELECT 1")  # closed from here, not left to be collected unclosed


async def test_a_claim_looking_again_after_close_is_told_the_ledger_closed(
    tmp_path: Path,
) -> None:
    """Two claims of one key in one group: the loser looks again, after ``close()``."""
    ledger = SQLiteLedger(tmp_path / "l.sqlite3")
    await ledger.get("0" * 32)
    assert ledger._conn is not None
    busy = asyncio.ensure_future(live.on_thread(ledger._conn, lambda: time.sleep(0.2)))
    await asyncio.sleep(0.01)
    first, second = unstarted_claim("charge", "k", REQUEST), unstarted_claim("charge", "k", REQUEST)
    calls = [asyncio.ensure_future(ledger.claim(r)) for r in (first, second)]
    await asyncio.sleep(0.01)  # both queued behind the busy job, in one group
    closing = asyncio.ensure_future(ledger.close())
    outcomes = await asyncio.gather(*calls, return_exceptions=True)
    await closing
    await busy
    made = [o for o in outcomes if isinstance(o, tuple)]
    refused = [o for o in outcomes if isinstance(o, BaseException)]
    assert all(isinstance(e, LedgerClosedError) for e in refused), refused
    assert len(made) + len(refused) == 2
    assert sum(1 for _, created in made if created) <= 1
