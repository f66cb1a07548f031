"""The runner machine's PostgreSQL ledger tables: an empty one per example, reused, and reads.

Every example starts on an empty ledger table. Creating one (a pool, the
probe for a transaction pooler, five migrations) and dropping it took about
40 ms of an example's 230, as much as its reads. A table a finished example
gave back is emptied instead (``TRUNCATE``, identities restarted), which
leaves exactly what ``migrate()`` leaves: the schema, its version rows and
no receipt or audit record. Migrations keep their own tests
(``tests/ledgers``). The tables a process made are dropped when it exits.

Only a table whose every client was closed is given back: an example that
failed to close one leaves its table to be dropped at exit, never reused.

The machine reads every receipt after every step (``_observe``). Through
the observer's ledger that was a round trip per key and per id, through
its pool, about a quarter of an example. ``PostgresStorageReads`` reads the
whole table in one statement (the ledger's own column list) on a
connection of the machine's own, and answers ``find`` and ``get`` from
that one snapshot, decoded by the ledger's own codec: the committed rows,
all read at one moment, while every contender is parked at a gate.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
from typing import Any, Final

from dataoad import ActionReceipt, PostgresLedger
from dataoad.ledgers._codec import receipt_of
from suite_support.services import PostgresTestTable

__all__ = ["PostgresStorageReads", "Snapshot", "empty_table", "give_back"]

#: Emptied tables wait here, by DSN, for the next example.
_FREE: Final[dict[str, list[PostgresTestTable]]] = {}
#: Every table this process made, dropped at exit.
_MADE: Final[list[PostgresTestTable]] = []
#: How long emptying waits for a lock a straggler still holds before making a new table.
_LOCK_TIMEOUT_MS: Final = 2000


async def empty_table(dsn: str | None = None) -> PostgresTestTable:
    """An empty, migrated ledger table: a given-back one emptied, else a new one."""
    made = PostgresTestTable(dsn)
    free = _FREE.get(made.dsn, [])
    while free:
        table = free.pop()
        if await _emptied(table):
            return table
    await made.create()
    _MADE.append(made)
    return made


def give_back(table: PostgresTestTable) -> None:
    """``table``'s example is over and every client of it closed: the next may empty it."""
    _FREE.setdefault(table.dsn, []).append(table)


async def _emptied(table: PostgresTestTable) -> bool:
    import asyncpg

    conn = await asyncpg.connect(table.dsn)
    try:
        await conn.execute(f"SET lock_timeout = {_LOCK_TIMEOUT_MS}")
        await conn.execute(f'TRUNCATE "{table.table}", "{table.table}_audit" RESTART IDENTITY')
    except asyncpg.PostgresError:
        return False  # held by a straggler: dropped at exit, never reused
    finally:
        await conn.close()
    return True


class Snapshot:
    """Every receipt of the table at one moment: ``find`` and ``get`` as the ledger answers."""

    def __init__(self, receipts: list[ActionReceipt]) -> None:
        self._by_id = {r.action_id: r for r in receipts}
        # At most one receipt holds a key: the unique index of the unretired ones.
        self._holding = {
            (r.namespace, r.action_name, r.idempotency_key): r
            for r in receipts
            if r.retired_at is None
        }

    def find(self, action_name: str, idempotency_key: str, namespace: str) -> ActionReceipt | None:
        """The receipt holding the key, or None (what PostgresLedger.find answers)."""
        return self._holding.get((namespace, action_name, idempotency_key))

    def get(self, action_id: str) -> ActionReceipt | None:
        """The receipt with this id, or None (what PostgresLedger.get answers)."""
        return self._by_id.get(action_id)


class PostgresStorageReads:
    """One connection of the machine's own, reading the whole ledger table per step."""

    def __init__(self, dsn: str, select: str) -> None:
        self._dsn = dsn
        self._select = select
        self._conn: Any = None
        # Most rows are unchanged from one step to the next: each distinct
        # row is decoded once (receipts are immutable, so sharing is safe).
        self._decoded: dict[tuple[object, ...], ActionReceipt] = {}

    @staticmethod
    def reads_like_the_ledger(ledger: object) -> bool:
        """Whether ``ledger`` reads as PostgresLedger does (a planted bug may change its reads)."""
        if not isinstance(ledger, PostgresLedger):
            return False
        cls = type(ledger)
        return cls.find is PostgresLedger.find and cls.get is PostgresLedger.get

    @classmethod
    def of(cls, ledger: PostgresLedger, dsn: str) -> PostgresStorageReads:
        """Reads of ``ledger``'s table, with its own column list."""
        return cls(dsn, ledger._sql.select)

    async def snapshot(self) -> Snapshot:
        """Every committed receipt now, in one statement."""
        import asyncpg

        if self._conn is None:
            self._conn = await asyncpg.connect(self._dsn)
        receipts = []
        for row in await self._conn.fetch(self._select):
            values = tuple(row)
            receipt = self._decoded.get(values)
            if receipt is None:
                receipt = self._decoded[values] = receipt_of(row)
            receipts.append(receipt)
        return Snapshot(receipts)

    async def close(self) -> None:
        """Close the connection, if one was opened."""
        if self._conn is not None:
            await self._conn.close()
            self._conn = None


def _drop_all() -> None:
    import asyncpg

    async def drop(dsn: str, tables: list[str]) -> None:
        try:
            conn = await asyncpg.connect(dsn, timeout=5)
        except (OSError, asyncpg.PostgresError):  # a throwaway server is gone already
            return
        try:
            # Bounded: a client an example never closed may still hold a table.
            await conn.execute(f"SET lock_timeout = {_LOCK_TIMEOUT_MS}")
            for table in tables:
                with contextlib.suppress(asyncpg.PostgresError):
                    await conn.execute(
                        f'DROP TABLE IF EXISTS "{table}", "{table}_schema", "{table}_audit"'
                    )
        finally:
            await conn.close()

    by_dsn: dict[str, list[str]] = {}
    for made in _MADE:
        by_dsn.setdefault(made.dsn, []).append(made.table)
    for dsn, tables in by_dsn.items():
        asyncio.run(drop(dsn, tables))


atexit.register(_drop_all)
