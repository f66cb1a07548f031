"""The PostgreSQL ledger's schema steps, applied by ``migrate()`` in one locked transaction.

Kept apart from the ledger so the schema's history reads in one place.
"""

from __future__ import annotations

import re
from typing import Final

from dataoad._errors import DataoadError, InvalidArgumentError

__all__ = ["MIGRATIONS", "SCHEMA_VERSION", "LedgerSchemaError", "check_name"]

#: The schema version this code writes and understands.
SCHEMA_VERSION: Final = 4


class LedgerSchemaError(DataoadError):
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
