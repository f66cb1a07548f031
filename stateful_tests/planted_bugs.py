"""Deliberately broken variants of the real code, one rule broken each.

Each planted bug is a small subclass or patch of the real runner or ledger,
with the invariant names that must catch it. ``stateful_tests`` proves the
machines find every one and that the shrunk trace names the right property.
The triggers are computed from state, never literal constants, so that
Hypothesis cannot stumble on them by copying literals out of this file.
"""

from __future__ import annotations

import asyncio
import dataclasses
import fcntl
import os
from collections.abc import Iterator, Sequence
from contextlib import contextmanager, suppress
from typing import Any

import pytest

import dataoad._arguments as arguments_module
import dataoad._attempts as attempts_module
import dataoad._completing as completing_module
import dataoad._evidence as evidence_module
import dataoad._invoking as invoking_module
import dataoad._observing as observing_module
import dataoad._policy as policy_module
import dataoad._recovery as recovery_module
import dataoad._settled as settled_module
import dataoad.ledgers.sqlite as sqlite_module
from dataoad import (
    ActionInProgressError,
    ActionPersistenceError,
    ActionReceipt,
    ActionResult,
    ActionRunner,
    ActionStatus,
    InMemoryLedger,
    OutcomeNotRecordedError,
    SQLiteLedger,
    VerificationHealth,
)
from dataoad._blocking import call_maybe_async, is_async_callable
from dataoad._events import EventSink
from dataoad._proven import ProvenLedger
from dataoad._verification import VerificationResult
from dataoad.ledgers._statements import SQLITE, compile_sql
from stateful_tests.planted import PlantedBug, ReleasesStartedClaimsLedger, names
from stateful_tests.planted_bound_bugs import BOUND_BUGS
from stateful_tests.planted_claim_bugs import CLAIM_BUGS
from stateful_tests.planted_group_bugs import GROUP_BUGS
from stateful_tests.planted_lease_bugs import LEASE_BUGS
from stateful_tests.planted_lifecycle_bugs import LIFECYCLE_BUGS
from stateful_tests.planted_settle_bugs import SETTLE_BUGS

# -- runner and evidence bugs -------------------------------------------------------


def _retry_unknown_by_default(mp: pytest.MonkeyPatch) -> dict[str, Any]:
    real = policy_module.decide_retry

    def buggy(status: ActionStatus, **kw: Any) -> bool:
        if status is ActionStatus.UNKNOWN:
            return bool(kw["attempts"] < kw["max_attempts"])
        return real(status, **kw)

    mp.setattr(policy_module, "decide_retry", buggy)
    return {}


def _later_failed_erases_unknown(mp: pytest.MonkeyPatch) -> dict[str, Any]:
    def buggy(evidence: Sequence[ActionStatus]) -> ActionStatus | None:
        return evidence[-1] if evidence else None  # the last attempt wins

    mp.setattr(evidence_module, "aggregate_attempts", buggy)
    mp.setattr(attempts_module, "aggregate_attempts", buggy)
    return {}


def _accept_unbound_confirmation(mp: pytest.MonkeyPatch) -> dict[str, Any]:
    real = observing_module.classify_verification  # type: ignore[attr-defined]  # patched where used

    def buggy(result: object, provider_reference: str | None) -> ActionStatus:
        if (
            isinstance(result, VerificationResult)
            and result.outcome is ActionStatus.CONFIRMED
            and result.health is VerificationHealth.HEALTHY
        ):
            return ActionStatus.CONFIRMED  # whatever reference it echoed
        return real(result, provider_reference)

    mp.setattr(observing_module, "classify_verification", buggy)
    return {}


def _absence_without_retry_safe_is_failed(mp: pytest.MonkeyPatch) -> dict[str, Any]:
    real = observing_module.classify_verification  # type: ignore[attr-defined]  # patched where used

    def buggy(result: object, provider_reference: str | None) -> ActionStatus:
        if (
            isinstance(result, VerificationResult)
            and result.outcome is ActionStatus.FAILED
            and result.health is VerificationHealth.HEALTHY
            and result.verified_provider_reference == provider_reference
        ):
            return ActionStatus.FAILED  # retry_safe ignored
        return real(result, provider_reference)

    mp.setattr(observing_module, "classify_verification", buggy)
    return {}


