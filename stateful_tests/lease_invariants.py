"""The lease properties of the runner machine, registered with the others in ``invariants``.

Each reads only the record of the run: what the gated ledger saw each
contender's committed writes do (judged by the machine's own copy of the
ledger's clock), how each contender ended, and the ledger as an observer
sees it.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from dataoad import ActionStatus, ClaimFencedError
from stateful_tests.harness import LedgerFault, ProviderFault
from stateful_tests.invariants import RunnerMachineBase, _clean_ledger, fail, progress, safety
from stateful_tests.lease_rules import LEASE

__all__: list[str] = []


def _clean_since_last_call(c: Any) -> bool:
    since = c.ledger_calls_at_call[-1] if c.ledger_calls_at_call else 0
    return all(fault is LedgerFault.NONE for _, fault in c.ledger_faults[since:])


@safety
def takeovers_only_after_expiry(m: RunnerMachineBase) -> None:
    """A claim passes to a new owner only after its lease ran out by the ledger's clock, under the next fencing token, and a fenced worker never writes, renews or completes it again."""
    for c in m.contenders_list:
        if c.lease_breaches:
            raise fail(
                takeovers_only_after_expiry,
                f"contender {c.name} {c.lease_breaches[0]}",
            )


@safety
def operations_run_only_while_their_claim_is_held(m: RunnerMachineBase) -> None:
    """A contender invokes its operation only while it holds the claim: PENDING and under its own fencing token (a stall between the write that counted the attempt and the call, while another worker took the claim over, must not let it act late)."""
    for c in m.contenders_list:
        if c.invoked_unheld:
            raise fail(
                operations_run_only_while_their_claim_is_held,
                f"contender {c.name} {c.invoked_unheld[0]}",
            )


@safety
def at_most_one_live_owner(m: RunnerMachineBase) -> None:
    """At any moment at most one running contender holds a PENDING claim under its current fencing token."""
    for receipt in m.observed.values():
        if not receipt.is_pending:
            continue
        holders = [
            c.name
            for c in m.contenders_list
            if c.kind == "execute"
            and not c.finished
            and c.tokens.get(receipt.action_id) == receipt.fencing_token
        ]
        if len(holders) > 1:
            raise fail(
                at_most_one_live_owner,
                f"contenders {', '.join(holders)} all hold claim {receipt.action_id[:8]} of "
                f"{receipt.idempotency_key} under fencing token {receipt.fencing_token}",
            )


@safety
def zombie_evidence_never_lost(m: RunnerMachineBase) -> None:
    """A fenced worker that saw its operation succeed leaves that success in the receipt, so it never ends FAILED or loses the effect."""
    for c in m.contenders_list:
        error = c.outcome
        if not (
            c.finished
            and isinstance(error, ClaimFencedError)
            and error.operation_invoked
            # What it saw, not what was drawn: a request the provider refused
            # as fenced was drawn as a success but never seen as one.
            and error.observed_status is ActionStatus.CONFIRMED
            # Its own call returned (with a verifier, which then agreed).
            and c.provider_calls[-1:] == [ProviderFault.NONE]
            # A fault after its last call may keep its evidence out of the
            # ledger (it is then only in the error); one before cannot.
            and _clean_since_last_call(c)
            and c.action_id is not None
        ):
            continue
        stored = m.observed.get(c.action_id)
        if stored is None:
            continue
        # With a verifier a normal return is execution UNKNOWN and the
        # verifier's CONFIRMED is the success: either kind of record keeps it.
        seen = [(r.execution_status, r.verification_status) for r in stored.attempt_records]
        kept = any(ActionStatus.CONFIRMED in pair for pair in seen)
        if stored.final_status is ActionStatus.FAILED or not (
            kept or stored.final_status is ActionStatus.CONFIRMED
        ):
            raise fail(
                zombie_evidence_never_lost,
                f"contender {c.name} saw its charge for {c.key} succeed after its claim "
                f"{c.action_id[:8]} was taken over, but the receipt says "
                f"{stored.claim_state.value}/{stored.final_status} with attempts "
                f"(execution, verification) "
                f"{[tuple(None if s is None else s.value for s in pair) for pair in seen]}",
            )


@progress
def stranded_claims_settled_by_a_sweep(m: RunnerMachineBase) -> None:
    """A sweep that meets no ledger fault completes or releases every claim whose lease had run out when it began, unless its holder renewed it or another took it over meanwhile."""
    for c in m.contenders_list:
        if not (
            c.kind == "sweep"
            and c.finished
            and not c.crashed
            and isinstance(c.outcome, list)
            and _clean_ledger(c)
        ):
            continue
        for action_id, (token, until) in c.stale_at_start.items():
            stored = m.observed.get(action_id)
            if stored is None or not stored.is_pending:
                continue
            untouched = (stored.fencing_token, stored.lease_expires_at) == (token, until)
            if untouched or stored.owner == c.name:
                raise fail(
                    stranded_claims_settled_by_a_sweep,
                    f"contender {c.name}'s sweep left claim {action_id[:8]} of "
                    f"{stored.idempotency_key} PENDING (owner {stored.owner}, token "
                    f"{stored.fencing_token}), stale when the sweep began",
                )


@safety
def leases_run_from_the_write_that_grants_them(m: RunnerMachineBase) -> None:
    """A PENDING claim's lease ends exactly one lease after the ledger's clock at the write that last granted it (claim, attempt start, takeover, renewal): never by a writer's clock, never from an older write."""
    lease = timedelta(seconds=LEASE)
    for receipt in m.observed.values():
        grant = m.lease_grants.get(receipt.action_id)
        if not receipt.is_pending or receipt.lease_expires_at is None or grant is None:
            continue
        if not grant.since + lease <= receipt.lease_expires_at <= grant.until + lease:
            raise fail(
                leases_run_from_the_write_that_grants_them,
                f"claim {receipt.action_id[:8]} of {receipt.idempotency_key} holds a lease to "
                f"{receipt.lease_expires_at.isoformat()}, but its last {grant.method} "
                f"committed between {grant.since.isoformat()} and {grant.until.isoformat()} "
                f"by the ledger's clock, with a lease of {LEASE:g} s",
            )


@progress
def a_lease_ends_at_exactly_its_expiry(m: RunnerMachineBase) -> None:
    """A duplicate that meets a claim when the ledger's clock stands exactly at its lease end takes it over (unless a ledger fault at its own gates excused it)."""
    for c in m.contenders_list:
        if c.lease_edge is None or not c.finished or c.crashed:
            continue
        side, action_id = c.lease_edge
        if side != "exactly" or action_id in c.took_over or not _clean_ledger(c):
            continue
        raise fail(
            a_lease_ends_at_exactly_its_expiry,
            f"contender {c.name} met claim {action_id[:8]} of {c.key} with the ledger's clock "
            f"at exactly its lease end and did not take it over: "
            f"{type(c.outcome).__name__}",
        )
