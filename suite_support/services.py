"""The real services tests run against (PostgreSQL), shared by tests/ and stateful_tests/.

A test that needs a service it cannot get is skipped on a developer machine
and fails under ``CI=true``: CI must never pass by skipping what it was set
up to run. Importing this module imports no test module.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, NoReturn

__all__ = [
    "PostgresRoute",
    "PostgresTestTable",
    "pgbouncer_in_front_of",
    "postgres_dsn",
    "unavailable",
    "unique_table",
]


def tool(module: str, *, extra: str = "dev", required: bool = True) -> list[str]:
    """The command running ``module``'s tool with this interpreter (``python -m module``).

    Found beside the running interpreter, never on ``PATH``: a venv's python
    run without activating the venv still tests with that venv's tools. A
    missing tool fails the test (``required``) or is ``unavailable``.
    """
    import importlib.util
    import sys

    import pytest

    if importlib.util.find_spec(module) is None:
        reason = f"{module} is not installed beside {sys.executable}: install the {extra} extra"
        if required:
            pytest.fail(reason)
        unavailable(reason)
    return [sys.executable, "-m", module]


def unavailable(reason: str, *, module_level: bool = False) -> NoReturn:
    """Skip for want of a service or extra on a developer machine; fail under CI=true.

    CI must never pass by skipping what it was set up to run.
    """
    import os

    import pytest

    if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
        pytest.fail(f"CI=true and {reason}")
    pytest.skip(reason, allow_module_level=module_level)


def postgres_dsn() -> str:
    """The test PostgreSQL server's DSN; skips the test without one, fails it under CI=true."""
    from dataoad.testing._postgres_server import PostgresUnavailableError, shared_test_dsn

    try:
        import asyncpg  # noqa: F401

        return shared_test_dsn()
    except (ImportError, PostgresUnavailableError) as exc:
        unavailable(f"PostgreSQL unavailable: {exc}")


def unique_table() -> str:
    """A fresh table name, so tests share one server without seeing each other."""
    import uuid

    return f"t_{uuid.uuid4().hex[:20]}"


class PostgresTestTable:
    """A fresh ledger table on the test server: clients on it, created and dropped by tests."""

    def __init__(self, dsn: str | None = None) -> None:
        self.dsn = dsn or postgres_dsn()
        self.table = unique_table()

    def client(self, **options: Any) -> Any:
        """A new PostgresLedger (its own pool) on this table."""
        from dataoad import PostgresLedger

        options.setdefault("min_size", 1)
        options.setdefault("max_size", 2)
        return PostgresLedger(self.dsn, table=self.table, **options)

    async def create(self) -> None:
        """Run the migrations for this table."""
        ledger = self.client()
        try:
            await ledger.migrate()
        finally:
            await ledger.close()

    async def drop(self) -> None:
        """Drop the table and its schema-version table."""
        import asyncpg

        conn = await asyncpg.connect(self.dsn)
        try:
            await conn.execute(
                f'DROP TABLE IF EXISTS "{self.table}", "{self.table}_schema", "{self.table}_audit"'
            )
        finally:
            await conn.close()


@contextlib.contextmanager
def replicated_postgres(*, synchronous: bool, max_connections: int = 30) -> Iterator[Any]:
    """A started ``ReplicatedPostgres`` (primary and streaming standby), cleaned up after;
    skips without PostgreSQL's binaries, fails under CI=true."""
    from dataoad.testing._postgres_server import PostgresUnavailableError
    from dataoad.testing._postgres_standby import ReplicatedPostgres

    pair = ReplicatedPostgres(synchronous=synchronous, max_connections=max_connections)
    try:
        pair.primary.guard_against_abandonment()
        pair.standby.guard_against_abandonment()
        pair.start()
    except (PostgresUnavailableError, OSError) as exc:
        pair.cleanup()
        unavailable(f"PostgreSQL unavailable: {exc}")
    try:
        yield pair
    finally:
        pair.cleanup()


@contextlib.contextmanager
def pgbouncer_in_front_of(server_dsn: str, *, pool_size: int = 10) -> Iterator[Any]:
    """Debian's started ``PgBouncer`` in transaction mode in front of ``server_dsn``.

    Skips without the binary, fails under CI=true.
    """
    from dataoad.testing._pgbouncer import PgBouncer
    from dataoad.testing._postgres_server import PostgresUnavailableError

    bouncer = PgBouncer(server_dsn, pool_size=pool_size)
    try:
        bouncer.start()
    except (PostgresUnavailableError, OSError) as exc:
        bouncer.cleanup()
        unavailable(f"PgBouncer unavailable: {exc}")
    try:
        yield bouncer
    finally:
        bouncer.cleanup()


@dataclass(frozen=True)
class PostgresRoute:
    """How a ledger reaches the server: straight, or through a transaction pooler.

    ``dsn`` is what the ledger connects to, ``server_dsn`` the server itself
    (a test's own admin and blocking sessions), ``options`` what the ledger
    needs on this route (``transaction_pooling=True`` behind PgBouncer).
    """

    name: str
    dsn: str
    server_dsn: str
    options: dict[str, Any] = field(default_factory=dict)

    @property
    def pooled(self) -> bool:
        """Whether a transaction pooler sits between the ledger and the server."""
        return bool(self.options.get("transaction_pooling"))

    def ledger(self, dsn: str | None = None, **options: Any) -> Any:
        """A PostgresLedger on this route (``dsn`` replaces the route's, e.g. a proxy's)."""
        from dataoad import PostgresLedger

        return PostgresLedger(dsn or self.dsn, **{**self.options, **options})