async def _first_writer_wins_merge(
    store: ProvenLedger,
    receipt: ActionReceipt,
    verify: Any,
    source: Any,
    events: EventSink,
    *,
    replayed: bool,
) -> ActionResult[Any]:
    """On losing a reconciliation race, keeps the other writer's receipt as is."""
    observation = await observing_module.observe(verify, receipt, source, receipt.attempts, events)
    proposed, _ = settled_module.observation_merged(
        receipt, observation.record, source, "recover_pending"
    )
    if await store.ledger.record(proposed):
        return ActionResult(proposed, replayed=replayed)
    stored = await store.ledger.get(receipt.action_id)
    assert stored is not None
    return ActionResult(stored, replayed=replayed)


def _first_writer_wins(mp: pytest.MonkeyPatch) -> dict[str, Any]:
    mp.setattr(recovery_module, "observe_and_merge", _first_writer_wins_merge)
    mp.setattr(attempts_module, "observe_and_merge", _first_writer_wins_merge)
    return {}


def _invoke_after_unproven_attempt_start(mp: pytest.MonkeyPatch) -> dict[str, Any]:
    async def buggy(
        self: ProvenLedger,
        proposed: ActionReceipt,
        previous: ActionReceipt,
        events: EventSink,
        lease: float | None = None,
        rebase: Any = None,
    ) -> ActionReceipt:
        with suppress(Exception):  # treats a failed attempt-start write as if it had succeeded
            await self.ledger.start_attempt(proposed, lease=lease)
        return proposed

    mp.setattr(ProvenLedger, "start_attempt", buggy)
    return {}


class TakesOverAfterWaiting(ActionRunner):
    """Waits for a claim holder by taking its claim over when the wait runs out."""

    async def execute(self, action_name: str, operation: Any, **kwargs: Any) -> Any:
        wait = kwargs.pop("wait_in_progress", None)
        try:
            return await super().execute(action_name, operation, **kwargs)
        except ActionInProgressError as exc:
            if wait is None or exc.receipt is None:
                raise
            current = await self.ledger.get(exc.receipt.action_id)
            if current is None or not current.is_pending:
                raise
            policy = kwargs.get("policy") or self.policy
            return await attempts_module.run_attempts(
                ProvenLedger(self.ledger, ""),
                current,
                operation,
                None,
                policy,
                EventSink((), "execute"),
                self._tenure,
            )


def _take_over_after_waiting(mp: pytest.MonkeyPatch) -> dict[str, Any]:
    return {"runner_class": TakesOverAfterWaiting}


class _ActsOnHeldClaimAfterWaiting(ActionRunner):
    """When a wait for a claim holder runs out, does something about the claim
    (``act``) instead of reporting it in progress."""

    async def execute(self, action_name: str, operation: Any, **kwargs: Any) -> Any:
        try:
            return await super().execute(action_name, operation, **kwargs)
        except ActionInProgressError as exc:
            if kwargs.get("wait_in_progress") is None or exc.receipt is None:
                raise
            return await self.act(exc, exc.receipt, action_name, operation, kwargs)

    async def act(
        self, exc: Exception, held: ActionReceipt, name: str, operation: Any, kw: Any
    ) -> Any:
        raise exc


class SettlesHolderAfterWaiting(_ActsOnHeldClaimAfterWaiting):
    """Settles a held, started claim as an operator's recovery would (UNKNOWN
    without a verifier) and returns that: the holder, still running, then
    cannot record its own outcome."""

    async def act(
        self, exc: Exception, held: ActionReceipt, name: str, operation: Any, kw: Any
    ) -> Any:
        if not held.attempts:
            raise exc
        # Without a verifier of its own, as an operator's recovery with one
        # that cannot see anything: UNKNOWN.
        verifier = kw.get("verifier") or (
            lambda receipt: VerificationResult.unknown(reason="nothing to read")
        )
        return await self.recover_pending(held.action_id, verifier)


def _settles_holder_after_waiting(mp: pytest.MonkeyPatch) -> dict[str, Any]:
    return {"runner_class": SettlesHolderAfterWaiting}


def _accept_unproven_completion(mp: pytest.MonkeyPatch) -> dict[str, Any]:
    async def buggy(
        self: ProvenLedger,
        final: ActionReceipt,
        durable: ActionReceipt,
        events: EventSink,
        **kw: Any,
    ) -> ActionReceipt:
        try:
            written = await self.ledger.record(final)
        except Exception:
            # After a failed completion write, believes it was stored if anything is there.
            written = await self.ledger.get(final.action_id) is not None
        if not written:
            raise OutcomeNotRecordedError(
                "outcome not recorded",
                receipt=durable,
                operation_invoked=True,
                observed_status=kw["observed_status"],
            )
        return final

    mp.setattr(ProvenLedger, "record_outcome", buggy)
    return {}


