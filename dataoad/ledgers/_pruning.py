"""Retention: the one batching loop every ledger's ``prune`` runs.

A prune reads a small batch of receipts the rule (``_lifecycle.prunable``)
selects, hands it to ``before_delete`` (an export, say) and then deletes
each one only if it is still at the version it was read at. So live
writers wait for one small batch at a time, never for the whole prune, and
a receipt that changed meanwhile (a reconcile merging into it) is kept.
Batches follow ``(stored_at, action_id)``, so a kept receipt is never read
again and the loop always ends.

A prune that deletes (not a dry run) is an operator verb: the ledger's audit
gets one record of who ran it, why, and how many receipts went (``operator``
and ``reason``, checked before anything is read).

Ages are the ledger's: ``older_than`` seconds is turned into a cut-off by
the ledger's own clock, read once when the prune starts, and compared with
the time the ledger stored each receipt, so a host whose clock runs fast
cannot prune a receipt that is young by the ledger's clock. A cut-off given
as a time is never later than that start either.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import math
from collections.abc import Awaitable, Callable, Sequence
from datetime import datetime, timedelta
from typing import Final

from dataoad._auditing import OperatorStamp
from dataoad._errors import AuditNotRecordedError, InvalidArgumentError
from dataoad._identity import check_namespace
from dataoad._lifecycle import BeforeDelete, check_completed_before, check_prune_statuses
from dataoad._receipt import ActionReceipt
from dataoad._status import ActionStatus

__all__ = [
    "DEFAULT_BATCH_SIZE",
    "BeforeDelete",
    "DeleteExact",
    "NextBatch",
    "PruneSteps",
    "MAX_OLDER_THAN",
    "check_batch_size",
    "check_older_than",
    "prune",
]

#: Receipts read and deleted per batch: one short write at a time.
DEFAULT_BATCH_SIZE: Final = 500


NextBatch = Callable[[tuple[datetime, str] | None, int], Awaitable[list[ActionReceipt]]]
DeleteExact = Callable[[Sequence[ActionReceipt]], Awaitable[int]]
#: A backend's two steps for one prune: given the checked cut-off, statuses
#: and namespace, how to read the next batch and how to delete one exactly.
PruneSteps = Callable[
    [datetime, tuple[ActionStatus, ...], str | None], tuple[NextBatch, DeleteExact]
]


def check_batch_size(batch_size: object) -> int:
    """An int in [1, 10000]."""
    if type(batch_size) is not int or not 1 <= batch_size <= 10_000:
        raise InvalidArgumentError(f"batch_size must be an int in [1, 10000], not {batch_size!r}")
    return batch_size


#: Longest accepted ``older_than``: a hundred years, in seconds.
MAX_OLDER_THAN: Final = 100 * 365 * 86_400.0


def check_older_than(value: object) -> float:
    """Finite seconds in [0, MAX_OLDER_THAN]."""
    if (
        type(value) not in (int, float)
        or not math.isfinite(value)  # type: ignore[arg-type]
        or not 0 <= value <= MAX_OLDER_THAN  # type: ignore[operator]
    ):
        raise InvalidArgumentError(
            f"older_than must be seconds in [0, {MAX_OLDER_THAN:g}], not {value!r}"
        )
    return float(value)  # type: ignore[arg-type]


async def prune(
    steps: PruneSteps,
    *,
    completed_before: object,
    statuses: object,
    namespace: object,
    batch_size: object,
    dry_run: object,
    before_delete: object,
    older_than: object = None,
    ledger_now: Callable[[], Awaitable[datetime]] | None = None,
    operator: object = None,
    reason: object = None,
    audit_to: object = None,
) -> int:
    """Check every argument, then run batches until none is left.

    Exactly one of ``completed_before`` (an aware datetime, compared with
    the ledger's times of storing) and ``older_than`` (seconds before the
    ledger's now, read by ``ledger_now``) says how old is old enough.
    Returns how many receipts were deleted (with ``dry_run``, how many would
    be). Nothing is read or written before the arguments pass. Unless it
    is a dry run, ``audit_to`` (the ledger) gets the operator record.
    """
    if (completed_before is None) == (older_than is None):
        raise InvalidArgumentError("prune needs exactly one of completed_before and older_than")
    age = None if older_than is None else check_older_than(older_than)
    before = None if completed_before is None else check_completed_before(completed_before)
    chosen = check_prune_statuses(statuses)
    scope = check_namespace(namespace, optional=True)
    size = check_batch_size(batch_size)
    if type(dry_run) is not bool:
        raise InvalidArgumentError(f"dry_run must be a bool, not {dry_run!r}")
    if before_delete is not None and not callable(before_delete):
        raise InvalidArgumentError("before_delete must be a callable or None")
    stamp = OperatorStamp.of("prune", operator, reason, scope)
    if age is not None:
        if ledger_now is None:
            raise InvalidArgumentError("this ledger has no clock to judge older_than by")
        before = (await ledger_now()) - timedelta(seconds=age)
    elif ledger_now is not None:
        # Never past the moment the prune began: a receipt changed while it
        # runs is stored after that, so it is never read (or deleted) again.
        before = min(before, await ledger_now())  # type: ignore[type-var]
    assert before is not None
    next_batch, delete_exact = steps(before, chosen, scope)
    if dry_run:
        return await _batches(next_batch, delete_exact, size, dry_run, before_delete, [0])
    what = f"{','.join(s.value for s in chosen)} receipt(s) stored before {before.isoformat()}"
    deleted = [0]
    try:
        await _batches(next_batch, delete_exact, size, dry_run, before_delete, deleted)
    except (Exception, asyncio.CancelledError) as exc:
        # A cancelled prune (Ctrl-C under asyncio.run, a timeout) has deleted
        # every batch before the cancellation: the audit must say so too.
        how = "cancelled" if isinstance(exc, asyncio.CancelledError) else "failed"
        with contextlib.suppress(AuditNotRecordedError):  # the prune's own error comes first
            await stamp.note(
                audit_to,
                None,
                f"{how}: {type(exc).__name__} after deleting {deleted[0]} {what}",
            )
        raise
    await stamp.note(audit_to, None, f"deleted {deleted[0]} {what}")
    return deleted[0]


async def _batches(
    next_batch: NextBatch,
    delete_exact: DeleteExact,
    batch_size: int,
    dry_run: bool,
    before_delete: BeforeDelete | None,
    counted: list[int],
) -> int:
    after: tuple[datetime, str] | None = None
    while True:
        batch = await next_batch(after, batch_size)
        if not batch:
            return counted[0]
        last = batch[-1]
        assert last.stored_at is not None  # every stored receipt has one
        after = (last.stored_at, last.action_id)
        if dry_run:
            counted[0] += len(batch)
        else:
            if before_delete is not None:
                done = before_delete(batch)
                if inspect.isawaitable(done):
                    await done
            counted[0] += await delete_exact(batch)
        if len(batch) < batch_size:
            return counted[0]
