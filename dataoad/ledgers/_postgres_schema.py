"""The PostgreSQL ledger's schema steps, applied by ``migrate()`` in one locked transaction.

Kept apart from the ledger so the schema's history reads in one place.
"""

from __future__ import annotations

import re
from typing import Any, Final

from dataoad._errors import InvalidArgumentError, LedgerUnusableError
from dataoad.ledgers._audit import postgres_receipt_records
from dataoad.ledgers._postgres_lane import fetch_bounded

__all__ = [
    "MIGRATIONS",
    "SCHEMA_VERSION",
    "LedgerSchemaError",
    "apply_migrations",
    "audit_table",
    "check_name",
    "check_schema_version",
    "read_schema_version",
]

#: The schema version this code writes and understands.
SCHEMA_VERSION: Final = 6


class LedgerSchemaError(LedgerUnusableError):
    """The database has no ledger schema yet, or a newer one; nothing was changed."""


#: Schema steps: MIGRATIONS[v] takes a version v-1 database to version v.
#: ``{table}`` is filled in with the quoted, validated name, ``{key_index}``
#: with the name of the key's index.
#:
#: No index beyond the two keys: every transition then changes only
#: unindexed columns, so PostgreSQL can update the row in place (a HOT
#: update, helped by the fillfactor) instead of writing index entries on
#: each of the three steps. Operators' listings scan the table; they are rare.
MIGRATIONS: Final[dict[int, tuple[str, ...]]] = {
    1: (
        """
        CREATE TABLE {table} (
            action_id text PRIMARY KEY,
            action_name text NOT NULL,
            idempotency_key text NOT NULL,
            request_hash text NOT NULL,
            provider_reference text,
            risk text,
            claim_state text NOT NULL CHECK (claim_state IN ('PENDING', 'COMPLETED')),
            attempts integer NOT NULL CHECK (attempts >= 0),
            execution_status text,
            verification_status text,
            final_status text,
            provider_request_id text,
            error text,
            metadata text NOT NULL,
            attempt_records text NOT NULL,
            version integer NOT NULL CHECK (version >= 1),
            created_at timestamptz NOT NULL,
            updated_at timestamptz NOT NULL,
            UNIQUE (action_name, idempotency_key)
        ) WITH (fillfactor = 80)
        """,
    ),
    # Leases (v0.2). Claims written before them have no owner and no lease,
    # and hold fencing token 1. Adding columns with constant defaults
    # rewrites no rows (PostgreSQL 11 and later).
    2: (
        "ALTER TABLE {table} ADD COLUMN owner text",
        "ALTER TABLE {table} ADD COLUMN fencing_token integer NOT NULL DEFAULT 1 "
        "CHECK (fencing_token >= 1)",
        "ALTER TABLE {table} ADD COLUMN lease_expires_at timestamptz",
    ),
    # Namespaces and lifecycle (v0.2). The key gains the namespace and is
    # unique only among receipts that hold it (never retired): a partial
    # unique index replaces the table constraint, whatever PostgreSQL named it.
    # The index is built inside the migration's transaction, so writers wait
    # for it once (CONCURRENTLY cannot run in a transaction).
    3: (
        "ALTER TABLE {table} ADD COLUMN namespace text NOT NULL DEFAULT ''",
        "ALTER TABLE {table} ADD COLUMN retired_at timestamptz",
        "CREATE UNIQUE INDEX {key_index} ON {table} (namespace, action_name, idempotency_key) "
        "WHERE retired_at IS NULL",
        """
        DO $$
        DECLARE constraint_name text;
        BEGIN
            FOR constraint_name IN
                SELECT conname FROM pg_constraint
                WHERE conrelid = '{table}'::regclass AND contype = 'u'
            LOOP
                EXECUTE format('ALTER TABLE {table} DROP CONSTRAINT %I', constraint_name);
            END LOOP;
        END
        $$
        """,
    ),
    # The ledger's own time of storing each version (v0.3), from the
    # server's clock: ages are judged by it, never by a client's updated_at.
    # Rows written before carry their updated_at, the best time they have.
    4: (
        "ALTER TABLE {table} ADD COLUMN stored_at timestamptz",
        "UPDATE {table} SET stored_at = updated_at",
    ),
    # The operator audit (v0.3): append-only, stamped by the server's clock,
    # outliving the receipts it names (retention never touches it).
    5: (
        """
        CREATE TABLE {audit_table} (
            seq bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
            operator text NOT NULL,
            host text NOT NULL,
            verb text NOT NULL,
            action_id text,
            namespace text,
            reason text,
            outcome text NOT NULL,
            at timestamptz NOT NULL
        )
        """,
        "CREATE INDEX {audit_index} ON {audit_table} (action_id)",
    ),
    # Each receipt's own operator records (v0.3), a copy the ledger appends
    # to with each audit record; rebuilt here from the audit for receipts
    # that already have records.
    6: (
        "ALTER TABLE {table} ADD COLUMN operator_records text NOT NULL DEFAULT '[]'",
        "UPDATE {table} AS r SET operator_records = "
        + postgres_receipt_records("{audit_table}", "r.action_id")
        + " WHERE EXISTS (SELECT 1 FROM {audit_table} AS b WHERE b.action_id = r.action_id)",
    ),
}