def _answers_unknown_to_everything(mp: pytest.MonkeyPatch) -> dict[str, Any]:
    real = evidence_module.settle

    def buggy(attempts: Any, observations: Any) -> Any:
        return dataclasses.replace(real(attempts, observations), final_status=ActionStatus.UNKNOWN)

    mp.setattr(attempts_module, "settle", buggy)
    mp.setattr(completing_module, "settle", buggy)
    mp.setattr(settled_module, "settle", buggy)
    return {}


def _never_retries(mp: pytest.MonkeyPatch) -> dict[str, Any]:
    mp.setattr(policy_module, "decide_retry", lambda status, **kw: False)
    return {}


# -- ledger bugs ---------------------------------------------------------------------


class NonAtomicClaimLedger(InMemoryLedger):
    """Checks for an existing claim, yields, then inserts: a read-then-write race."""

    async def claim(
        self, receipt: ActionReceipt, *, lease: float | None = None
    ) -> tuple[ActionReceipt, bool]:
        key = (receipt.namespace, receipt.action_name, receipt.idempotency_key)
        existing = await self.find(receipt.action_name, receipt.idempotency_key, receipt.namespace)
        if existing is not None:
            return existing, False
        await asyncio.sleep(0)
        with self._lock:
            receipt = self._leased(receipt, lease)
            self._by_id[receipt.action_id] = receipt
            self._by_key[key] = receipt.action_id
        return receipt, True


def _non_atomic_claim(mp: pytest.MonkeyPatch) -> dict[str, Any]:
    return {"memory_class": NonAtomicClaimLedger}


class ReleaseCheckSkippingRunner(ActionRunner):
    """An operator tool that trusts the ledger to refuse unsafe releases."""

    async def release_unstarted(
        self, action_id: str, *, operator: str | None = None, reason: str | None = None
    ) -> None:
        receipt = await self.receipt(action_id)
        await self.ledger.release(action_id, receipt.version)


def _release_started_claim(mp: pytest.MonkeyPatch) -> dict[str, Any]:
    return {"ledger_class": ReleasesStartedClaimsLedger, "runner_class": ReleaseCheckSkippingRunner}


# -- more runner, policy, verification, merge and canonicalisation bugs --------------------


def _retries_beyond_max_attempts(mp: pytest.MonkeyPatch) -> dict[str, Any]:
    real = policy_module.decide_retry

    def buggy(status: ActionStatus, **kw: Any) -> bool:
        # The attempt budget is forgotten: as if every policy had one more attempt.
        return bool(real(status, **{**kw, "max_attempts": kw["max_attempts"] + 1}))

    mp.setattr(policy_module, "decide_retry", buggy)
    return {}


def _retries_definitive_declines(mp: pytest.MonkeyPatch) -> dict[str, Any]:
    real = policy_module.decide_retry

    def buggy(status: ActionStatus, **kw: Any) -> bool:
        return bool(real(status, **{**kw, "failure_is_retryable": True}))

    mp.setattr(policy_module, "decide_retry", buggy)
    return {}


def _accepts_degraded_evidence(mp: pytest.MonkeyPatch) -> dict[str, Any]:
    real = observing_module.classify_verification  # type: ignore[attr-defined]  # patched where used

    def buggy(result: Any, provider_reference: str | None) -> ActionStatus:
        if (
            isinstance(result, VerificationResult)
            and result.health is not VerificationHealth.HEALTHY
        ):
            result = dataclasses.replace(result, health=VerificationHealth.HEALTHY)
        return real(result, provider_reference)

    mp.setattr(observing_module, "classify_verification", buggy)
    return {}


async def _no_answer_merged(
    store: ProvenLedger,
    receipt: ActionReceipt,
    verify: Any,
    source: Any,
    events: EventSink,
    *,
    replayed: bool,
) -> ActionResult[Any]:
    """Merges a verifier's failure to answer into a completed receipt like an answer."""
    observation = await observing_module.observe(verify, receipt, source, receipt.attempts, events)
    return await recovery_module.merge_observation(
        store, receipt, observation, source, events, replayed=replayed
    )


def _no_answer_written(mp: pytest.MonkeyPatch) -> dict[str, Any]:
    mp.setattr(recovery_module, "observe_and_merge", _no_answer_merged)
    return {}


