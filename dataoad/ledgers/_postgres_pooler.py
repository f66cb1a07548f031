"""Whether a transaction pooler (PgBouncer, pgcat, Odyssey, ...) sits in front of the server.

Behind a pooler in transaction mode each transaction may run on another
server connection, so a client may keep nothing in a session: no named
prepared statement, no startup setting. A pooler answers the client's
startup with a cancel key of its own (it must route cancel requests
itself), so the process id a connection was given differs from the
backend's ``pg_backend_pid()``; straight to the server (or through a plain
TCP proxy, which keeps one server session per client) they are equal.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from dataoad.ledgers._postgres_lane import no_reset
from dataoad.ledgers._postgres_options import check_pooled

__all__ = ["behind_transaction_pooler", "create_ledger_pool"]


async def create_ledger_pool(
    driver: Any,
    dsn: str | None,
    *,
    pooled: bool,
    statement_timeout: float | None,
    sizes: tuple[int, int],
    connect_timeout: float,
    init: Callable[[Any], Awaitable[None]] | None = None,
) -> Any:
    """The ledger's connection pool; ``pooled``: keeping nothing in a session.

    ``init`` runs on each new connection (see ``Backends.note``).
    """
    settings = {} if pooled else {"application_name": "dataoad"}
    if statement_timeout is not None:
        settings["statement_timeout"] = str(int(statement_timeout * 1000))
    return await driver.create_pool(
        dsn,
        min_size=sizes[0],
        max_size=sizes[1],
        reset=no_reset,
        server_settings=settings,
        timeout=connect_timeout,
        init=init,
        **({"statement_cache_size": 0} if pooled else {}),
    )


async def behind_transaction_pooler(
    driver: Any, dsn: str, statement_timeout: float | None, connect_timeout: float
) -> bool:
    """Probe ``dsn`` once on a connection that keeps no session state, then close it.

    Raises InvalidArgumentError when a pooler is found and the ledger was
    given an option that only a session can keep.
    """
    conn = await driver.connect(dsn, timeout=connect_timeout, statement_cache_size=0)
    try:
        backend = await conn.fetchval("SELECT pg_backend_pid()", timeout=connect_timeout)
        pooled = bool(conn.get_server_pid() != backend)
    finally:
        await conn.close(timeout=connect_timeout)
    if pooled:
        check_pooled(statement_timeout)
    return pooled
