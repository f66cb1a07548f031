"""The lifecycle properties of the runner machine, registered with the others in ``invariants``.

Judged from the record of the run (who asked to free which key, how each
call ended) and the ledger as an observer sees it, never from the runner's
own account. The world-truth properties (no second mutation of a claim, no
effect behind a FAILED receipt...) keep judging every invocation: a freed
key's new claim is a new mutation with its own provider reference.
"""

from __future__ import annotations

from dataoad import ActionReceipt, ActionResult, ActionStatus
from stateful_tests.invariants import RunnerMachineBase, fail, progress, safety

__all__: list[str] = []

_DEFINITIVE = (ActionStatus.CONFIRMED, ActionStatus.FAILED)


@safety
def keys_freed_only_from_definitive_outcomes(m: RunnerMachineBase) -> None:
    """A receipt gives up its key only when completed CONFIRMED or FAILED (UNKNOWN and PENDING never expire or reopen), and only when a caller asked: by expires_after or by reopen."""
    for action_id, (before, after) in m.transitions.items():
        if after is None or after.retired_at is None or before.retired_at is not None:
            continue
        retired_from = before if after.version == before.version + 1 else None
        if retired_from is not None and (
            retired_from.is_pending or retired_from.final_status not in _DEFINITIVE
        ):
            raise fail(
                keys_freed_only_from_definitive_outcomes,
                f"receipt {action_id[:8]} of {after.idempotency_key} gave up its key while "
                f"{'PENDING' if retired_from.is_pending else retired_from.final_status}",
            )
        freed_by = [c for c in m.contenders_list if action_id in c.retired]
        if not freed_by:
            raise fail(
                keys_freed_only_from_definitive_outcomes,
                f"receipt {action_id[:8]} of {after.idempotency_key} gave up its key, and no "
                "caller's write did it",
            )
    for c in m.contenders_list:
        if c.retired and c.kind != "reopen" and c.expires_after is None:
            raise fail(
                keys_freed_only_from_definitive_outcomes,
                f"contender {c.name} ({c.kind} {c.key}) freed the key of receipt "
                f"{c.retired[0][:8]} though it asked for neither expiry nor a reopen",
            )
    for receipt in m.observed.values():
        # A retired receipt unchanged since (updated when retired) shows what was retired.
        retired_as_is = receipt.retired_at is not None and receipt.updated_at == receipt.retired_at
        if retired_as_is and (receipt.is_pending or receipt.final_status not in _DEFINITIVE):
            raise fail(
                keys_freed_only_from_definitive_outcomes,
                f"receipt {receipt.action_id[:8]} of {receipt.idempotency_key} gave up its "
                f"key while {'PENDING' if receipt.is_pending else receipt.final_status}",
            )


@safety
def expiry_is_judged_by_the_ledger_clock(m: RunnerMachineBase) -> None:
    """A caller asking for ``expires_after`` frees a key only from a receipt the ledger stored at least that long ago by its own clock (its last write, not its claim), whatever the caller's or the writer's clock says."""
    for c in m.contenders_list:
        if c.kind != "execute" or c.expires_after is None:
            continue
        for before, after in c.retired_spans:
            if before.stored_at is None or after.stored_at is None:
                continue
            # Between the ledger's own stamps of the write it retired and of
            # the retiring write: the receipt's age by the ledger's clock.
            age = (after.stored_at - before.stored_at).total_seconds()
            action_id = before.action_id
            if age < c.expires_after:
                raise fail(
                    expiry_is_judged_by_the_ledger_clock,
                    f"contender {c.name} asked for expires_after={c.expires_after:g} s and "
                    f"freed the key of receipt {action_id[:8]} of {after.idempotency_key}, "
                    f"which the ledger stored {age:g} s before by its own clock",
                )


