"""The runner machine's PostgreSQL ledger tables: an empty one per example, reused.

Every example starts on an empty ledger table. Creating one (a pool, the
probe for a transaction pooler, five migrations) and dropping it took about
40 ms of an example's 230, as much as its reads. A table a finished example
gave back is emptied instead (``TRUNCATE``, identities restarted), which
leaves exactly what ``migrate()`` leaves: the schema, its version rows and
no receipt or audit record. Migrations keep their own tests
(``tests/ledgers``). The tables a process made are dropped when it exits.

Only a table whose every client was closed is given back: an example that
failed to close one leaves its table to be dropped at exit, never reused.
"""

from __future__ import annotations

import asyncio
import atexit
from typing import Final

from suite_support.services import PostgresTestTable

__all__ = ["empty_table", "give_back"]

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


def _drop_all() -> None:
    if not _MADE:
        return

    async def drop() -> None:
        for table in _MADE:
            try:
                await table.drop()
            except Exception:  # a throwaway server may already be gone
                return

    asyncio.run(drop())


atexit.register(_drop_all)
