"""Planted bugs in leases, takeover and fencing (appended to ``PLANTED_BUGS``).

Each breaks one rule of ``dataoad._ledger_rules``, ``dataoad._leases`` or the
zombie and takeover rules of ``dataoad._settled`` and ``dataoad._recovery`` the
way a careless change would, and names the properties of the runner
machine that must report it.
"""

from __future__ import annotations

import dataclasses
from datetime import datetime, timedelta
from typing import Any

import pytest

import dataoad._attempts as attempts_module
import dataoad._completing as completing_module
import dataoad._invoking as invoking_module
import dataoad._leases as leases_module
import dataoad._ledger_rules as ledger_rules_module
import dataoad._recovery as recovery_module
import dataoad._settled as settled_module
import dataoad.ledgers.memory as memory_module
import dataoad.ledgers.sqlite as sqlite_module
from dataoad import (
    ActionReceipt,
    ActionResult,
    ActionStatus,
    ClaimState,
    InMemoryLedger,
    RecoveryRefusedError,
    SQLiteLedger,
)
from dataoad._clock import utc_now
from dataoad._ledger_rules import check_renew, check_take_over, lease_expired, same_identity
from dataoad.ledgers._statements import compile_sql
from stateful_tests.planted import PlantedBug, ReleasesStartedClaimsLedger, names

__all__ = ["LEASE_BUGS"]


def _late_attempt_invokes_without_renewing(mp: pytest.MonkeyPatch) -> dict[str, Any]:
    # Trusts the lease the counting write granted, however late the call.
    for module in (attempts_module, leases_module, invoking_module):
        mp.setattr(module, "young_enough", lambda tenure, since: True)
    return {}


def _lease_judged_young_until_it_ends(mp: pytest.MonkeyPatch) -> dict[str, Any]:
    def until_the_end(tenure: Any, since: float) -> bool:
        # Renews only once the whole lease is past, and "past" one tick late.
        lease = tenure.lease
        return lease is None or tenure.clock.monotonic() - since <= lease

    for module in (attempts_module, leases_module, invoking_module):
        mp.setattr(module, "young_enough", until_the_end)
    return {}


def _late_attempt_ignores_a_refused_renewal(mp: pytest.MonkeyPatch) -> dict[str, Any]:
    real = leases_module.renewed_for_the_call

    async def ignores(*args: Any) -> bool:
        await real(*args)  # renews, and goes on whatever the ledger said
        return True

    for module in (leases_module, invoking_module):
        mp.setattr(module, "renewed_for_the_call", ignores)
    return {}


def _renewal_after_takeover(mp: pytest.MonkeyPatch) -> dict[str, Any]:
    # Renews any PENDING claim, whoever holds it now.
    mp.setattr(memory_module, "check_renew", lambda current, token: current.is_pending)
    return {}


def _takeover_without_fencing(mp: pytest.MonkeyPatch) -> dict[str, Any]:
    real_take_over = leases_module.take_over

    def unfenced(current: ActionReceipt, proposed: ActionReceipt, now: Any) -> bool:
        # Accepts a new owner under the same fencing token.
        return (
            lease_expired(current, now)
            and proposed.version == current.version + 1
            and same_identity(current, proposed)
        )

    async def same_token(store: Any, existing: ActionReceipt, tenure: Any, events: Any) -> Any:
        lowered = dataclasses.replace(existing, fencing_token=existing.fencing_token - 1)
        return await real_take_over(store, lowered, tenure, events)

    mp.setattr(memory_module, "check_take_over", unfenced)
    mp.setattr(attempts_module, "take_over", same_token)
    return {}


def _takeover_reinvokes_started_attempt(mp: pytest.MonkeyPatch) -> dict[str, Any]:
    async def reinvokes(store: Any, taken: Any, call: Any, events: Any, tenure: Any) -> Any:
        # Runs the operation again whatever the stranded claim had started.
        return await attempts_module.run_attempts(
            store, taken, call.operation, call.verify, call.policy, events, tenure, taken_over=True
        )

    mp.setattr(attempts_module, "_run_taken_over", reinvokes)
    return {}


def _expiry_judged_by_worker_clock(mp: pytest.MonkeyPatch) -> dict[str, Any]:
    def worker_clock(current: ActionReceipt, proposed: ActionReceipt, now: Any) -> bool:
        return check_take_over(current, proposed, utc_now())  # the caller's clock, not the ledger's

    mp.setattr(memory_module, "check_take_over", worker_clock)
    return {}


