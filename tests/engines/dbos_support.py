"""Where the DBOS tests keep DBOS's system database.

DBOS's SQLite system database needs SQLite 3.42 or newer on Python 3.12 and
later: its schema's defaults call ``unixepoch('subsec')``, which older
SQLite answers with NULL, and DBOS then fails to launch ("NOT NULL
constraint failed: application_versions.version_timestamp"). Debian 12's
Python 3.13 links SQLite 3.40. There the tests use a fresh database on the
test PostgreSQL server instead (DBOS's other system database), never a skip.
"""

from __future__ import annotations

import asyncio
import contextlib
import sqlite3
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

from suite_support.services import postgres_dsn

__all__ = ["postgres_database", "sqlite_fits_dbos", "system_database"]


def sqlite_fits_dbos() -> bool:
    """Whether DBOS can keep its system database in SQLite on this interpreter."""
    return sys.version_info < (3, 12) or sqlite3.sqlite_version_info >= (3, 42)


@contextlib.contextmanager
def postgres_database() -> Iterator[str]:
    """A fresh database on the test PostgreSQL server (DBOS creates it), dropped afterwards."""
    import asyncpg

    dsn = postgres_dsn()
    name = f"dbos_{uuid.uuid4().hex[:16]}"
    try:
        yield dsn.rsplit("/", 1)[0] + "/" + name
    finally:

        async def drop() -> None:
            conn = await asyncpg.connect(dsn)
            try:
                await conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
            finally:
                await conn.close()

        asyncio.run(drop())


@contextlib.contextmanager
def system_database(folder: Path) -> Iterator[str]:
    """DBOS's default system database (SQLite in ``folder``) where it works, else PostgreSQL."""
    if sqlite_fits_dbos():
        yield f"sqlite:///{folder / 'dbos.sqlite'}"
    else:
        with postgres_database() as url:
            yield url