def _latest_observation_wins(mp: pytest.MonkeyPatch) -> dict[str, Any]:
    def buggy(statuses: Any) -> tuple[ActionStatus | None, bool]:
        statuses = list(statuses)
        decisive = [s for s in statuses if s is not ActionStatus.UNKNOWN]
        if decisive:
            return decisive[-1], False
        return (ActionStatus.UNKNOWN if statuses else None), False

    mp.setattr(evidence_module, "merge_observations", buggy)
    return {}


def _hash_depends_on_key_order(mp: pytest.MonkeyPatch) -> dict[str, Any]:
    import hashlib
    import json

    real = arguments_module.checked_request_hash  # type: ignore[attr-defined]  # patched where used

    def buggy(request: Any, max_bytes: int | None = None) -> str:
        real(request, max_bytes)  # still validates
        text = json.dumps(request, separators=(",", ":"))  # insertion order, no RFC 8785
        return hashlib.sha256(text.encode()).hexdigest()

    mp.setattr(arguments_module, "checked_request_hash", buggy)
    return {}


def _hash_tells_int_from_float(mp: pytest.MonkeyPatch) -> dict[str, Any]:
    import hashlib

    real = arguments_module.checked_request_hash  # type: ignore[attr-defined]  # patched where used

    def buggy(request: Any, max_bytes: int | None = None) -> str:
        kinds = "".join(sorted(f"{k}:{type(v).__name__}" for k, v in request.items()))
        return hashlib.sha256((real(request, max_bytes) + kinds).encode()).hexdigest()

    mp.setattr(arguments_module, "checked_request_hash", buggy)
    return {}


class InvokesForAnInProgressClaim(ActionRunner):
    """Treats a claim held by another caller as abandoned and runs the operation anyway."""

    async def execute(self, action_name: str, operation: Any, **kwargs: Any) -> Any:
        try:
            return await super().execute(action_name, operation, **kwargs)
        except ActionInProgressError as exc:
            receipt = exc.receipt
            if receipt is None:
                raise
            await call_maybe_async(operation)  # sync or async, where it belongs
            return ActionResult(receipt, replayed=True)


def _start_read_back_accepts_any_receipt(mp: pytest.MonkeyPatch) -> dict[str, Any]:
    real = ProvenLedger.start_attempt

    async def buggy(
        self: ProvenLedger,
        proposed: ActionReceipt,
        previous: ActionReceipt,
        events: EventSink,
        lease: float | None = None,
        *,
        rebase: Any,
    ) -> ActionReceipt:
        try:
            if await self.ledger.start_attempt(proposed, lease=lease):
                return proposed
        except Exception:
            # After an attempt-start write raises, continues if the claim merely still exists.
            if await self.ledger.get(proposed.action_id) is not None:  # not "== proposed"
                return proposed
        return await real(self, proposed, previous, events, lease, rebase=rebase)

    mp.setattr(ProvenLedger, "start_attempt", buggy)
    return {}


class ClaimAlwaysCreatedLedger(InMemoryLedger):
    """Reports every claim as newly created, even when it returns the existing one."""

    async def claim(
        self, receipt: ActionReceipt, *, lease: float | None = None
    ) -> tuple[ActionReceipt, bool]:
        stored, _ = await super().claim(receipt, lease=lease)
        return stored, True


def _invokes_for_in_progress_claim(mp: pytest.MonkeyPatch) -> dict[str, Any]:
    return {"runner_class": InvokesForAnInProgressClaim}


# -- more ledger bugs ----------------------------------------------------------------------


class VersionBlindRecordLedger(InMemoryLedger):
    """Applies a completion whatever version is stored: a stale writer wins."""

    async def record(self, receipt: ActionReceipt) -> bool:
        stored = self._by_id.get(receipt.action_id)
        if stored is None:
            return False
        with self._lock:
            self._by_id[receipt.action_id] = receipt
        return True


class StartsAttemptsOnCompletedClaims(InMemoryLedger):
    """Starts an attempt on any claim with the right version, completed or not."""

    async def start_attempt(self, receipt: ActionReceipt, *, lease: float | None = None) -> bool:
        stored = self._by_id.get(receipt.action_id)
        if stored is None or stored.version != receipt.version - 1:
            return False
        with self._lock:
            self._by_id[receipt.action_id] = receipt
        return True