_NAME: Final = re.compile(r"[a-z_][a-z0-9_]{0,47}")


def check_name(kind: str, value: object) -> str:
    """A schema or table name: a lower-case SQL identifier, so it is quoted safely."""
    if type(value) is not str or not _NAME.fullmatch(value):
        raise InvalidArgumentError(
            f"{kind} must be a lower-case SQL identifier of at most 48 characters "
            f"([a-z_][a-z0-9_]*), not {value!r}"
        )
    return value


def audit_table(schema: str, table: str) -> str:
    """The quoted name of the ledger's operator audit table."""
    return f'"{schema}"."{table}_audit"'


def _version_table(schema: str, table: str) -> str:
    return f'"{schema}"."{table}_schema"'


async def read_schema_version(
    pool: Any, schema: str, table: str, limit: float | None = None
) -> int | None:
    """The ledger schema version of ``schema.table``, or None before it was migrated.

    Each read within ``limit`` seconds, its connection's checkout too: the
    first call of a ledger reads this, and a server that stopped answering
    must not hold it (or its cancellation) for good.
    """
    args = (f"{schema}.{table}_schema",)
    exists = await fetch_bounded(pool, "SELECT to_regclass($1) IS NOT NULL", args, limit)
    if not exists[0][0]:
        return None
    sql = f"SELECT max(version) FROM {_version_table(schema, table)}"
    version = (await fetch_bounded(pool, sql, (), limit))[0][0]
    return None if version is None else int(version)


async def apply_migrations(conn: Any, schema: str, table: str) -> int:
    """Bring ``schema.table`` to SCHEMA_VERSION in one locked transaction; the version found."""
    qualified = f'"{schema}"."{table}"'
    versions = _version_table(schema, table)
    async with conn.transaction():
        await conn.execute("SELECT pg_advisory_xact_lock(hashtext($1))", f"dataoad:{qualified}")
        await conn.execute(f'CREATE SCHEMA IF NOT EXISTS "{schema}"')
        await conn.execute(
            f"CREATE TABLE IF NOT EXISTS {versions} ("
            "version integer PRIMARY KEY, applied_at timestamptz NOT NULL DEFAULT now())"
        )
        found = int(await conn.fetchval(f"SELECT max(version) FROM {versions}") or 0)
        if found > SCHEMA_VERSION:
            raise LedgerSchemaError(
                f"{qualified} has ledger schema {found}, newer than the "
                f"{SCHEMA_VERSION} this Dataoad understands; upgrade Dataoad"
            )
        for step in range(found + 1, SCHEMA_VERSION + 1):
            for statement in MIGRATIONS[step]:
                await conn.execute(
                    statement.format(
                        table=qualified,
                        key_index=f'"{table}_live_key"',
                        audit_table=audit_table(schema, table),
                        audit_index=f'"{table}_audit_ix"',
                    )
                )
            await conn.execute(f"INSERT INTO {versions} (version) VALUES ($1)", step)
    return found


def check_schema_version(version: int | None, qualified: str) -> None:
    """LedgerSchemaError unless ``version`` is the one this code writes."""
    if version is None:
        raise LedgerSchemaError(
            f"{qualified} does not exist; create it with `await ledger.migrate()` "
            "or `dataoad ledger migrate DSN`"
        )
    if version > SCHEMA_VERSION:
        raise LedgerSchemaError(
            f"{qualified} has ledger schema {version}, newer than the "
            f"{SCHEMA_VERSION} this Dataoad understands; upgrade Dataoad"
        )
    if version < SCHEMA_VERSION:
        raise LedgerSchemaError(
            f"{qualified} has ledger schema {version}; run `dataoad ledger "
            f"migrate DSN` to bring it to {SCHEMA_VERSION}"
        )
