"""Planted bugs in the SQLite grouped writer (appended to ``PLANTED_BUGS``).

Each breaks one rule of ``dataoad/ledgers/_sqlite_group.py`` the way a
careless change would; the group machine must report it.
"""

from __future__ import annotations

import contextlib
import sqlite3
from typing import Any

import pytest

from dataoad import SQLiteLedger
from dataoad.ledgers._sqlite_group import GroupWriter, QueuedWrite
from stateful_tests.planted import PlantedBug, names

__all__ = ["GROUP_BUGS"]


class KeepsAnswersOfARolledBackGroup(GroupWriter):
    """A group that is not committed fails only the writes that had not run yet."""

    @staticmethod
    def _fail_all(group: list[QueuedWrite], exc: BaseException) -> None:
        for entry in group:
            if entry.rows is None:
                entry.error = exc


class CommitsEachWrite(GroupWriter):
    """Runs a group's writes one autocommit statement after another (no shared transaction)."""

    def _run(self, db: sqlite3.Connection, group: list[QueuedWrite]) -> None:
        now = None if self._clock is None else self._clock()
        for entry in group:
            try:
                entry.rows = self._execute(db, entry, now)
            except Exception as exc:
                entry.error = exc


class ServesAfterAFailedRollback(GroupWriter):
    """Keeps serving a connection left inside a group it could not roll back."""

    def _roll_back(self, db: sqlite3.Connection) -> None:
        with contextlib.suppress(Exception):
            if db.in_transaction:
                db.execute("ROLLBACK")


class FailedLookUpFailsTheGroup(GroupWriter):
    """A claim's look-up that raises is let through: the whole group fails with it."""

    def _look_up(self, db: sqlite3.Connection, taken: list[QueuedWrite]) -> bool:
        self.check_usable()
        for entry in taken:
            if entry.look_up is not None and entry.state == "taken":
                entry.found = entry.look_up(db)
                if entry.found is not None:
                    entry.state, entry.rows = "answered", []
        return any(entry.state == "taken" for entry in taken)


class AnsweredClaimStillWrites(GroupWriter):
    """A claim answered by its holder is left in the group, and its insert runs too."""

    def _look_up(self, db: sqlite3.Connection, taken: list[QueuedWrite]) -> bool:
        self.check_usable()
        for entry in taken:
            if entry.look_up is not None and entry.state == "taken":
                try:
                    entry.found = entry.look_up(db)
                except Exception as exc:
                    entry.error, entry.state, entry.rows = exc, "answered", []
        return any(entry.state == "taken" for entry in taken)


class LooksUpOnABrokenConnection(GroupWriter):
    """Runs the look-ups before asking whether the connection still serves anything."""

    def _look_up(self, db: sqlite3.Connection, taken: list[QueuedWrite]) -> bool:
        broken, self.broken = self.broken, None
        try:
            return super()._look_up(db, taken)
        finally:
            self.broken = broken


class ReadTogetherAnswersOtherClaims(GroupWriter):
    """The holders read together are handed to the group's claims in the wrong order."""

    def _read_together(self, db: sqlite3.Connection, taken: list[QueuedWrite]) -> dict[int, Any]:
        found = super()._read_together(db, taken)
        return dict(zip(found, reversed(list(found.values())), strict=True))


class FailedReadTogetherFailsItsClaims(GroupWriter):
    """A read-together that raises fails every claim in it, instead of each reading alone."""

    def _read_together(self, db: sqlite3.Connection, taken: list[QueuedWrite]) -> dict[int, Any]:
        assert self._look_up_together is not None
        reading = [e for e in taken if e.look_up_key is not None and e.state == "taken"]
        if len(reading) < 2:
            return {}
        try:
            found = self._look_up_together(db, [e.look_up_key for e in reading])
        except Exception as exc:
            for entry in reading:
                entry.error, entry.state, entry.rows = exc, "answered", []
            return {}
        return {id(e): f for e, f in zip(reading, found, strict=True)}


def _keeps_answers(mp: pytest.MonkeyPatch) -> dict[str, Any]:
    return {"writer_class": KeepsAnswersOfARolledBackGroup}


def _commits_each(mp: pytest.MonkeyPatch) -> dict[str, Any]:
    return {"writer_class": CommitsEachWrite}


def _serves_after_failed_rollback(mp: pytest.MonkeyPatch) -> dict[str, Any]:
    return {"writer_class": ServesAfterAFailedRollback}


def _refused_statement_fails_the_group(mp: pytest.MonkeyPatch) -> dict[str, Any]:
    import dataoad.ledgers._sqlite_group as group_module

    # A constraint SQLite refuses (a duplicate key) read as a failure of the
    # whole transaction: the other writes of the group fail with it.
    mp.setattr(
        group_module,
        "_STATEMENT_ERRORS",
        tuple(e for e in group_module._STATEMENT_ERRORS if e is not sqlite3.IntegrityError),
    )
    return {}


