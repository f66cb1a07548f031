"""The lease properties of the runner machine, registered with the others in ``invariants``.

Each reads only the record of the run: what the gated ledger saw each
contender's committed writes do (judged by the machine's own copy of the
ledger's clock), how each contender ended, and the ledger as an observer
sees it.
"""

from __future__ import annotations

from dataoad import ActionStatus, ClaimFencedError
from stateful_tests.invariants import RunnerMachineBase, _clean_ledger, fail, safety

__all__: list[str] = []


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
            and not c.with_verifier
            and _clean_ledger(c)
            and c.action_id is not None
        ):
            continue
        stored = m.observed.get(c.action_id)
        if stored is None:
            continue
        seen = [r.execution_status for r in stored.attempt_records]
        if ActionStatus.CONFIRMED not in seen or stored.final_status is ActionStatus.FAILED:
            raise fail(
                zombie_evidence_never_lost,
                f"contender {c.name} saw its charge for {c.key} succeed after its claim "
                f"{c.action_id[:8]} was taken over, but the receipt says "
                f"{stored.claim_state.value}/{stored.final_status} with attempt executions "
                f"{[None if s is None else s.value for s in seen]}",
            )