def _zombie_overwrites_new_owner(mp: pytest.MonkeyPatch) -> dict[str, Any]:
    def overwrite(current: ActionReceipt, finished: Any, observation: Any) -> Any:
        if finished.execution_status is None:
            return None
        records = list(current.attempt_records)
        records[finished.number - 1] = finished
        status = finished.execution_status
        # Writes what the zombie saw as the claim's outcome, over the new owner's.
        return current.evolve(
            claim_state=ClaimState.COMPLETED,
            attempt_records=tuple(records),
            execution_status=status,
            verification_status=None,
            final_status=status,
            version=current.version + 1,
            updated_at=utc_now(),
        )

    # Both callers: the zombie merge loop and the holder's rebuild over merged evidence.
    mp.setattr(settled_module, "zombie_merged", overwrite)
    mp.setattr(recovery_module, "zombie_merged", overwrite)
    return {}


def _taker_retries_without_retry_safe_evidence(mp: pytest.MonkeyPatch) -> dict[str, Any]:
    async def retries(store: Any, taken: Any, verify: Any, policy: Any, events: Any) -> Any:
        records = list(taken.attempt_records)
        records[-1] = dataclasses.replace(
            records[-1],
            execution_status=records[-1].execution_status or ActionStatus.UNKNOWN,
            verification_status=ActionStatus.FAILED,  # assumed, never observed
            retry_decision="retry",
            finished_at=utc_now(),
        )
        if policy.should_retry(ActionStatus.FAILED, taken.attempts, True):
            return taken.evolve(attempt_records=tuple(records))
        return await real(store, taken, verify, policy, events)

    real = recovery_module.settle_started
    mp.setattr(attempts_module, "settle_started", retries)
    return {}


def _zombie_evidence_dropped(mp: pytest.MonkeyPatch) -> dict[str, Any]:
    async def dropped(store: Any, stored: Any, *rest: Any) -> Any:
        return stored  # the fenced worker's observation is only in its exception

    mp.setattr(completing_module, "merge_zombie_evidence", dropped)
    return {}


def _sweep_releases_started_claims(mp: pytest.MonkeyPatch) -> dict[str, Any]:
    async def releases(store: Any, taken: Any, verify: Any, policy: Any, events: Any) -> Any:
        # Frees the key of every stale claim, started or not (and the
        # ledger below no longer refuses it).
        await store.ledger.release(taken.action_id, taken.version)
        return ActionResult(taken)

    mp.setattr(recovery_module, "settle_started", releases)
    return {"ledger_class": ReleasesStartedClaimsLedger}


def _sweep_leaves_started_claims(mp: pytest.MonkeyPatch) -> dict[str, Any]:
    async def leaves(store: Any, taken: Any, verify: Any, policy: Any, events: Any) -> Any:
        # Taken over, then given up on: the sweep logs it and moves on.
        raise RecoveryRefusedError(f"{taken.action_id} had started; left for an operator")

    mp.setattr(recovery_module, "settle_started", leaves)
    return {}


class RenewsAnyTokenLedger(InMemoryLedger):
    """Renews a PENDING claim's lease whatever fencing token the caller holds."""

    async def renew(self, action_id: str, fencing_token: int, lease: float) -> bool:
        current = self._by_id.get(action_id)
        return current is not None and await super().renew(action_id, current.fencing_token, lease)


class TakesOverLiveClaimsSQLiteLedger(SQLiteLedger):
    """Its takeover statement lost the expiry condition: any PENDING claim can be taken."""

    async def take_over(self, receipt: ActionReceipt, *, lease: float) -> bool:
        statements = sqlite_module._SQL
        expiry = " AND lease_expires_at <= :now"
        assert expiry in statements.templates["take_over"]
        weakened = compile_sql(
            statements.templates["take_over"].replace(expiry, ""), statements.dialect
        )
        return await self._transition(weakened, receipt, now=None, lease=lease)


def _owner_ignores_merged_evidence(mp: pytest.MonkeyPatch) -> dict[str, Any]:
    # V1 of v0.2: the owner never rebuilds its outcome over a zombie's merge.
    ignore = lambda final, base, stored: None  # noqa: E731
    mp.setattr(completing_module, "rebased_over_evidence", ignore)
    mp.setattr(attempts_module, "start_rebased_over_evidence", ignore)
    return {}