def _unbindable_value_fails_the_group(mp: pytest.MonkeyPatch) -> dict[str, Any]:
    import dataoad.ledgers._sqlite_group as group_module

    # Only SQLite's own refusals counted as one statement's: a value Python
    # cannot bind (raised before SQLite ran anything) failed the whole group.
    python_side = (OverflowError, ValueError, TypeError)
    mp.setattr(
        group_module,
        "_STATEMENT_ERRORS",
        tuple(e for e in group_module._STATEMENT_ERRORS if e not in python_side),
    )
    return {}


def _writer(cls: type[GroupWriter]) -> Any:
    return lambda mp: {"writer_class": cls}


class _LedgerKeepingAnswersOfARolledBackGroup(SQLiteLedger):
    """The real SQLite ledger over ``KeepsAnswersOfARolledBackGroup``."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._group.__class__ = KeepsAnswersOfARolledBackGroup


def _runner_trusts_a_rolled_back_group(mp: pytest.MonkeyPatch) -> dict[str, Any]:
    return {"ledger_class": _LedgerKeepingAnswersOfARolledBackGroup}


GROUP_BUGS = [
    PlantedBug(
        "group-answers-writes-a-rollback-took-back",
        "a group of writes whose COMMIT fails, or that SQLite rolls back",
        "group",
        names("group-answers-follow-the-model", "group-stores-exactly-what-it-answered"),
        _keeps_answers,
    ),
    PlantedBug(
        "group-commits-each-write-alone",
        "a group of several writes",
        "group",
        names("group-commits-once", "group-answers-follow-the-model"),
        _commits_each,
    ),
    PlantedBug(
        "group-serves-after-a-failed-rollback",
        "a group whose COMMIT and ROLLBACK both fail, then more writes",
        "group",
        names("group-answers-follow-the-model", "group-stores-exactly-what-it-answered"),
        _serves_after_failed_rollback,
    ),
    PlantedBug(
        "group-fails-whole-on-a-refused-statement",
        "a group holding a write that SQLite refuses (a duplicate claim) beside others",
        "group",
        names("group-answers-follow-the-model", "group-stores-exactly-what-it-answered"),
        _refused_statement_fails_the_group,
    ),
    PlantedBug(
        "group-fails-whole-on-an-unbindable-value",
        "a group holding a write whose value Python cannot bind beside others",
        "group",
        names("group-answers-follow-the-model", "group-stores-exactly-what-it-answered"),
        _unbindable_value_fails_the_group,
    ),
    PlantedBug(
        "group-fails-whole-on-a-failed-look-up",
        "a group holding a claim whose look-up raises beside other writes",
        "group",
        names("group-answers-follow-the-model", "group-stores-exactly-what-it-answered"),
        _writer(FailedLookUpFailsTheGroup),
    ),
    PlantedBug(
        "group-runs-a-claim-its-look-up-answered",
        "a claim of a held key queued with other writes",
        "group",
        names("group-commits-once", "group-answers-follow-the-model"),
        _writer(AnsweredClaimStillWrites),
    ),
    PlantedBug(
        "group-looks-up-on-a-broken-connection",
        "a group whose COMMIT and ROLLBACK both fail, then a claim of a key it wrote",
        "group",
        names("group-answers-follow-the-model"),
        _writer(LooksUpOnABrokenConnection),
    ),
    PlantedBug(
        "group-answers-a-claim-with-another-keys-holder",
        "claims of different keys, one held, read together in one group",
        "group",
        names("group-answers-follow-the-model"),
        _writer(ReadTogetherAnswersOtherClaims),
    ),
    PlantedBug(
        "group-fails-claims-whose-read-together-failed",
        "claims read together whose read fails",
        "group",
        names("group-answers-follow-the-model"),
        _writer(FailedReadTogetherFailsItsClaims),
    ),
    # The same broken rule as the first, hunted through the real runner: its
    # contenders share one connection (``group_rules``), and a group holding
    # their writes fails to commit. A claim or an outcome answered as stored
    # when nothing was.
    PlantedBug(
        "runner-trusts-a-rolled-back-group",
        "contenders' writes in one group whose COMMIT fails",
        "shared",
        # Or, noted as its operation starts: its claim is not in the ledger.
        names(
            "invocation-counted-before-call",
            "returned-receipts-are-durable",
            "receipts-never-lost-and-only-move-forward",
            "operations-run-only-while-their-claim-is-held",
        ),
        _runner_trusts_a_rolled_back_group,
        backend="sqlite",
    ),
]
