"""The SQLite ledger's schema steps: each file version migrates to the next on open.

Kept apart from the ledger so the schema's history reads in one place.
"""

from __future__ import annotations

from typing import Final

from dataoad.ledgers._audit import sqlite_receipt_records
from dataoad.ledgers._codec import COLUMNS

__all__ = ["MIGRATIONS"]

#: The columns of a schema 3 file, all kept by the step to schema 4.
_V3_COLUMNS: Final = ", ".join(
    c for c in COLUMNS if c not in ("namespace", "retired_at", "stored_at", "operator_records")
)

#: Schema steps: applying MIGRATIONS[v] to a version v-1 file gives version v.
MIGRATIONS: Final[dict[int, tuple[str, ...]]] = {
    1: (
        """
        CREATE TABLE receipts (
            action_id TEXT PRIMARY KEY,
            action_name TEXT NOT NULL,
            idempotency_key TEXT NOT NULL,
            request_hash TEXT NOT NULL,
            provider_reference TEXT,
            risk TEXT,
            claim_state TEXT NOT NULL CHECK (claim_state IN ('PENDING', 'COMPLETED')),
            attempts INTEGER NOT NULL CHECK (attempts >= 0),
            execution_status TEXT,
            verification_status TEXT,
            final_status TEXT,
            provider_request_id TEXT,
            error TEXT,
            metadata TEXT NOT NULL,
            attempt_records TEXT NOT NULL,
            version INTEGER NOT NULL CHECK (version >= 1),
            created_at TEXT NOT NULL,
            updated_at TEXT NOT NULL,
            UNIQUE (action_name, idempotency_key)
        )
        """,
    ),
    # Operators list stranded and unsettled receipts; keep that an index scan.
    2: ("CREATE INDEX receipts_by_state ON receipts (claim_state, final_status, updated_at)",),
    # Leases (v0.2): claims written before them have no owner and no lease,
    # and hold fencing token 1 (no change of owner yet).
    3: (
        "ALTER TABLE receipts ADD COLUMN owner TEXT",
        "ALTER TABLE receipts ADD COLUMN fencing_token INTEGER NOT NULL DEFAULT 1 "
        "CHECK (fencing_token >= 1)",
        "ALTER TABLE receipts ADD COLUMN lease_expires_at TEXT",
    ),
    # Namespaces and lifecycle (v0.2). The key gains the namespace and is
    # unique only among receipts that hold it (never retired), so SQLite's
    # table constraint is replaced: that means rebuilding the table.
    4: (
        """
        CREATE TABLE receipts_v4 (
            action_id TEXT PRIMARY KEY,
            namespace TEXT NOT NULL DEFAULT '',
            action_name TEXT NOT NULL,
            idempotency_key TEXT NOT NULL,
            request_hash TEXT NOT NULL,
            provider_reference TEXT,
            risk TEXT,
            claim_state TEXT NOT NULL CHECK (claim_state IN ('PENDING', 'COMPLETED')),
            attempts INTEGER NOT NULL CHECK (attempts >= 0),
            execution_status TEXT,
            verification_status TEXT,
            final_status TEXT,
            provider_request_id TEXT,
            error TEXT,
            metadata TEXT NOT NULL,
            attempt_records TEXT NOT NULL,
            version INTEGER NOT NULL CHECK (version >= 1),
            created_at TEXT NOT NULL,
            updated_at TEXT NOT NULL,
            owner TEXT,
            fencing_token INTEGER NOT NULL DEFAULT 1 CHECK (fencing_token >= 1),
            lease_expires_at TEXT,
            retired_at TEXT
        )
        """,
        f"INSERT INTO receipts_v4 ({_V3_COLUMNS}) SELECT {_V3_COLUMNS} FROM receipts",
        "DROP TABLE receipts",
        "ALTER TABLE receipts_v4 RENAME TO receipts",
        "CREATE UNIQUE INDEX receipts_by_key ON receipts (namespace, action_name, "
        "idempotency_key) WHERE retired_at IS NULL",
        # Listings by state, and retention's batches in the order they are
        # read, walk this index (it replaces schema 2's receipts_by_state).
        "CREATE INDEX receipts_by_age ON receipts (claim_state, updated_at, action_id)",
    ),
    # The ledger's own time of storing each version (v0.3): ages are judged
    # by it, never by a writer's updated_at. Rows written before carry their
    # updated_at, the best time they have; retention walks the new order.
    5: (
        "ALTER TABLE receipts ADD COLUMN stored_at TEXT",
        "UPDATE receipts SET stored_at = updated_at",
        "DROP INDEX receipts_by_age",
        "CREATE INDEX receipts_by_age ON receipts (claim_state, stored_at, action_id)",
    ),
    # The operator audit (v0.3): append-only, stamped by the ledger's clock,
    # outliving the receipts it names (retention never touches it).
    6: (
        """
        CREATE TABLE operator_audit (
            seq INTEGER PRIMARY KEY AUTOINCREMENT,
            operator TEXT NOT NULL,
            host TEXT NOT NULL,
            verb TEXT NOT NULL,
            action_id TEXT,
            namespace TEXT,
            reason TEXT,
            outcome TEXT NOT NULL,
            at TEXT NOT NULL
        )
        """,
        "CREATE INDEX operator_audit_by_action ON operator_audit (action_id)",
    ),
    # Each receipt's own operator records (v0.3), a copy the ledger appends
    # to with each audit record; rebuilt here from the audit for receipts
    # that already have records.
    7: (
        "ALTER TABLE receipts ADD COLUMN operator_records TEXT NOT NULL DEFAULT '[]'",
        "UPDATE receipts SET operator_records = "
        + sqlite_receipt_records("operator_audit", "receipts.action_id")
        + " WHERE action_id IN (SELECT action_id FROM operator_audit)",
    ),
}