def _lease_expiry_exclusive(mp: pytest.MonkeyPatch) -> dict[str, Any]:
    def strictly_expired(current: ActionReceipt, now: datetime) -> bool:
        # "Runs out at" read as "runs out after": a claim at its exact end stays held.
        return (
            current.claim_state is ClaimState.PENDING
            and current.lease_expires_at is not None
            and current.lease_expires_at < now
        )

    mp.setattr(ledger_rules_module, "lease_expired", strictly_expired)
    mp.setattr(memory_module, "lease_expired", strictly_expired)
    return {}


class RenewsFromTheOldExpiryLedger(InMemoryLedger):
    """Extends a renewed lease from its old end, not from the ledger's now."""

    async def renew(self, action_id: str, fencing_token: int, lease: float) -> bool:
        with self._lock:
            current = self._by_id.get(action_id)
            if current is None or not check_renew(current, fencing_token):
                return False
            base = current.lease_expires_at or self._now()
            self._by_id[action_id] = current.evolve(
                lease_expires_at=base + timedelta(seconds=lease)
            )
            return True


def _renewal_from_the_old_expiry(mp: pytest.MonkeyPatch) -> dict[str, Any]:
    return {"ledger_class": RenewsFromTheOldExpiryLedger}


class LeasesByTheWriterClockLedger(InMemoryLedger):
    """Grants an attempt's or a taker's lease from the writer's ``updated_at``, not its own clock."""

    def _leased(
        self, receipt: ActionReceipt, lease: float | None, current: ActionReceipt | None = None
    ) -> ActionReceipt:
        stored = super()._leased(receipt, lease, current)
        if current is None or lease is None:
            return stored
        return stored.evolve(lease_expires_at=receipt.updated_at + timedelta(seconds=lease))


def _lease_by_the_writer_clock(mp: pytest.MonkeyPatch) -> dict[str, Any]:
    return {"ledger_class": LeasesByTheWriterClockLedger}


