"""PostgresLedger: receipts in PostgreSQL, shared by contenders on many hosts.

Design notes (the why):

* Built on asyncpg: 56-69 % of pgbench's rate, psycopg 3 48-61 %
  (``benchmarks/postgres_drivers.py``).
* Every transition is one autocommit statement whose returned row says
  whether it applied (``INSERT ... ON CONFLICT DO NOTHING RETURNING``,
  ``UPDATE ... WHERE version = $n RETURNING``): one round trip, no
  ``BEGIN``/``COMMIT``, correct under READ COMMITTED (a concurrent update
  makes the condition false on re-check) and under SERIALIZABLE (where the
  loser gets a serialization failure instead, which the runner treats like
  any unproven write).
* No reset query on release; consecutive statements share one held
  connection (``_postgres_lane``). ``synchronous_commit`` is never lowered.
* Schema changes are explicit (``await ledger.migrate()`` or ``dataoad
  ledger migrate DSN``), serialised across hosts by a transaction-scoped
  advisory lock. A ledger refuses a database whose schema is missing or
  newer than it understands.
* Reads are retried once on a broken connection; writes never are (read back).
* The operator audit is a table beside the receipts (``_postgres_audit``).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from datetime import datetime
from types import TracebackType
from typing import Any, Final

from dataoad._clock import LedgerClock
from dataoad._errors import LedgerClosedError, LedgerUnusableError, MissingExtraError
from dataoad._forks import FORKED_ADVICE, generation
from dataoad._ledger_arguments import (
    check_claim,
    check_key,
    check_listing,
    check_receipt,
    checked_action_id,
    checked_count,
    checked_lease,
    checked_older_than,
    required_lease,
)
from dataoad._ledger_rules import check_ledger_clock
from dataoad._receipt import ActionReceipt
from dataoad._status import ActionStatus, ClaimState
from dataoad.ledgers._audit import AuditStatements
from dataoad.ledgers._codec import receipt_of, values_of
from dataoad.ledgers._durability import DurabilityReport, opened, postgres_durability
from dataoad.ledgers._postgres_audit import PostgresAudit
from dataoad.ledgers._postgres_backend import Backends
from dataoad.ledgers._postgres_claim import claim_answer, rerun_answers
from dataoad.ledgers._postgres_lane import (
    ConnectionLane,
    read_once_more,
    write_conditionally,
)
from dataoad.ledgers._postgres_options import check_options
from dataoad.ledgers._postgres_pooler import behind_transaction_pooler, create_ledger_pool
from dataoad.ledgers._postgres_retention import PostgresRetention
from dataoad.ledgers._postgres_schema import MIGRATIONS as MIGRATIONS
from dataoad.ledgers._postgres_schema import (
    SCHEMA_VERSION,
    LedgerSchemaError,
    apply_migrations,
    audit_table,
    check_name,
    check_schema_version,
    read_schema_version,
)
from dataoad.ledgers._statements import POSTGRES, Statement, Statements

__all__ = ["SCHEMA_VERSION", "LedgerSchemaError", "MissingExtraError", "PostgresLedger"]

#: Seconds a statement may take on the client's side unless told otherwise.
DEFAULT_COMMAND_TIMEOUT: Final = 5.0


def _asyncpg() -> Any:
    try:
        import asyncpg
    except ImportError as exc:
        raise MissingExtraError.for_extra(
            "PostgresLedger", "the asyncpg driver", "postgres"
        ) from exc
    return asyncpg


class PostgresLedger(PostgresAudit, PostgresRetention):
    """A ledger in a PostgreSQL table, for contenders on several hosts.

    ``PostgresLedger(dsn)`` builds its own asyncpg pool on first use;
    ``PostgresLedger(pool=pool)`` uses yours and never closes it. Create the
    table first (``await ledger.migrate()`` or ``dataoad ledger migrate``).
    ``command_timeout`` (seconds; None for none) bounds every statement on
    the client, so a silent partition fails in time and a connection left in
    doubt is terminated, never reused; ``statement_timeout`` bounds it on the
    server, ``connect_timeout`` a new connection. ``transaction_pooling``
    None finds a transaction pooler (PgBouncer) when the ledger connects and
    then keeps nothing in a session; True or False says so. A write rolled
    back by a serialization failure or deadlock re-runs up to
    ``serialization_retries`` times. Leases are judged by the server's clock
    (``clock`` replaces it, for tests only). Needs the ``postgres`` extra.
    """

    def __init__(
        self,
        dsn: str | None = None,
        *,
        pool: Any = None,
        schema: str = "public",
        table: str = "dataoad_receipts",
        min_size: int = 1,
        max_size: int = 10,
        statement_timeout: float | None = None,
        serialization_retries: int = 5,
        connect_timeout: float = 10.0,
        clock: LedgerClock | None = None,
        command_timeout: float | None = DEFAULT_COMMAND_TIMEOUT,
        transaction_pooling: bool | None = None,
    ) -> None:
        check_options(
            dsn=dsn,
            pool=pool,
            min_size=min_size,
            max_size=max_size,
            statement_timeout=statement_timeout,
            connect_timeout=connect_timeout,
            command_timeout=command_timeout,
            serialization_retries=serialization_retries,
            transaction_pooling=transaction_pooling,
        )
        self._transaction_pooling = transaction_pooling
        self._command_timeout = None if command_timeout is None else float(command_timeout)
        self._connect_timeout = float(connect_timeout)
        # None: the server's clock, read inside each statement (the default).
        self._clock = None if clock is None else check_ledger_clock(clock)
        self._serialization_retries = serialization_retries
        self._driver = _asyncpg()
        self.schema = check_name("schema", schema)
        self.table = check_name("table", table)
        self._dsn = dsn
        self._pool: Any = pool
        self._owns_pool = pool is None
        self._min_size = min_size
        self._max_size = max_size
        self._statement_timeout = statement_timeout
        self._open_lock: asyncio.Lock | None = None
        self._lane: ConnectionLane | None = None
        self._backends: Backends | None = None
        self._checked = False
        self._closed = False
        self._opened_in = generation()
        qualified = f'"{self.schema}"."{self.table}"'
        self._qualified = qualified
        self._sql = Statements(qualified, POSTGRES)
        self._audit_sql = AuditStatements(
            audit_table(self.schema, self.table), POSTGRES, self._qualified
        )

    def __repr__(self) -> str:
        state = "closed" if self._closed else ("open" if self._pool else "not yet opened")
        return f"PostgresLedger(table={self._qualified}, {state})"

    async def __aenter__(self) -> PostgresLedger:
        try:
            await self._raw_pool()
        except BaseException:
            await self.close()
            raise
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    # -- lifecycle -----------------------------------------------------------

    async def _raw_pool(self) -> Any:
        if self._closed:
            raise LedgerClosedError(f"{self!r} is closed")
        if self._pool is not None:
            if self._opened_in != generation():
                # Its connections' sockets are the parent's: a statement sent
                # here would interleave with the parent's on the same session.
                raise LedgerUnusableError(
                    f"{self!r} was connected before this process forked: {FORKED_ADVICE}"
                )
            return self._pool
        if self._open_lock is None:
            self._open_lock = asyncio.Lock()
        async with self._open_lock:
            if self._pool is None:
                # Behind a transaction pooler no session outlives a transaction:
                # no named prepared statement, no startup setting (PgBouncer refuses them).
                pooled = self._transaction_pooling
                if pooled is None:
                    assert self._dsn is not None  # a given pool returned above
                    pooled = await behind_transaction_pooler(
                        self._driver, self._dsn, self._statement_timeout, self._connect_timeout
                    )
                    self._transaction_pooling = pooled
                # Straight to the server, each connection's backend can be
                # named, and ended when a write on it is left in doubt.
                backends = None if pooled else Backends(self._connect_timeout)
                pool = await create_ledger_pool(
                    self._driver,
                    self._dsn,
                    pooled=pooled,
                    statement_timeout=self._statement_timeout,
                    sizes=(self._min_size, self._max_size),
                    connect_timeout=self._connect_timeout,
                    init=None if backends is None else backends.note,
                )
                self._backends = backends
                if self._closed:
                    # close() ran while the pool was made and found nothing to
                    # close: a closed ledger serves nothing, so this is closed.
                    await pool.close()
                    raise LedgerClosedError(f"{self!r} was closed while it opened")
                self._pool = pool
                self._opened_in = generation()
        assert self._pool is not None
        return self._pool

    async def _ready_pool(self) -> Any:
        pool = await self._raw_pool()
        if not self._checked:
            check_schema_version(await self.schema_version(), self._qualified)
            self._checked = True
        return pool

    async def close(self) -> None:
        """Close the pool the ledger created (never a pool it was given). Idempotent."""
        self._closed = True
        if self._pool is not None and self._opened_in != generation():
            # The parent's sessions: ending them from here would end the parent's.
            self._pool = self._lane = self._backends = None
            return
        if self._lane is not None:
            await self._lane.close()  # kept: once closing, it takes no connection
        if self._backends is not None and self._pool is not None:
            # The backends being ended need the pool.
            await self._backends.close(self._pool, self._command_timeout)
        pool, self._pool = self._pool, None
        if pool is not None and self._owns_pool:
            await pool.close()

    @classmethod
    async def open(
        cls, dsn: str | None = None, *, require_durable: bool = False, **options: Any
    ) -> PostgresLedger:
        """Connected; ``require_durable``: LedgerDurabilityError unless durable (then closed)."""
        return await opened(cls(dsn, **options), require_durable)  # type: ignore[no-any-return]

    async def durability(self) -> DurabilityReport:
        """Whether the server keeps every claim it acknowledged, through a crash or a
        failover: ``synchronous_commit``, ``fsync``, ``full_page_writes``, the standbys."""
        lane = self._lane_of(await self._raw_pool())
        timeout, driver = self._command_timeout, self._driver
        return await postgres_durability(lambda sql: read_once_more(lane, sql, (), timeout, driver))

    # -- schema ----------------------------------------------------------------

    async def schema_version(self) -> int | None:
        """The ledger schema version in the database, or None before ``migrate()``."""
        pool = await self._raw_pool()
        return await read_schema_version(pool, self.schema, self.table, self._command_timeout)

    async def migrate(self) -> int:
        """Create or upgrade the schema to SCHEMA_VERSION; returns the version it found.

        Safe to run from several hosts at once: the steps run in one
        transaction that holds an advisory lock named after the table.
        Refuses (LedgerSchemaError) a schema newer than this code.
        """
        pool = await self._raw_pool()
        # The checkout is bounded; the steps are not (a large table's may take long).
        async with pool.acquire(timeout=self._command_timeout) as conn:
            found = await apply_migrations(conn, self.schema, self.table)
        self._checked = False
        return found

    # -- statements ----------------------------------------------------------

    def _lane_of(self, pool: Any) -> ConnectionLane:
        if self._lane is None or self._lane.pool is not pool:
            # A statement that passed its checks before close() began must
            # never take a connection that close() would then wait for.
            held = self._owns_pool and not self._closed
            self._lane = ConnectionLane(
                pool, owned=held, timeout=self._command_timeout, backends=self._backends
            )
        return self._lane

    async def _read(self, sql: str, *args: Any) -> list[Any]:
        pool = await self._ready_pool()
        return await read_once_more(
            self._lane_of(pool), sql, args, self._command_timeout, self._driver
        )

    async def _write(self, sql: str, *args: Any) -> bool:
        return bool(await self._write_rows(sql, *args))

    async def _write_rows(
        self,
        sql: str,
        *args: Any,
        conditional: bool = True,
        rerun_proves: Callable[[list[Any]], bool] | None = None,
    ) -> list[Any]:
        pool = await self._ready_pool()
        return await write_conditionally(
            self._lane_of(pool),
            sql,
            args,
            self._command_timeout,
            self._driver,
            self._serialization_retries,
            conditional=conditional,
            rerun_proves=rerun_proves,
        )

    # -- the Ledger protocol -------------------------------------------------

    def _now(self) -> datetime | None:
        return None if self._clock is None else self._clock()

    async def claim(
        self, receipt: ActionReceipt, *, lease: float | None = None
    ) -> tuple[ActionReceipt, bool]:
        """Insert the claim unless its action name and key are taken."""
        check_claim(receipt)
        lease = checked_lease(lease)
        claim = self._sql["claim_or_held"]
        while True:
            values = {**values_of(receipt), "now": self._now(), "lease": lease}
            rows = await self._write_rows(
                claim.sql, *claim.bind(values), rerun_proves=rerun_answers(receipt)
            )
            if rows:
                return claim_answer(receipt, rows[0])
            # Held by a claim committed after the statement's snapshot (or
            # one released in between): look again, then try again.
            existing = await self.find(
                receipt.action_name, receipt.idempotency_key, receipt.namespace
            )
            if existing is not None:
                return existing, False

    async def get(self, action_id: str) -> ActionReceipt | None:
        """The receipt with this action id, or None."""
        checked_action_id(action_id)
        get = self._sql["get"]
        rows = await self._read(get.sql, *get.bind({"action_id": action_id}))
        return receipt_of(rows[0]) if rows else None

    async def find(
        self, action_name: str, idempotency_key: str, namespace: str = ""
    ) -> ActionReceipt | None:
        """The receipt holding this key in ``namespace``, or None."""
        check_key(action_name, idempotency_key, namespace)
        find = self._sql["find"]
        rows = await self._read(
            find.sql,
            *find.bind(
                {
                    "namespace": namespace,
                    "action_name": action_name,
                    "idempotency_key": idempotency_key,
                }
            ),
        )
        return receipt_of(rows[0]) if rows else None

    async def _run(self, statement: Statement, values: dict[str, Any]) -> bool:
        return await self._write(statement.sql, *statement.bind(values))

    async def _transition(
        self, statement: Statement, receipt: ActionReceipt, **condition: Any
    ) -> bool:
        values = values_of(receipt)
        values.update(previous_version=receipt.version - 1, **condition)
        return await self._run(statement, values)

    async def start_attempt(self, receipt: ActionReceipt, *, lease: float | None = None) -> bool:
        """Store the next attempt (restarting the lease) if the stored claim allows that step."""
        check_receipt(receipt)
        lease = checked_lease(lease)
        if receipt.claim_state is not ClaimState.PENDING or len(receipt.attempt_records) != (
            receipt.attempts
        ):
            return False
        return await self._transition(
            self._sql["start_attempt"],
            receipt,
            previous_attempts=receipt.attempts - 1,
            now=self._now(),
            lease=lease,
        )

    async def record(self, receipt: ActionReceipt) -> bool:
        """Store the next version if the stored claim allows exactly that step."""
        check_receipt(receipt)
        if len(receipt.attempt_records) != receipt.attempts:
            return False
        return await self._transition(self._sql["record"], receipt, now=self._now())

    async def take_over(self, receipt: ActionReceipt, *, lease: float) -> bool:
        """Hand an expired claim to ``receipt.owner`` under the next fencing token."""
        check_receipt(receipt)
        lease = required_lease(lease)
        if receipt.claim_state is not ClaimState.PENDING:
            return False
        return await self._transition(self._sql["take_over"], receipt, now=self._now(), lease=lease)

    async def renew(self, action_id: str, fencing_token: int, lease: float) -> bool:
        """Restart the lease of a PENDING claim still held under ``fencing_token``."""
        checked_action_id(action_id)
        checked_count("fencing_token", fencing_token, 1)
        lease = required_lease(lease)
        return await self._run(
            self._sql["renew"],
            {
                "action_id": action_id,
                "fencing_token": fencing_token,
                "now": self._now(),
                "lease": lease,
            },
        )

    async def release(self, action_id: str, version: int) -> bool:
        """Delete an unstarted PENDING claim at exactly ``version``."""
        checked_action_id(action_id)
        checked_count("version", version, 1)
        return await self._run(self._sql["release"], {"action_id": action_id, "version": version})

    async def retire(self, receipt: ActionReceipt, *, older_than: float | None = None) -> bool:
        """Free the key of a definitive receipt at exactly the previous version.

        With ``older_than``, only if it was stored at least that many seconds
        ago by the server's clock (an expiry), judged inside the statement.
        """
        check_receipt(receipt)
        older_than = checked_older_than(older_than)
        if receipt.retired_at is None:
            return False
        return await self._transition(
            self._sql["retire"], receipt, now=self._now(), older_than=older_than
        )

    # -- inspection ------------------------------------------------------------

    async def receipts(
        self,
        *,
        final_status: ActionStatus | None = None,
        pending: bool | None = None,
        stale: bool | None = None,
        action_name: str | None = None,
        idempotency_key: str | None = None,
        action_id_prefix: str | None = None,
        since: datetime | None = None,
        limit: int | None = None,
        namespace: str | None = None,
        newest_first: bool = False,
    ) -> list[ActionReceipt]:
        """Stored receipts, oldest first, optionally filtered (``since``: created at or after)."""
        check_listing(
            final_status=final_status,
            pending=pending,
            stale=stale,
            action_name=action_name,
            idempotency_key=idempotency_key,
            action_id_prefix=action_id_prefix,
            since=since,
            limit=limit,
            namespace=namespace,
            newest_first=newest_first,
        )
        listing, values = self._sql.listing(
            namespace=namespace,
            final_status=final_status,
            pending=pending,
            stale=stale,
            now=self._now(),
            action_name=action_name,
            idempotency_key=idempotency_key,
            action_id_prefix=action_id_prefix,
            since=since,
            limit=limit,
            newest_first=newest_first,
        )
        return [receipt_of(row) for row in await self._read(listing.sql, *listing.bind(values))]
