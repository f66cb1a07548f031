"""Receipts of every kind a runner machine run leaves, for tests of the machine's own reads.

The machine judges every step by what it reads of storage, so a test of
those reads compares them with the ledger's own ``find`` and ``get`` on a
ledger holding each kind: CONFIRMED, FAILED and retired, UNKNOWN in
another namespace, and PENDING under a lease.
"""

from __future__ import annotations

from typing import NamedTuple

from dataoad import (
    ActionReceipt,
    ActionRunner,
    ActionStatus,
    DataoadError,
    DefinitiveFailure,
    Ledger,
)
from dataoad.testing import FaultyLedger, LedgerFault

__all__ = ["KEYS", "EveryReceipt", "every_receipt", "read_alike"]

#: (namespace, key) pairs a test finds: the four above and two held by nothing.
KEYS = (("", "a"), ("", "b"), ("t", "c"), ("", "d"), ("", "missing"), ("t", "a"))


class EveryReceipt(NamedTuple):
    """One receipt of each kind, as the calls that made them returned them."""

    done: ActionReceipt
    failed: ActionReceipt  # its key "b" since retired: find no longer sees it
    unknown: ActionReceipt
    pending: ActionReceipt

    def ids(self) -> list[str]:
        """Their action ids, and one no receipt has."""
        return [
            self.done.action_id,
            self.failed.action_id,
            self.unknown.action_id,
            self.pending.action_id,
            "no",
        ]


def _declined() -> None:
    raise DefinitiveFailure("card declined")


def _lost() -> None:
    raise TimeoutError("no answer")


async def every_receipt(ledger: Ledger) -> EveryReceipt:
    """Make one receipt of each kind on ``ledger``."""
    runner = ActionRunner(ledger, owner="worker-a")
    done = await runner.execute("charge", lambda: "ch_1", request={"n": 1}, idempotency_key="a")
    failed = await runner.execute("charge", _declined, request={"n": 2}, idempotency_key="b")
    unknown = await ActionRunner(ledger, namespace="t").execute(
        "charge", _lost, request={"n": 3}, idempotency_key="c", provider_reference="ref-3"
    )
    faulty = FaultyLedger(ledger)
    faulty.inject("record", LedgerFault.FAIL_BEFORE_WRITE)
    try:  # its outcome not recorded: PENDING, leased
        await ActionRunner(faulty, owner="worker-b", lease=30.0).execute(
            "charge", lambda: "ch_4", request={"n": 4}, idempotency_key="d"
        )
    except DataoadError:
        pass
    else:
        raise AssertionError("the outcome was recorded although its write failed")
    (pending,) = await ledger.receipts(pending=True)  # type: ignore[attr-defined]
    assert pending.lease_expires_at is not None
    await runner.reopen(failed.receipt.action_id)  # retires "b"
    assert [done.status, failed.status, unknown.status] == [
        ActionStatus.CONFIRMED,
        ActionStatus.FAILED,
        ActionStatus.UNKNOWN,
    ]
    return EveryReceipt(done.receipt, failed.receipt, unknown.receipt, pending)


def read_alike(direct: ActionReceipt | None, own: ActionReceipt | None) -> bool:
    """Whether a direct read equals the ledger's own, the fields equality ignores included."""
    if direct is None or own is None:
        return direct is own
    return direct == own and (
        direct.stored_at,
        direct.lease_expires_at,
        direct.operator_records,
    ) == (
        own.stored_at,
        own.lease_expires_at,
        own.operator_records,
    )