LEASE_BUGS = [
    PlantedBug(
        "owner-outcome-lost-to-zombie-merge",
        "a zombie's evidence merged into the claim its taker is still running",
        "runner",
        names("holders-fail-only-by-own-faults-or-operators"),
        _owner_ignores_merged_evidence,
    ),
    PlantedBug(
        "renewal-after-takeover",
        "a holder paused past its lease renews after another took its claim over",
        "runner",
        names("takeovers-only-after-expiry"),
        _renewal_after_takeover,
        # The memory ledger's rule; the SQL ledgers state it in their statements.
        backend="memory",
    ),
    PlantedBug(
        "takeover-without-fencing",
        "a takeover of an expired claim",
        "runner",
        names(
            "takeovers-only-after-expiry",
            "at-most-one-live-owner",
            # Or what the missing fence leads to: the old holder, its renewal
            # still accepted under the shared token, invokes after the taker
            # completed the claim; no later token marks it as a zombie, so its
            # call is an invocation no PENDING claim counted.
            "invocation-counted-before-call",
            # Or: the holder loses its claim under an unchanged token, so its
            # failure looks like the runner's own, not a takeover's.
            "holders-fail-only-by-own-faults-or-operators",
        ),
        _takeover_without_fencing,
        # The memory ledger's rule; the SQL ledgers state it in their statements.
        backend="memory",
    ),
    PlantedBug(
        "takeover-reinvokes-started-attempt",
        "a takeover of a claim whose attempt had started",
        "runner",
        names(
            "no-second-mutation-of-a-claim-by-anyone",
            "no-second-mutation-after-unknown",
            "invocations-bounded-by-policy",
        ),
        _takeover_reinvokes_started_attempt,
    ),
    PlantedBug(
        "expiry-judged-by-worker-clock",
        "a duplicate meeting a live claim, its own clock past the lease",
        "runner",
        names("takeovers-only-after-expiry"),
        _expiry_judged_by_worker_clock,
        # The memory ledger's rule; the SQL ledgers state it in their statements.
        backend="memory",
    ),
    PlantedBug(
        "zombie-overwrites-new-owner",
        "a holder paused past its lease finishes after the takeover",
        "runner",
        names(
            "takeovers-only-after-expiry",
            "status-permitted-by-recorded-evidence",
            "unknown-evidence-never-erased",
            "failed-requires-no-effect-now-or-later",
            "zombie-evidence-never-lost",
            "receipts-never-lost-and-only-move-forward",
            # The live owner's own write is then refused: it loses its outcome;
            # or it invokes its retry on a claim the zombie already completed.
            "holders-fail-only-by-own-faults-or-operators",
            "invocation-counted-before-call",
        ),
        _zombie_overwrites_new_owner,
    ),
    PlantedBug(
        "taker-retries-without-retry-safe-evidence",
        "a takeover of a started claim under a policy that retries FAILED",
        "runner",
        names(
            "no-second-mutation-of-a-claim-by-anyone",
            "no-second-mutation-after-unknown",
            # When the retry is declined: FAILED over the zombie's ambiguous attempt,
            # seen as UNKNOWN evidence erased or as a status it does not permit.
            "unknown-evidence-never-erased",
            "status-permitted-by-recorded-evidence",
        ),
        _taker_retries_without_retry_safe_evidence,
    ),
    PlantedBug(
        "zombie-evidence-dropped",
        "a holder paused past its lease sees its charge succeed after the takeover",
        "runner",
        names("zombie-evidence-never-lost"),
        _zombie_evidence_dropped,
    ),
    PlantedBug(
        "sweep-releases-started-claims",
        "a sweep meeting a stale claim whose attempt had started",
        "runner",
        # The key is then claimed and invoked again: a second mutation too.
        names("claims-never-stolen", "no-second-mutation-of-a-claim-by-anyone"),
        _sweep_releases_started_claims,
    ),
    PlantedBug(
        "sweep-leaves-started-claims",
        "a sweep meeting a stale claim whose attempt had started",
        "runner",
        names("stranded-claims-settled-by-a-sweep"),
        _sweep_leaves_started_claims,
    ),
    PlantedBug(
        "memory-renews-for-any-token",
        "a renewal under an older fencing token",
        "ledger",
        names("backends-agree-with-the-model", "backends-hold-identical-receipts"),
        lambda mp: {"memory_class": RenewsAnyTokenLedger},
    ),
    PlantedBug(
        "sqlite-takes-over-live-claims",
        "a takeover before the lease ran out",
        "ledger",
        names("backends-agree-with-the-model", "backends-hold-identical-receipts"),
        lambda mp: {"sqlite_class": TakesOverLiveClaimsSQLiteLedger},
    ),
    PlantedBug(
        "lease-expiry-exclusive",
        "a duplicate arriving when the ledger's clock stands exactly at a claim's lease end",
        "runner",
        # A sweep started at that instant leaves the claim too.
        names("a-lease-ends-at-exactly-its-expiry", "stranded-claims-settled-by-a-sweep"),
        _lease_expiry_exclusive,
        # The memory ledger's rule; the SQL ledgers state it in their statements.
        backend="memory",
    ),
    PlantedBug(
        "renewal-from-the-old-expiry",
        "a holder renews its lease",
        "runner",
        names("leases-run-from-the-write-that-grants-them"),
        _renewal_from_the_old_expiry,
    ),
    PlantedBug(
        "late-attempt-invokes-without-renewing",
        "a holder stalls a lease long between counting its attempt and calling",
        "runner",
        names(
            "operations-run-only-while-their-claim-is-held",
            # Or what the late call leads to: an invocation no PENDING claim
            # of this caller counted.
            "invocation-counted-before-call",
        ),
        _late_attempt_invokes_without_renewing,
    ),
    PlantedBug(
        "lease-judged-young-until-it-ends",
        "a holder stalls exactly one lease between counting its attempt and calling",
        "runner",
        names("operations-run-only-while-their-claim-is-held", "invocation-counted-before-call"),
        _lease_judged_young_until_it_ends,
    ),
    PlantedBug(
        "late-attempt-ignores-a-refused-renewal",
        "a holder stalls past its lease, taken over meanwhile, and renews before calling",
        "runner",
        names("operations-run-only-while-their-claim-is-held", "invocation-counted-before-call"),
        _late_attempt_ignores_a_refused_renewal,
    ),
    PlantedBug(
        "lease-by-the-writer-clock",
        "a retry or a taker starts its attempt",
        "runner",
        names("leases-run-from-the-write-that-grants-them"),
        _lease_by_the_writer_clock,
    ),
]
