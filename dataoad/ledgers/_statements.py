"""The SQL of the SQL ledgers, written once and bound by column name.

Each statement is written with ``:name`` parameters and compiled for a
dialect: SQLite's ``?`` (one per occurrence) or PostgreSQL's ``$n`` (one
per distinct name). ``Statement.bind`` turns a mapping of names to values
into the driver's positional arguments, so no call site counts positions.
Every value is a bound parameter; only identifiers checked by the ledger
(its table name) are written into the text.
"""

from __future__ import annotations

import dataclasses
import operator
import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Final

from dataoad._status import ActionStatus
from dataoad.ledgers._codec import COLUMNS, MUTABLE, NO_OPERATOR_RECORDS, WRITTEN

__all__ = ["MADE", "Dialect", "POSTGRES", "SQLITE", "Statement", "Statements"]

#: What a claim just made returns: what the ledger stamped on it, beside its id.
MADE: Final = ("action_id", "lease_expires_at", "stored_at")

_PARAMETER = re.compile(r":([a-z_][a-z0-9_]*)\b")


@dataclasses.dataclass(frozen=True, slots=True)
class Dialect:
    """How one database writes parameters and null-safe equality."""

    name: str
    numbered: bool  # $1, $2 ... (PostgreSQL) instead of ? (SQLite)
    null_safe_equal: str
    #: The ledger's clock, read inside the statement.
    now: str
    #: When a lease granted now runs out (NULL: no lease).
    lease_end: str
    #: The ledger's now less ``older_than`` seconds (NULL: no age asked for).
    cutoff: str


# SQLite's clock is the ledger process's own (one host shares the file); the
# ledger binds it as text that sorts like the time. PostgreSQL reads the
# server's clock unless a test binds one.
SQLITE: Final = Dialect(
    "sqlite",
    numbered=False,
    null_safe_equal="IS",
    now=":now",
    lease_end=":lease_end",
    cutoff=":cutoff",
)
_PG_NOW: Final = "COALESCE(CAST(:now AS timestamptz), clock_timestamp())"
POSTGRES: Final = Dialect(
    "postgres",
    numbered=True,
    null_safe_equal="IS NOT DISTINCT FROM",
    now=_PG_NOW,
    lease_end=f"({_PG_NOW} + CAST(:lease AS double precision) * interval '1 second')",
    cutoff=f"({_PG_NOW} - CAST(:older_than AS double precision) * interval '1 second')",
)


@dataclasses.dataclass(frozen=True, slots=True)
class Statement:
    """SQL text for one dialect and the parameter names its placeholders stand for."""

    sql: str
    names: tuple[str, ...]
    _pick: Callable[[Mapping[str, Any]], Any] = dataclasses.field(
        init=False, repr=False, compare=False
    )

    def __post_init__(self) -> None:
        # Every write binds 30 to 40 values: one C call, not a generator.
        pick = operator.itemgetter(*self.names) if self.names else (lambda values: ())
        object.__setattr__(self, "_pick", pick)

    def bind(self, values: Mapping[str, Any]) -> tuple[Any, ...]:
        """The positional arguments for ``values`` (KeyError names a missing one)."""
        picked = self._pick(values)
        return (picked,) if len(self.names) == 1 else picked


def compile_sql(template: str, dialect: Dialect) -> Statement:
    """``template`` with its ``:name`` parameters written for ``dialect``."""
    names: list[str] = []

    def placeholder(match: re.Match[str]) -> str:
        name = match.group(1)
        if not dialect.numbered:
            names.append(name)
            return "?"
        if name not in names:
            names.append(name)
        return f"${names.index(name) + 1}"

    return Statement(_PARAMETER.sub(placeholder, template), tuple(names))