@progress
def expiry_frees_a_receipt_at_exactly_its_age(m: RunnerMachineBase) -> None:
    """A caller asking for exactly the age a definitive receipt has reached by the ledger's clock frees its key (the boundary is inclusive): it never answers with that receipt, unchanged and still holding the key (a replay, or a conflict with its old reference)."""
    for c in m.contenders_list:
        if not c.finished or c.expires_exactly is None:
            continue
        receipt = getattr(c.outcome, "receipt", None)
        if not isinstance(receipt, ActionReceipt) or receipt.retired_at is not None:
            continue
        if (receipt.action_id, receipt.version) == c.expires_exactly:
            raise fail(
                expiry_frees_a_receipt_at_exactly_its_age,
                f"contender {c.name} asked for expires_after={c.expires_after:g} s, exactly the "
                f"age of receipt {receipt.action_id[:8]} of {receipt.idempotency_key} "
                f"({receipt.final_status}, version {receipt.version}) by the ledger's clock, "
                f"and answered with it ({type(c.outcome).__name__}) instead of freeing its key",
            )


@safety
def reopen_frees_only_definitive_failures(m: RunnerMachineBase) -> None:
    """A reopen that returns has freed the key of a definitive FAILED receipt; any other receipt it refuses, unchanged."""
    for c in m.contenders_list:
        if c.kind != "reopen" or not c.finished or c.action_id is None or c.retired_before:
            continue
        receipt = m.observed.get(c.action_id)
        if receipt is None:
            continue  # pruned or released since: nothing left to judge
        if c.outcome is None:
            if receipt.retired_at is None:
                raise fail(
                    reopen_frees_only_definitive_failures,
                    f"contender {c.name}'s reopen of {receipt.action_id[:8]} returned, but the "
                    "receipt still holds its key",
                )
            if receipt.updated_at == receipt.retired_at and (
                receipt.final_status is not ActionStatus.FAILED
            ):
                raise fail(
                    reopen_frees_only_definitive_failures,
                    f"contender {c.name} reopened {receipt.action_id[:8]} of {c.key}, which was "
                    f"{receipt.final_status}, not a definitive FAILED",
                )


@safety
def namespaces_never_interact(m: RunnerMachineBase) -> None:
    """A caller in one namespace never replays, conflicts with, waits on or settles a receipt of another."""
    for c in m.contenders_list:
        if not c.finished or c.kind == "sweep":
            continue
        outcome = c.outcome
        receipt = (
            outcome.receipt
            if isinstance(outcome, ActionResult)
            else getattr(outcome, "receipt", None)
        )
        if receipt is not None and getattr(receipt, "namespace", c.namespace) != c.namespace:
            raise fail(
                namespaces_never_interact,
                f"contender {c.name} in namespace {c.namespace!r} ended with receipt "
                f"{receipt.action_id[:8]} of namespace {receipt.namespace!r}",
            )


@safety
def one_receipt_holds_each_key(m: RunnerMachineBase) -> None:
    """At most one receipt holds each (namespace, action, key): of callers freeing a key at once, exactly one new claim wins."""
    holders: dict[tuple[str, str, str], str] = {}
    for receipt in m.observed.values():
        if receipt.retired_at is not None:
            continue
        key = (receipt.namespace, receipt.action_name, receipt.idempotency_key)
        if key in holders:
            raise fail(
                one_receipt_holds_each_key,
                f"receipts {holders[key][:8]} and {receipt.action_id[:8]} both hold {key}",
            )
        holders[key] = receipt.action_id


@safety
def prune_removes_only_completed_receipts_it_was_asked_for(m: RunnerMachineBase) -> None:
    """Retention deletes only completed receipts of its namespace in the statuses it was given (UNKNOWN only when named, PENDING never), and nothing else disappears."""
    for c in m.contenders_list:
        for receipt in c.pruned:
            if (
                receipt.is_pending
                or receipt.final_status not in c.prune_statuses
                or receipt.namespace != c.namespace
            ):
                raise fail(
                    prune_removes_only_completed_receipts_it_was_asked_for,
                    f"contender {c.name}'s prune of namespace {c.namespace!r} "
                    f"({', '.join(s.value for s in c.prune_statuses)}) deleted receipt "
                    f"{receipt.action_id[:8]} of {receipt.idempotency_key}, "
                    f"{'PENDING' if receipt.is_pending else receipt.final_status}",
                )