class ReopeningSQLiteLedger(SQLiteLedger):
    """Its record() lost the guard against moving a COMPLETED claim back to PENDING."""

    async def record(self, receipt: ActionReceipt) -> bool:
        if len(receipt.attempt_records) != receipt.attempts:
            return False
        statements = sqlite_module._SQL
        guard = " AND NOT (claim_state = 'COMPLETED' AND :claim_state = 'PENDING')"
        assert guard in statements.templates["record"]
        weakened = compile_sql(
            statements.templates["record"].replace(guard, ""), statements.dialect
        )
        return await self._transition(weakened, receipt, now=None)


class ReleasesStartedSQLiteLedger(SQLiteLedger):
    """Releases a claim at the right version even after its attempt started."""

    async def release(self, action_id: str, version: int) -> bool:
        deleted = await self._write(
            compile_sql(
                "DELETE FROM receipts WHERE action_id = :action_id AND version = :version "
                "AND claim_state = 'PENDING' RETURNING action_id",
                SQLITE,
            ),
            {"action_id": action_id, "version": version},
        )
        return bool(deleted)


class UnboundedLockWaitSQLiteLedger(SQLiteLedger):
    """Takes the writer lock on the event loop, waits for it without bound, and
    holds it until the loop gets round to releasing it (the pre-0.2 design)."""

    async def _write(self, statement: Any, values: Any) -> list[Any]:
        conn = await self._connection()
        fd = os.open(self._writer.path, os.O_CREAT | os.O_RDWR, 0o600)
        try:
            await asyncio.to_thread(fcntl.flock, fd, fcntl.LOCK_EX)
            params = self._params(statement, values)
            return list(await conn.execute_fetchall(statement.sql, params))
        finally:
            os.close(fd)


def _sync_operation_on_the_loop(mp: pytest.MonkeyPatch) -> dict[str, Any]:
    async def buggy(fn: Any, **options: Any) -> Any:
        return fn()  # a blocking call, right on the event loop

    mp.setattr(invoking_module, "call_blocking", buggy)
    return {}


class _ForgetsItMayAct(invoking_module.Acting):
    """Never remembers that the operation's call is under way."""

    __slots__ = ()

    @property
    def may_act(self) -> bool:
        return False

    @may_act.setter
    def may_act(self, value: bool) -> None:
        pass


def _cancelled_call_settled_while_its_thread_acts(mp: pytest.MonkeyPatch) -> dict[str, Any]:
    # A call cancelled during its operation's call is then recorded UNKNOWN at
    # once, under the token its worker thread still carries.
    mp.setattr(attempts_module, "Acting", _ForgetsItMayAct)
    return {}


def _async_call_settled_while_its_thread_acts(mp: pytest.MonkeyPatch) -> dict[str, Any]:
    # Only a sync operation's own thread counts as still acting (the first
    # fix of 2026-12-07): an async operation that handed its work to a thread
    # is recorded UNKNOWN at once when its caller is cancelled.
    real = invoking_module.invoke

    async def buggy(operation: Any, **options: Any) -> Any:
        if is_async_callable(operation):
            options["acting"] = None
        return await real(operation, **options)

    mp.setattr(attempts_module, "invoke", buggy)
    return {}


def _retry_start_failure_says_not_invoked(mp: pytest.MonkeyPatch) -> dict[str, Any]:
    def buggy(exc: ActionPersistenceError, *rest: Any) -> ActionPersistenceError:
        # Reports only the attempt that could not start, forgetting the earlier ones.
        return ActionPersistenceError(str(exc), receipt=exc.receipt, operation_invoked=False)

    mp.setattr(attempts_module, "earlier_attempts_ran", buggy)
    return {}


def _observations_truncated_oldest_first(mp: pytest.MonkeyPatch) -> dict[str, Any]:
    def buggy(
        attempts: Any, observations: Sequence[Any], limit: int | None = None
    ) -> tuple[Any, ...]:
        bound = evidence_module.MAX_KEPT_OBSERVATIONS if limit is None else limit
        return tuple(observations)[-bound:]  # whatever the dropped ones proved

    mp.setattr(observing_module, "keep_observations", buggy)
    return {}


def _newest_observation_dropped(mp: pytest.MonkeyPatch) -> dict[str, Any]:
    real = evidence_module.keep_observations

    def buggy(
        attempts: Any, observations: Sequence[Any], limit: int | None = None
    ) -> tuple[Any, ...]:
        kept = list(real(attempts, observations, limit))
        bound = evidence_module.MAX_KEPT_OBSERVATIONS if limit is None else limit
        # The trimming loop runs one step too far: past the bound, with every
        # older one needed, it tries the newest too, which proves nothing new.
        if len(kept) > bound and kept[-1] is observations[-1]:
            target = evidence_module.settle(attempts, kept)
            if evidence_module.settle(attempts, kept[:-1]) == target:
                kept = kept[:-1]
        return tuple(kept)

    mp.setattr(observing_module, "keep_observations", buggy)
    return {}