class Statements:
    """Every statement a SQL ledger runs, for one table in one dialect."""

    def __init__(self, table: str, dialect: Dialect) -> None:
        self.dialect = dialect
        self._table = table
        self.select = f"SELECT {', '.join(COLUMNS)} FROM {table}"
        eq = dialect.null_safe_equal
        now, lease_end = dialect.now, dialect.lease_end
        stale = f"claim_state = 'PENDING' AND lease_expires_at <= {now}"
        # A claim just made comes back as what the ledger stamped on it (its
        # caller has the rest), NULL elsewhere: a whole row costs the driver
        # two dozen values to decode on every first call.
        made_row = ", ".join(c if c in MADE else "NULL" for c in COLUMNS)
        self._stale = stale
        sql = {
            "claim": (
                f"INSERT INTO {table} ({', '.join(COLUMNS)}) "
                f"VALUES ({', '.join(f':{c}' for c in WRITTEN)}, {lease_end}, {now}, "
                f"'{NO_OPERATOR_RECORDS}') "
                # Only a receipt that holds its key conflicts (see _lifecycle).
                "ON CONFLICT (namespace, action_name, idempotency_key) "
                "WHERE retired_at IS NULL DO NOTHING "
                f"RETURNING {', '.join(MADE)}"
            ),
            "get": f"{self.select} WHERE action_id = :action_id",
            # The claim, folded with the lookup of its key into one round
            # trip (PostgreSQL: a data-modifying WITH): the new claim, or the
            # receipt holding the key. A held key inserts no tuple, so a
            # replay writes nothing. No row comes back when the holder
            # committed after this statement's snapshot; the caller reads again.
            "claim_or_held": (
                f"WITH made AS (INSERT INTO {table} ({', '.join(COLUMNS)}) "
                f"VALUES ({', '.join(f':{c}' for c in WRITTEN)}, {lease_end}, {now}, "
                f"'{NO_OPERATOR_RECORDS}') "
                "ON CONFLICT (namespace, action_name, idempotency_key) "
                f"WHERE retired_at IS NULL DO NOTHING RETURNING {', '.join(MADE)}) "
                f"SELECT {made_row}, true FROM made UNION ALL "
                f"SELECT {', '.join(COLUMNS)}, false FROM {table} "
                "WHERE namespace = :namespace AND action_name = :action_name "
                "AND idempotency_key = :idempotency_key AND retired_at IS NULL "
                "AND NOT EXISTS (SELECT 1 FROM made)"
            ),
            "find": (
                f"{self.select} WHERE namespace = :namespace AND action_name = :action_name "
                "AND idempotency_key = :idempotency_key AND retired_at IS NULL"
            ),
            "release": (
                f"DELETE FROM {table} WHERE action_id = :action_id AND version = :version "
                "AND claim_state = 'PENDING' AND attempts = 0 RETURNING action_id"
            ),
            "renew": (
                f"UPDATE {table} SET lease_expires_at = {lease_end} "
                "WHERE action_id = :action_id AND claim_state = 'PENDING' "
                "AND fencing_token = :fencing_token RETURNING action_id"
            ),
        }
        # A transition writes the next version over exactly the previous one,
        # of exactly this claim (identity unchanged), under its own condition,
        # and stamps when it stored it by the ledger's clock.
        columns = ", ".join(f"{c} = :{c}" for c in MUTABLE) + f", stored_at = {now}"
        identity = (
            "WHERE action_id = :action_id AND version = :previous_version "
            "AND namespace = :namespace "
            "AND action_name = :action_name AND idempotency_key = :idempotency_key "
            f"AND request_hash = :request_hash AND provider_reference {eq} :provider_reference "
            f"AND risk {eq} :risk AND created_at = :created_at"
        )
        # Only retiring sets retired_at; every other write keeps it as it was.
        where = f"{identity} AND retired_at {eq} :retired_at"
        # Only a takeover changes the holder; every other write keeps it.
        holder = f"AND owner {eq} :owner AND fencing_token = :fencing_token"
        sql["start_attempt"] = (
            f"UPDATE {table} SET {columns}, lease_expires_at = {lease_end} {where} {holder} "
            "AND claim_state = 'PENDING' AND attempts = :previous_attempts RETURNING action_id"
        )
        sql["record"] = (
            f"UPDATE {table} SET {columns}, lease_expires_at = CASE WHEN "
            f"claim_state = 'PENDING' AND :claim_state = 'PENDING' THEN lease_expires_at END "
            f"{where} {holder} AND attempts = :attempts "
            "AND NOT (claim_state = 'COMPLETED' AND :claim_state = 'PENDING') RETURNING action_id"
        )
        # The content is the version's (written once at that version); only the
        # holder, the version and the update time change, under the next fence.
        sql["take_over"] = (
            f"UPDATE {table} SET owner = :owner, fencing_token = :fencing_token, "
            f"version = :version, updated_at = :updated_at, lease_expires_at = {lease_end}, "
            f"stored_at = {now} "
            f"{where} AND fencing_token + 1 = :fencing_token AND attempts = :attempts "
            f"AND {stale} RETURNING action_id"
        )
        # Retiring frees the key of a definitive outcome and changes nothing
        # else: every other column must already hold what the receipt says.
        # An expiry also asks that the receipt was stored at least
        # ``older_than`` seconds ago, judged here by the ledger's own clock.
        same = " AND ".join(f"{c} {eq} :{c}" for c in MUTABLE if c not in ("version", "updated_at"))
        cutoff = dialect.cutoff
        sql["retire"] = (
            f"UPDATE {table} SET retired_at = :retired_at, version = :version, "
            f"updated_at = :updated_at, stored_at = {now} {identity} AND {same} "
            "AND claim_state = 'COMPLETED' AND final_status IN ('CONFIRMED', 'FAILED') "
            f"AND retired_at IS NULL AND ({cutoff} IS NULL OR stored_at <= {cutoff}) "
            "RETURNING action_id"
        )
        #: The templates, before compiling (for tests that weaken one on purpose).
        self.templates: dict[str, str] = sql
        self._compiled = {name: compile_sql(text, dialect) for name, text in sql.items()}
        self._holders: dict[int, Statement] = {}

    def __getitem__(self, name: str) -> Statement:
        return self._compiled[name]

    def holders(self, count: int) -> Statement:
        """The receipts holding ``count`` keys, read as one (``find`` for many keys).

        Bind ``namespace_N``, ``action_name_N``, ``idempotency_key_N`` and
        ``place_N`` for every N below ``count``; each row comes back with the
        ``place`` of the key it holds first. The keys are joined as rows, so
        each is one search of the key index (an ``IN`` of row values scans it).
        """
        statement = self._holders.get(count)
        if statement is None:
            keys = ", ".join(
                f"(:namespace_{n}, :action_name_{n}, :idempotency_key_{n}, :place_{n})"
                for n in range(count)
            )
            columns = ", ".join(f"r.{c}" for c in COLUMNS)
            statement = self._holders[count] = compile_sql(
                f"SELECT k.column4, {columns} FROM (VALUES {keys}) AS k "
                f"CROSS JOIN {self._table} AS r ON r.namespace = k.column1 "
                "AND r.action_name = k.column2 AND r.idempotency_key = k.column3 "
                "AND r.retired_at IS NULL",
                self.dialect,
            )
        return statement

    def listing(
        self,
        *,
        final_status: ActionStatus | None,
        pending: bool | None,
        action_name: str | None,
        since: Any,
        limit: int | None,
        idempotency_key: str | None = None,
        action_id_prefix: str | None = None,
        stale: bool | None = None,
        now: Any = None,
        namespace: str | None = None,
        newest_first: bool = False,
    ) -> tuple[Statement, dict[str, Any]]:
        """A filtered receipts listing, oldest (or newest) first, and its parameter values.

        ``since`` is already encoded the way the backend stores ``created_at``,
        and ``now`` the way it binds the ledger's clock.
        """
        values: dict[str, Any] = {
            "stale": stale,
            "now": now,
            "final_status": None if final_status is None else final_status.value,
            "claim_state": None if pending is None else ("PENDING" if pending else "COMPLETED"),
            "action_name": action_name,
            "namespace": namespace,
            "idempotency_key": idempotency_key,
            "action_id_prefix": action_id_prefix,
            "prefix_length": None if action_id_prefix is None else len(action_id_prefix),
            "since": since,
        }
        conditions: Sequence[tuple[str, str]] = (
            ("final_status", "final_status = :final_status"),
            ("claim_state", "claim_state = :claim_state"),
            ("action_name", "action_name = :action_name"),
            ("namespace", "namespace = :namespace"),
            ("idempotency_key", "idempotency_key = :idempotency_key"),
            # substr, not LIKE: no wildcard in the prefix can widen the match.
            ("action_id_prefix", "substr(action_id, 1, :prefix_length) = :action_id_prefix"),
            ("since", "created_at >= :since"),
            (
                "stale",
                f"({self._stale})"
                if stale
                else f"NOT ({self._stale} AND lease_expires_at IS NOT NULL)",
            ),
        )
        clauses = [clause for name, clause in conditions if values[name] is not None]
        text = self.select + (f" WHERE {' AND '.join(clauses)}" if clauses else "")
        text += (
            " ORDER BY created_at DESC, action_id DESC"
            if newest_first
            else " ORDER BY created_at, action_id"
        )
        if limit is not None:
            values["limit"] = int(limit)
            text += " LIMIT :limit"
        return compile_sql(text, self.dialect), values

    def prune_batch(
        self,
        *,
        statuses: Sequence[ActionStatus],
        namespace: str | None,
        completed_before: Any,
        after: tuple[Any, str] | None,
        limit: int,
    ) -> tuple[Statement, dict[str, Any]]:
        """The next ``limit`` prunable receipts after ``after`` (keyset order), and values.

        The same rule as ``_lifecycle.prunable``: completed, in ``statuses``,
        stored (by the ledger's clock) before ``completed_before``; PENDING never.
        """
        values: dict[str, Any] = {
            "completed_before": completed_before,
            "namespace": namespace,
            "limit": int(limit),
        }
        names = []
        for index, status in enumerate(statuses):
            values[f"status_{index}"] = status.value
            names.append(f":status_{index}")
        clauses = [
            "claim_state = 'COMPLETED'",
            f"final_status IN ({', '.join(names)})",
            "stored_at < :completed_before",
        ]
        if namespace is not None:
            clauses.append("namespace = :namespace")
        if after is not None:
            values["after_time"], values["after_id"] = after
            # A row value: SQLite walks its (claim_state, stored_at, action_id)
            # index from here, so each batch costs its own size, not the table's.
            clauses.append("(stored_at, action_id) > (:after_time, :after_id)")
        text = (
            f"{self.select} WHERE {' AND '.join(clauses)} "
            "ORDER BY stored_at, action_id LIMIT :limit"
        )
        return compile_sql(text, self.dialect), values

    def delete_exact(self, versions: Sequence[tuple[str, int]]) -> tuple[Statement, dict[str, Any]]:
        """Delete each completed receipt only if it is still at the version pruning read.

        The ids are an ``IN`` list, so both databases find the rows by primary
        key; each row's own version is then picked out by a ``CASE``.
        """
        values: dict[str, Any] = {}
        ids, cases = [], []
        for index, (action_id, version) in enumerate(versions):
            values[f"id_{index}"] = action_id
            values[f"version_{index}"] = version
            ids.append(f":id_{index}")
            cases.append(f"WHEN :id_{index} THEN CAST(:version_{index} AS integer)")
        text = (
            f"DELETE FROM {self._table} WHERE action_id IN ({', '.join(ids)}) "
            f"AND claim_state = 'COMPLETED' AND version = CASE action_id {' '.join(cases)} END "
            "RETURNING action_id"
        )
        return compile_sql(text, self.dialect), values
