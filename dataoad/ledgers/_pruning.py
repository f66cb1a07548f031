"""Retention: the one batching loop every ledger's ``prune`` runs.

A prune reads a small batch of receipts the rule (``_lifecycle.prunable``)
selects, hands it to ``before_delete`` (an export, say) and then deletes
each one only if it is still at the version it was read at. So live
writers wait for one small batch at a time, never for the whole prune, and
a receipt that changed meanwhile (a reconcile merging into it) is kept.
Batches follow ``(updated_at, action_id)``, so a kept receipt is never read
again and the loop always ends.
"""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable, Sequence
from datetime import datetime
from typing import Final

from dataoad._errors import InvalidArgumentError
from dataoad._identity import check_namespace
from dataoad._lifecycle import check_completed_before, check_prune_statuses
from dataoad._receipt import ActionReceipt
from dataoad._status import ActionStatus

__all__ = [
    "DEFAULT_BATCH_SIZE",
    "BeforeDelete",
    "DeleteExact",
    "NextBatch",
    "PruneSteps",
    "check_batch_size",
    "prune",
]

#: Receipts read and deleted per batch: one short write at a time.
DEFAULT_BATCH_SIZE: Final = 500

#: Called with each batch before any of it is deleted (sync or async).
BeforeDelete = Callable[[Sequence[ActionReceipt]], object]

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


async def prune(
    steps: PruneSteps,
    *,
    completed_before: object,
    statuses: object,
    namespace: object,
    batch_size: object,
    dry_run: object,
    before_delete: object,
) -> int:
    """Check every argument, then run batches until none is left.

    Returns how many receipts were deleted (with ``dry_run``, how many would
    be). Nothing is read or written before the arguments pass.
    """
    before = check_completed_before(completed_before)
    chosen = check_prune_statuses(statuses)
    scope = check_namespace(namespace, optional=True)
    size = check_batch_size(batch_size)
    if type(dry_run) is not bool:
        raise InvalidArgumentError(f"dry_run must be a bool, not {dry_run!r}")
    if before_delete is not None and not callable(before_delete):
        raise InvalidArgumentError("before_delete must be a callable or None")
    next_batch, delete_exact = steps(before, chosen, scope)
    return await _batches(next_batch, delete_exact, size, dry_run, before_delete)


async def _batches(
    next_batch: NextBatch,
    delete_exact: DeleteExact,
    batch_size: int,
    dry_run: bool,
    before_delete: BeforeDelete | None,
) -> int:
    after: tuple[datetime, str] | None = None
    total = 0
    while True:
        batch = await next_batch(after, batch_size)
        if not batch:
            return total
        after = (batch[-1].updated_at, batch[-1].action_id)
        if dry_run:
            total += len(batch)
        else:
            if before_delete is not None:
                done = before_delete(batch)
                if inspect.isawaitable(done):
                    await done
            total += await delete_exact(batch)
        if len(batch) < batch_size:
            return total