def _trusts_return_when_verifier_fails(mp: pytest.MonkeyPatch) -> dict[str, Any]:
    """With a verifier, a normal return counts as CONFIRMED whenever the verifier
    raises or answers with something else (the README: it only proves that
    execution finished). The world agrees whenever the fake provider's
    return means the effect exists, so only the evidence can tell."""
    real_invoke, real_observe = attempts_module.invoke, attempts_module.observe  # type: ignore[attr-defined]
    returned = [False]

    async def invoke(operation: Any, *, verifying: bool, **rest: Any) -> Any:
        execution = await real_invoke(operation, verifying=verifying, **rest)
        returned[0] = execution.error is None  # no exception: a normal return
        return execution

    async def observe(verify: Any, receipt: Any, source: Any, attempt: int, events: Any) -> Any:
        seen = await real_observe(verify, receipt, source, attempt, events)
        if seen.result is None and returned[0]:
            trusted = dataclasses.replace(seen.record, status=ActionStatus.CONFIRMED)
            return dataclasses.replace(seen, record=trusted)
        return seen

    mp.setattr(attempts_module, "invoke", invoke)
    mp.setattr(attempts_module, "observe", observe)
    return {}


PLANTED_BUGS = [
    PlantedBug(
        "retry-unknown-by-default",
        "a commit-then-timeout under a policy that retries FAILED",
        "runner",
        names("no-second-mutation-after-unknown"),
        _retry_unknown_by_default,
    ),
    PlantedBug(
        "later-failed-erases-unknown",
        "escape-hatch policy: an ambiguous attempt, then a decline",
        "runner",
        names(
            "status-permitted-by-recorded-evidence",
            "unknown-evidence-never-erased",
            "failed-requires-no-effect-now-or-later",
        ),
        _later_failed_erases_unknown,
    ),
    PlantedBug(
        "accept-unbound-confirmation",
        "a verifier confirming another reference while nothing committed",
        "runner",
        names("status-permitted-by-recorded-evidence", "confirmed-requires-the-effect"),
        _accept_unbound_confirmation,
    ),
    PlantedBug(
        "absence-without-retry-safe-is-failed",
        "a stale healthy absence after a commit-then-timeout",
        "runner",
        # Under a retrying policy the wrong FAILED also licenses a second invocation.
        names(
            "no-second-mutation-of-a-claim-by-anyone",
            "status-permitted-by-recorded-evidence",
            "failed-requires-no-effect-now-or-later",
            "unknown-evidence-never-erased",
            "no-second-mutation-after-unknown",
        ),
        _absence_without_retry_safe_is_failed,
    ),
    PlantedBug(
        "first-writer-wins-merge",
        "two reconcilers whose writes race",
        "merge",
        names("every-observation-is-kept", "merge-is-order-independent"),
        _first_writer_wins,
    ),
    PlantedBug(
        "non-atomic-claim",
        "concurrent claims of one key",
        "ledger",
        names("one-winner-per-key"),
        _non_atomic_claim,
    ),
    PlantedBug(
        "release-started-claim",
        "a release read at zero attempts, executed after the attempt started",
        "runner",
        # The key is then claimed and invoked again: a second mutation too.
        names("claims-never-stolen", "no-second-mutation-of-a-claim-by-anyone"),
        _release_started_claim,
    ),
    PlantedBug(
        "invoke-after-unproven-attempt-start",
        "an attempt-start write that fails before storage",
        "runner",
        # Or what the uncounted invocation leads to: a taker of the expired
        # claim sees no attempt started and invokes again; or the holder's
        # outcome, written over a start that never was, is refused; or the
        # start failed because the claim had passed to a taker.
        names(
            "invocation-counted-before-call",
            "no-second-mutation-of-a-claim-by-anyone",
            "holders-fail-only-by-own-faults-or-operators",
            "operations-run-only-while-their-claim-is-held",
        ),
        _invoke_after_unproven_attempt_start,
    ),
    PlantedBug(
        "answers-unknown-to-everything",
        "any clean success",
        "runner",
        # Or a verifier's bound confirmation, or its fenced absence, left
        # UNKNOWN (a takeover's or a recovery's, often).
        names(
            "clean-success-is-confirmed",
            "bound-confirmation-settles-unknown",
            "fenced-absence-settles-failed",
        ),
        _answers_unknown_to_everything,
    ),
    PlantedBug(
        "trusts-return-when-verifier-fails",
        "a normal return while the call's verifier raises or answers nonsense",
        "runner",
        names("status-permitted-by-recorded-evidence"),
        _trusts_return_when_verifier_fails,
    ),
    PlantedBug(
        "take-over-after-waiting",
        "a duplicate whose wait runs out while the holder's attempt is unsettled",
        "runner",
        names(
            "only-the-claimer-invokes",
            "claims-leave-holders-only-by-operator-verbs",
            "no-second-mutation-of-a-claim-by-anyone",
            "invocation-counted-before-call",
            # The taker runs on the holder's attempt count, so its own
            # retryable failure is not retried: seen when the holder crashed
            # before it learnt its claim's id (only-the-claimer-invokes needs it).
            "retryable-failure-is-retried",
            # The holder's next write is refused: it fails for no fault of its own.
            "holders-fail-only-by-own-faults-or-operators",
            # It drops the caller's wait_in_progress: a waiter that does not
            # meet a pending claim answers in progress at once.
            "waiters-never-give-up-before-their-deadline",
        ),
        _take_over_after_waiting,
    ),
    PlantedBug(
        "settles-holder-after-waiting",
        "a duplicate whose wait runs out while the holder's attempt runs",
        "runner",
        names(
            "claims-leave-holders-only-by-operator-verbs",
            "holders-fail-only-by-own-faults-or-operators",
        ),
        _settles_holder_after_waiting,
    ),
    PlantedBug(
        "accept-unproven-completion",
        "a completion write that fails before storage, then a successful read",
        "runner",
        names("returned-receipts-are-durable"),
        _accept_unproven_completion,
    ),
    PlantedBug(
        "retries-beyond-max-attempts",
        "retryable rejections until the policy's attempts run out",
        "runner",
        names("invocations-bounded-by-policy"),
        _retries_beyond_max_attempts,
    ),
    PlantedBug(
        "retries-definitive-declines",
        "a decline (definitive, not retryable) under a policy that retries FAILED",
        "runner",
        names("no-second-mutation-after-unknown", "no-second-mutation-of-a-claim-by-anyone"),
        _retries_definitive_declines,
    ),
    PlantedBug(
        "accepts-degraded-evidence",
        "a degraded read claiming the opposite of the world",
        "runner",
        # Under a retrying policy the wrong FAILED also licenses a second invocation.
        names(
            "no-second-mutation-of-a-claim-by-anyone",
            "status-permitted-by-recorded-evidence",
            "confirmed-requires-the-effect",
            "failed-requires-no-effect-now-or-later",
            "unknown-evidence-never-erased",
            "no-second-mutation-after-unknown",
        ),
        _accepts_degraded_evidence,
    ),
    PlantedBug(
        "latest-observation-wins",
        "two reconcilers observing opposite answers",
        "merge",
        names("merge-is-order-independent", "every-observation-is-kept"),
        _latest_observation_wins,
    ),
    PlantedBug(
        "no-answer-written-as-an-observation",
        "a reconciler whose verifier raises",
        "merge",
        names("no-answer-is-not-evidence"),
        _no_answer_written,
    ),
    PlantedBug(
        "hash-depends-on-key-order",
        "a duplicate whose request lists its keys in another order",
        "runner",
        names("equal-requests-never-conflict"),
        _hash_depends_on_key_order,
    ),
    PlantedBug(
        "hash-tells-int-from-float",
        "a duplicate whose amount is written as a float",
        "runner",
        names("equal-requests-never-conflict"),
        _hash_tells_int_from_float,
    ),
    PlantedBug(
        "invokes-for-in-progress-claim",
        "a duplicate arriving while the first contender's attempt is unsettled",
        "runner",
        names(
            "invocations-bounded-by-policy",
            "no-second-mutation-of-a-claim-by-anyone",
            "invocation-counted-before-call",
        ),
        _invokes_for_in_progress_claim,
    ),
    PlantedBug(
        "start-read-back-accepts-any-receipt",
        "an attempt-start write that fails before storage",
        "runner",
        # Or what the uncounted invocation leads to: a taker of the expired
        # claim sees no attempt started and invokes again; or the holder's
        # outcome, written over a start that never was, is refused; or the
        # receipt it accepted was not its claim at all.
        names(
            "invocation-counted-before-call",
            "no-second-mutation-of-a-claim-by-anyone",
            "holders-fail-only-by-own-faults-or-operators",
            "operations-run-only-while-their-claim-is-held",
        ),
        _start_read_back_accepts_any_receipt,
    ),
    PlantedBug(
        "memory-claim-always-created",
        "a second claim of a taken key",
        "ledger",
        names("backends-agree-with-the-model", "one-winner-per-key"),
        lambda mp: {"memory_class": ClaimAlwaysCreatedLedger},
    ),
    PlantedBug(
        "memory-record-ignores-version",
        "a completion written with a stale version",
        "ledger",
        names("backends-agree-with-the-model", "backends-hold-identical-receipts"),
        lambda mp: {"memory_class": VersionBlindRecordLedger},
    ),
    PlantedBug(
        "memory-starts-attempts-on-completed-claims",
        "an attempt start proposed on a completed claim",
        "ledger",
        names("backends-agree-with-the-model", "backends-hold-identical-receipts"),
        lambda mp: {"memory_class": StartsAttemptsOnCompletedClaims},
    ),
    PlantedBug(
        "sqlite-record-reopens-completed-claims",
        "a record that moves a completed claim back to PENDING",
        "ledger",
        names("backends-agree-with-the-model", "backends-hold-identical-receipts"),
        lambda mp: {"sqlite_class": ReopeningSQLiteLedger},
    ),
    PlantedBug(
        "sqlite-releases-started-claims",
        "a release at the current version of a claim whose attempt started",
        "ledger",
        names("backends-agree-with-the-model", "backends-hold-identical-receipts"),
        lambda mp: {"sqlite_class": ReleasesStartedSQLiteLedger},
    ),
    PlantedBug(
        "sqlite-lock-wait-unbounded",
        "a write that meets another process stuck holding the writer lock",
        "runner",
        names("lock-waits-are-bounded"),
        lambda mp: {"ledger_class": UnboundedLockWaitSQLiteLedger},
        backend="sqlite",
    ),
    PlantedBug(
        "sync-operation-on-the-loop",
        "an execute whose operation is a plain (blocking) function",
        "runner",
        names("sync-operations-run-off-the-loop"),
        _sync_operation_on_the_loop,
    ),
    PlantedBug(
        "cancelled-call-settled-while-its-thread-acts",
        "a caller that gives up while its sync operation's thread is in the provider",
        "runner",
        # Or what follows: the thread's late call meets a completed claim.
        names("no-settling-while-its-operation-acts", "invocation-counted-before-call"),
        _cancelled_call_settled_while_its_thread_acts,
    ),
    PlantedBug(
        "cancelled-async-call-settled-while-its-thread-acts",
        "a caller that gives up while the thread its async operation started is in the provider",
        "runner",
        names("no-settling-while-its-operation-acts", "invocation-counted-before-call"),
        _async_call_settled_while_its_thread_acts,
    ),
    PlantedBug(
        "retry-start-failure-says-not-invoked",
        "a retryable rejection, then an attempt-start write that fails",
        "runner",
        names("persistence-errors-tell-what-ran"),
        _retry_start_failure_says_not_invoked,
    ),
    PlantedBug(
        "observations-truncated-oldest-first",
        "more concurrent observations than a receipt keeps, a decisive one first",
        "merge",
        names("merge-is-order-independent", "every-provider-request-id-is-kept"),
        _observations_truncated_oldest_first,
    ),
    PlantedBug(
        "newest-observation-dropped",
        "more observations than a receipt keeps, every older one needed, then one proving nothing",
        "merge",
        # A merge that dropped the newest may count it as never written, too.
        names("the-newest-observation-is-kept", "every-observation-is-kept"),
        _newest_observation_dropped,
    ),
    PlantedBug(
        "never-retries",
        "a retryable rejection under a policy that retries FAILED",
        "runner",
        names("retryable-failure-is-retried"),
        _never_retries,
    ),
]


@contextmanager
def planted(bug: PlantedBug) -> Iterator[dict[str, Any]]:
    """Apply the bug for the duration of the block; yields class overrides."""
    mp = pytest.MonkeyPatch()
    try:
        yield bug.plant(mp)
    finally:
        mp.undo()


# Leases, takeover and fencing, and the receipt lifecycle, live in their own modules.
PLANTED_BUGS += CLAIM_BUGS
PLANTED_BUGS += LEASE_BUGS
PLANTED_BUGS += LIFECYCLE_BUGS
PLANTED_BUGS += GROUP_BUGS
PLANTED_BUGS += BOUND_BUGS
PLANTED_BUGS += SETTLE_BUGS
