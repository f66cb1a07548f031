"""The properties the runner machine checks after every step.

Each is a named function whose docstring states the property in one
sentence. They read the recorded history (what contenders, the provider and
the verifier did), the abstract world and what the ledger returns to an
observer; never the runner's private state. A broken property raises
InvariantViolation naming it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

from dataoad import (
    ActionInProgressError,
    ActionPersistenceError,
    ActionReceipt,
    ActionResult,
    ActionStatus,
    ClaimFencedError,
    ClaimState,
    IdempotencyConflictError,
    NothingInvokedError,
    ObservationSource,
    OutcomeNotRecordedError,
    ResultValueUnavailableError,
    UnresolvedActionError,
    VerificationHealth,
    VerificationObservation,
)
from models.protocol import Evidence, Outcome, evidence_permits, permitted_outcomes
from models.world import World
from stateful_tests.harness import (
    LOCK_WAIT_LIMIT,
    Contender,
    History,
    LeaseGrant,
    LedgerFault,
    ProviderFault,
    WorldProvider,
)
from stateful_tests.violations import InvariantViolation, violation_type


class RunnerMachineBase(Protocol):
    """What the properties read of a run: the record, never the runner's private state.

    (Named for the machine that provides it; any object with these fields will do.)
    """

    contenders_list: list[Contender]
    observed: dict[str, ActionReceipt]
    transitions: dict[str, tuple[ActionReceipt, ActionReceipt | None]]
    released_ids: set[str]
    world: World
    provider: WorldProvider
    history: History
    #: action_id -> the last committed write that granted its claim a lease.
    lease_grants: dict[str, LeaseGrant]


SAFETY: list[Callable[[RunnerMachineBase], None]] = []
PROGRESS: list[Callable[[RunnerMachineBase], None]] = []


def safety(fn: Callable[[RunnerMachineBase], None]) -> Callable[[RunnerMachineBase], None]:
    SAFETY.append(fn)
    return fn


def progress(fn: Callable[[RunnerMachineBase], None]) -> Callable[[RunnerMachineBase], None]:
    PROGRESS.append(fn)
    return fn


def _name(fn: Callable[..., Any]) -> str:
    return fn.__name__.replace("_", "-")


def fail(fn: Callable[..., Any], detail: str) -> InvariantViolation:
    return violation_type(_name(fn))(_name(fn), detail)


# -- safety ------------------------------------------------------------------------------


@safety
def no_second_mutation_after_unknown(m: RunnerMachineBase) -> None:
    """A claim invokes again only after definitive retry-safe evidence, unless its policy opted into retrying UNKNOWN."""
    for c in m.contenders_list:
        if c.escape_hatch:
            continue
        for n, allowed in enumerate(c.call_allowed[1:], start=2):
            if not allowed:
                raise fail(
                    no_second_mutation_after_unknown,
                    f"contender {c.name} invoked the provider a {n}th time for {c.key} after "
                    f"{c.provider_calls[n - 2].value!r} without retry-safe evidence "
                    f"({m.world.count(c.reference)} effects for {c.reference})",
                )


@safety
def no_second_mutation_of_a_claim_by_anyone(m: RunnerMachineBase) -> None:
    """Across all contenders, a claim is invoked again only after definitive retry-safe evidence about its last invocation."""
    previous: dict[str, str] = {}
    for reference, c, allowed in m.provider.calls_by_claim:
        if not allowed and not c.escape_hatch:
            raise fail(
                no_second_mutation_of_a_claim_by_anyone,
                f"contender {c.name} invoked the provider for {reference} after contender "
                f"{previous[reference]}'s invocation, with no retry-safe evidence in between "
                f"({m.world.count(reference)} effects for {reference})",
            )
        previous[reference] = c.name


@safety
def invocation_counted_before_call(m: RunnerMachineBase) -> None:
    """Every invocation happens only after the ledger durably counted that attempt on a PENDING claim (a zombie's late request may reach the provider after its claim was taken over and completed, or an operator completed it under its holder: only the count must hold)."""
    for c in m.contenders_list:
        # A zombie: another contender took one of its claims over under a later
        # token; or an operator's verb settled one of its claims while it ran.
        zombie = any(
            o is not c and a in o.took_over and o.tokens[a] > c.tokens.get(a, 0)
            for o in m.contenders_list
            for a in c.claims
        ) or any(o.kind != "execute" and o.action_id in c.claims for o in m.contenders_list)
        for n, (durable, state) in enumerate(c.durable_attempts_at_call, start=1):
            if durable < n or (state != "PENDING" and not zombie):
                raise fail(
                    invocation_counted_before_call,
                    f"contender {c.name} made invocation {n} for {c.key} while the ledger showed "
                    f"{durable} attempts, claim {state}",
                )


@safety
def no_settling_while_its_operation_acts(m: RunnerMachineBase) -> None:
    """A claim is never completed under the fencing token of an operation call still under way: a caller cancelled while its operation's thread runs on leaves the claim held, for a takeover to settle under the next token."""
    for c in m.contenders_list:
        if c.acting_under is None:
            continue
        action_id, token = c.acting_under
        stored = m.observed.get(action_id)
        if stored is not None and not stored.is_pending and stored.fencing_token == token:
            raise fail(
                no_settling_while_its_operation_acts,
                f"claim {action_id[:8]} of {c.key} was completed {stored.final_status} under "
                f"fencing token {token} while contender {c.name}'s operation still ran on its "
                "worker thread under that token (a verifier fencing below the token could find "
                "it absent before the thread's request goes out)",
            )


@safety
def invocations_bounded_by_policy(m: RunnerMachineBase) -> None:
    """The operation runs at most once per attempt the policy allows, and never for a replay, an in-progress duplicate or a conflict."""
    for c in m.contenders_list:
        limit = c.policy.max_attempts if c.policy is not None else 0
        if len(c.provider_calls) > limit:
            raise fail(
                invocations_bounded_by_policy,
                f"contender {c.name} invoked {len(c.provider_calls)} times; policy allows {limit}",
            )
        if not c.finished or not c.provider_calls:
            continue
        outcome = c.outcome
        if isinstance(outcome, ActionInProgressError | IdempotencyConflictError) or (
            isinstance(outcome, ActionResult) and outcome.replayed
        ):
            raise fail(
                invocations_bounded_by_policy,
                f"contender {c.name} invoked the provider yet ended as "
                f"{type(outcome).__name__ if not isinstance(outcome, ActionResult) else 'a replay'}",
            )


@safety
def confirmed_requires_the_effect(m: RunnerMachineBase) -> None:
    """A receipt states CONFIRMED only when the world holds the effect for its provider reference."""
    for receipt in m.observed.values():
        if receipt.final_status is ActionStatus.CONFIRMED:
            ref = receipt.provider_reference or ""
            if "CONFIRMED" not in permitted_outcomes(
                effect_exists=m.world.holds(ref), may_appear_later=m.world.may_appear_later(ref)
            ):
                raise fail(
                    confirmed_requires_the_effect,
                    f"receipt {receipt.action_id[:8]} for {receipt.idempotency_key} is CONFIRMED "
                    f"but the world holds no effect for {ref}",
                )


@safety
def unknown_evidence_never_erased(m: RunnerMachineBase) -> None:
    """Once an invocation ended ambiguously, the claim becomes FAILED only through fenced, retry-safe read-back made after it."""
    for receipt in m.observed.values():
        if receipt.final_status is not ActionStatus.FAILED:
            continue
        ref = receipt.provider_reference
        last_ambiguous = None
        for index, event in enumerate(m.history.events):
            facts = event.facts
            if facts.get("reference") != ref:
                continue
            if "fault" in facts and facts["fault"] not in (
                ProviderFault.DECLINE.name,
                ProviderFault.REJECT_RETRYABLE.name,
                "FENCED",  # the provider refused it: nothing can have happened
            ):
                last_ambiguous = index
        if last_ambiguous is None:
            continue
        cleared = any(
            e.facts.get("reference") == ref and e.facts.get("label") == "absent retry-safe"
            for e in m.history.events[last_ambiguous + 1 :]
        )
        if not cleared:
            raise fail(
                unknown_evidence_never_erased,
                f"receipt {receipt.action_id[:8]} for {receipt.idempotency_key} is FAILED, but "
                f"invocation at history line {last_ambiguous + 1} ended ambiguously and no "
                "retry-safe read-back came after it",
            )


@safety
def failed_requires_no_effect_now_or_later(m: RunnerMachineBase) -> None:
    """A receipt states FAILED only when the effect does not exist and cannot appear later."""
    for receipt in m.observed.values():
        if receipt.final_status is ActionStatus.FAILED:
            ref = receipt.provider_reference or ""
            if "FAILED" not in permitted_outcomes(
                effect_exists=m.world.holds(ref), may_appear_later=m.world.may_appear_later(ref)
            ):
                raise fail(
                    failed_requires_no_effect_now_or_later,
                    f"receipt {receipt.action_id[:8]} for {receipt.idempotency_key} is FAILED but "
                    f"{ref} has {m.world.count(ref)} effects"
                    + (" and a request in flight" if m.world.may_appear_later(ref) else ""),
                )


@safety
def claims_never_stolen(m: RunnerMachineBase) -> None:
    """A claim is released only before its attempt started, and a released claim's owner never invokes."""
    for c in m.contenders_list:
        if c.kind == "release" and c.finished and c.outcome is None and c.action_id:
            owners = [
                o for o in m.contenders_list if o.action_id == c.action_id and o.kind == "execute"
            ]
            for owner in owners:
                if owner.provider_calls:
                    raise fail(
                        claims_never_stolen,
                        f"contender {c.name} released claim {c.action_id[:8]} although "
                        f"contender {owner.name} had invoked the provider for it",
                    )
            # Reported by the machine in the step that finished the release.
            assert c.released_attempts is not None, f"release {c.name} was never reported"
            if c.released_attempts:
                raise fail(
                    claims_never_stolen,
                    f"contender {c.name} released claim {c.action_id[:8]} which had "
                    f"{c.released_attempts} attempts",
                )
        for action_id, attempts in c.releases:
            if attempts:
                raise fail(
                    claims_never_stolen,
                    f"contender {c.name} ({c.kind}) released claim {action_id[:8]} which had "
                    f"{attempts} attempts",
                )


@safety
def only_the_claimer_invokes(m: RunnerMachineBase) -> None:
    """Only the caller that made a claim, or took it over once its lease ran out, invokes the operation for it: a waiter or a duplicate never takes a live claim."""
    invokers: dict[str, str] = {}
    for c in m.contenders_list:
        if c.kind != "execute" or not c.provider_calls or c.action_id is None:
            continue
        if c.action_id in c.took_over:
            # A taker invokes only as the claim's new owner; whether it was
            # allowed to is no-second-mutation-of-a-claim-by-anyone's question.
            continue
        first = invokers.setdefault(c.action_id, c.name)
        if first != c.name:
            raise fail(
                only_the_claimer_invokes,
                f"contender {c.name} invoked the provider for claim {c.action_id[:8]} of "
                f"{c.key}, which contender {first} holds and invoked for",
            )


@safety
def claims_leave_holders_only_by_operator_verbs(m: RunnerMachineBase) -> None:
    """A caller of execute changes only the PENDING claims it made or took over: another's live claim moves only by an operator's release, reconcile or recovery, never because a waiter or a duplicate decided."""
    holders = {a: c.name for c in m.contenders_list for a in c.claims}
    for c in m.contenders_list:
        if c.kind != "execute":
            continue
        for method, action_id in c.pending_writes:
            # A takeover is judged by takeovers-only-after-expiry.
            if action_id not in c.claims and method != "take_over":
                raise fail(
                    claims_leave_holders_only_by_operator_verbs,
                    f"contender {c.name} ({method}) changed PENDING claim {action_id[:8]} of "
                    f"{c.key}, which contender {holders.get(action_id, '?')} holds",
                )


def _had_verifier(m: RunnerMachineBase, receipt: ActionReceipt) -> bool:
    """Whether the call that made this claim configured a verifier."""
    for c in m.contenders_list:
        if c.kind == "execute" and c.action_id == receipt.action_id and c.provider_calls:
            return bool(c.with_verifier)
    # Its caller crashed before it learnt the id: a verifier, if configured,
    # left an observation of its own for every attempt that finished.
    return any(o.source is ObservationSource.EXECUTE for o in receipt.observations)


def _reported(o: VerificationObservation, receipt: ActionReceipt) -> Evidence | None:
    if o.claimed is None:
        return None  # the verifier raised or answered with something else
    return Evidence(
        claim=o.claimed.value,
        healthy=o.health is VerificationHealth.HEALTHY,
        conclusive=o.conclusive_absence is True,
        retry_safe=o.retry_safe is True,
        bound=receipt.provider_reference is not None
        and o.verified_provider_reference == receipt.provider_reference,
    )


def _proved_by_execution(status: ActionStatus | None, verifier: bool) -> Outcome | None:
    # The receipt records the runner's reading of each invocation; re-read it
    # by the specification: a normal return proves the effect only without a
    # verifier; with one it proves only that execution finished.
    if status is ActionStatus.CONFIRMED:
        return "UNKNOWN" if verifier else "CONFIRMED"
    return None if status is None else status.value


def evidence_objection(receipt: ActionReceipt, verifier: bool) -> str | None:
    """Why a completed receipt's status is not one its recorded evidence permits (None if it is).

    ``verifier`` says whether the call that made the claim configured one: a
    normal return is then no proof of the effect.
    """
    if receipt.claim_state is not ClaimState.COMPLETED or receipt.final_status is None:
        return None
    executions = [
        _proved_by_execution(a.execution_status, verifier) for a in receipt.attempt_records
    ]
    observations = [(o.attempt, _reported(o, receipt)) for o in receipt.observations]
    allowed = evidence_permits(executions, observations)
    if receipt.final_status.value in allowed:
        return None
    return (
        f"receipt {receipt.action_id[:8]} for {receipt.idempotency_key} says "
        f"{receipt.final_status.value}, but its evidence permits only {sorted(allowed)}: "
        f"attempts {executions} ({'with' if verifier else 'no'} verifier), "
        f"observations {[(n, e.claim if e else None) for n, e in observations]}"
    )


@safety
def status_permitted_by_recorded_evidence(m: RunnerMachineBase) -> None:
    """Every completed receipt states a status its own recorded attempts and verifier observations permit, judged by the specification's evidence rules (the right answer for the right reason)."""
    for receipt in m.observed.values():
        objection = evidence_objection(receipt, _had_verifier(m, receipt))
        if objection is not None:
            raise fail(status_permitted_by_recorded_evidence, objection)


_ALLOWED_FINAL = {
    (None, None),
    (None, ActionStatus.CONFIRMED),
    (None, ActionStatus.FAILED),
    (None, ActionStatus.UNKNOWN),
    (ActionStatus.UNKNOWN, ActionStatus.CONFIRMED),
    (ActionStatus.UNKNOWN, ActionStatus.FAILED),
    # a later observation contradicting a settled one makes it UNKNOWN
    (ActionStatus.CONFIRMED, ActionStatus.UNKNOWN),
    (ActionStatus.FAILED, ActionStatus.UNKNOWN),
}


@safety
def receipts_never_lost_and_only_move_forward(m: RunnerMachineBase) -> None:
    """Receipts are never lost, versions only grow, and statuses move only along allowed transitions."""
    for action_id, (before, after) in m.transitions.items():
        if after is None:
            if action_id not in m.released_ids:
                raise fail(
                    receipts_never_lost_and_only_move_forward,
                    f"receipt {action_id[:8]} ({before.idempotency_key}) disappeared",
                )
            continue
        if after.version < before.version or after.attempts < before.attempts:
            raise fail(
                receipts_never_lost_and_only_move_forward,
                f"receipt {action_id[:8]} went back from version {before.version} to {after.version}",
            )
        if not before.is_pending and after.is_pending:
            raise fail(
                receipts_never_lost_and_only_move_forward,
                f"receipt {action_id[:8]} was reopened from COMPLETED to PENDING",
            )
        if before.final_status != after.final_status and (
            (before.final_status, after.final_status) not in _ALLOWED_FINAL
        ):
            raise fail(
                receipts_never_lost_and_only_move_forward,
                f"receipt {action_id[:8]} moved from {before.final_status} to {after.final_status}",
            )


@safety
def returned_receipts_are_durable(m: RunnerMachineBase) -> None:
    """Every receipt a caller got back in an ActionResult is stored: the ledger holds it or a later version."""
    for c in m.contenders_list:
        result = c.outcome
        if not c.finished or not isinstance(result, ActionResult):
            continue
        returned = result.receipt
        stored = m.observed.get(returned.action_id)
        if stored is None and returned.action_id in m.released_ids:
            continue  # pruned by retention since (released ids: legitimately gone)
        if stored is None or stored.version < returned.version:
            raise fail(
                returned_receipts_are_durable,
                f"contender {c.name} got receipt {returned.action_id[:8]} version "
                f"{returned.version} ({_status_name(returned)}), but the ledger holds "
                f"{'nothing' if stored is None else f'version {stored.version} ({_status_name(stored)})'}",
            )
        if stored.version == returned.version and stored != returned:
            raise fail(
                returned_receipts_are_durable,
                f"contender {c.name} got receipt {returned.action_id[:8]} version "
                f"{returned.version}, which differs from the stored version {stored.version}",
            )


@safety
def persistence_errors_tell_what_ran(m: RunnerMachineBase) -> None:
    """An ActionPersistenceError says operation_invoked exactly when the call invoked the operation, with the evidence it observed."""
    for c in m.contenders_list:
        error = c.outcome
        if c.kind != "execute" or not c.finished or not isinstance(error, ActionPersistenceError):
            continue
        invoked = bool(c.provider_calls)
        if error.operation_invoked is not invoked:
            raise fail(
                persistence_errors_tell_what_ran,
                f"contender {c.name} made {len(c.provider_calls)} provider call(s), but its "
                f"ActionPersistenceError says operation_invoked={error.operation_invoked}",
            )
        kind = OutcomeNotRecordedError if error.operation_invoked else NothingInvokedError
        if type(error) is not kind and type(error) is not ClaimFencedError:
            raise fail(
                persistence_errors_tell_what_ran,
                f"contender {c.name}'s {type(error).__name__} says operation_invoked="
                f"{error.operation_invoked}; its class must be {kind.__name__}",
            )
        if invoked and error.observed_status is None:
            raise fail(
                persistence_errors_tell_what_ran,
                f"contender {c.name} invoked the operation, but its ActionPersistenceError "
                "carries no observed_status",
            )


@safety
def sync_operations_run_off_the_loop(m: RunnerMachineBase) -> None:
    """A sync operation is never called on the event loop's thread, where it would block every task."""
    for c in m.contenders_list:
        if c.ran_on_loop:
            raise fail(
                sync_operations_run_off_the_loop,
                f"contender {c.name}'s sync operation was called on the event loop's thread",
            )


@safety
def lock_waits_are_bounded(m: RunnerMachineBase) -> None:
    """A write that meets a process stuck holding SQLite's writer lock gives up within busy_timeout instead of waiting on."""
    for c in m.contenders_list:
        for method, seconds in c.lock_waits:
            if seconds > LOCK_WAIT_LIMIT:
                raise fail(
                    lock_waits_are_bounded,
                    f"contender {c.name}'s {method} waited {seconds:.2f} s on a stuck writer "
                    f"lock (its busy_timeout is far shorter)",
                )


def _status_name(receipt: ActionReceipt) -> str:
    status = receipt.final_status
    return f"{receipt.claim_state.value}/{'-' if status is None else status.value}"


@safety
def value_unreadable_unless_confirmed_and_correlated(m: RunnerMachineBase) -> None:
    """ActionResult.value is never readable for FAILED, UNKNOWN or replayed results."""
    for c in m.contenders_list:
        result = c.outcome
        if not c.finished or not isinstance(result, ActionResult):
            continue
        if result.status is not ActionStatus.CONFIRMED or result.replayed:
            expected = (
                UnresolvedActionError
                if result.status is not ActionStatus.CONFIRMED
                else ResultValueUnavailableError
            )
            try:
                value = result.value
            except expected:
                continue
            raise fail(
                value_unreadable_unless_confirmed_and_correlated,
                f"contender {c.name}: {result.status.value} result (replayed={result.replayed}) "
                f"exposed value {value!r}",
            )


# -- progress ----------------------------------------------------------------------------


def _clean_ledger(c: Any) -> bool:
    return all(fault is LedgerFault.NONE for _, fault in c.ledger_faults)


@progress
def holders_fail_only_by_own_faults_or_operators(m: RunnerMachineBase) -> None:
    """A call that made a claim ends in a persistence error only after a ledger fault at its own gates, or after an operator acted on that claim."""
    operated = {o.action_id for o in m.contenders_list if o.kind != "execute" and o.action_id}
    for c in m.contenders_list:
        # A claim taken over from its holder is that holder's loss, not a fault
        # of the runner; the taker holds it from then on, and a fenced worker's
        # evidence merged under it must not cost it its outcome (V1).
        taken_from_c = {
            a
            for o in m.contenders_list
            if o is not c
            for a in o.took_over
            if o.tokens.get(a, 0) > c.tokens.get(a, 0)
        }
        if (
            c.kind == "execute"
            and c.finished
            and not c.crashed
            and c.claims
            and isinstance(c.outcome, ActionPersistenceError)
            and _clean_ledger(c)
            and not c.claims & (operated | taken_from_c)
        ):
            raise fail(
                holders_fail_only_by_own_faults_or_operators,
                f"contender {c.name} held claim {min(c.claims)[:8]} of {c.key}, met no ledger "
                f"fault and no operator touched its claim, yet raised "
                f"{type(c.outcome).__name__}: {c.outcome}",
            )


@progress
def clean_success_is_confirmed(m: RunnerMachineBase) -> None:
    """A first execution with no fault anywhere and truthful read-back ends CONFIRMED."""
    for c in m.contenders_list:
        result = c.outcome
        if (
            c.kind == "execute"
            and c.finished
            and isinstance(result, ActionResult)
            and not result.replayed
            and c.provider_calls == [ProviderFault.NONE]
            and _clean_ledger(c)
            and all(answer.name == "TRUTHFUL" for answer, _ in c.verifier_answers)
            and result.status is not ActionStatus.CONFIRMED
        ):
            raise fail(
                clean_success_is_confirmed,
                f"contender {c.name}: a clean success for {c.key} ended {result.status.value}",
            )


def _made_the_claim(c: Any) -> bool:
    """Whether the contender's action id is its own claim (not one it was refused by)."""
    outcome = c.outcome
    if isinstance(outcome, ActionInProgressError | IdempotencyConflictError):
        return False
    return not (isinstance(outcome, ActionResult) and outcome.replayed)


@progress
def equal_requests_never_conflict(m: RunnerMachineBase) -> None:
    """A duplicate whose request and reference equal the claim's is a replay or in progress, never a conflict, however the request is written."""
    for c in m.contenders_list:
        if not c.finished or not isinstance(c.outcome, IdempotencyConflictError):
            continue
        holder_id = c.outcome.receipt.action_id if c.outcome.receipt is not None else None
        for other in m.contenders_list:
            if (
                other.kind == "execute"
                and other.action_id == holder_id
                and _made_the_claim(other)
                and other.amount == c.amount
                and other.reference == c.reference
            ):
                raise fail(
                    equal_requests_never_conflict,
                    f"contender {c.name} got a conflict for {c.key} although contender "
                    f"{other.name}'s claim is for the same request (amount {c.amount}, "
                    f"reference {c.reference})",
                )


@progress
def retryable_failure_is_retried(m: RunnerMachineBase) -> None:
    """A definitive retryable failure is retried when the policy allows it and attempts remain (counted on the claim: a taker's follow those of the worker it took over from)."""
    for c in m.contenders_list:
        result = c.outcome
        if not (
            c.kind == "execute"
            and c.finished
            and isinstance(result, ActionResult)
            and not result.replayed
            and c.provider_calls
            and all(f is ProviderFault.REJECT_RETRYABLE for f in c.provider_calls)
            and c.policy.retry_on_failed
            and _clean_ledger(c)
        ):
            continue
        # The policy counts the claim's attempts, not this caller's calls. A
        # taker's claim also holds its predecessor's attempt and whatever a
        # fenced zombie merged: evidence that may forbid the retry, and then
        # the claim is not FAILED (a success makes it CONFIRMED, an ambiguous
        # request UNKNOWN: neither is erased).
        attempts = result.receipt.attempts if c.took_over else len(c.provider_calls)
        if attempts >= c.policy.max_attempts:
            continue
        if c.took_over and result.status is not ActionStatus.FAILED:
            continue
        raise fail(
            retryable_failure_is_retried,
            f"contender {c.name} stopped after {len(c.provider_calls)} retryable failures "
            f"({attempts} attempts on its claim); the policy allows {c.policy.max_attempts}",
        )


def _settled_by(m: RunnerMachineBase, label: str, expected: ActionStatus, fn: Any) -> None:
    for c in m.contenders_list:
        result = c.outcome
        if (
            c.kind in ("reconcile", "recover")
            and c.finished
            and isinstance(result, ActionResult)
            and [lbl for _, lbl in c.verifier_answers] == [label]
            and _clean_ledger(c)
            and not result.receipt.metadata.get("verification_conflict", False)
            and result.status is not expected
        ):
            raise fail(
                fn,
                f"contender {c.name}: a {label!r} read-back left {c.key} {result.status.value}",
            )


@progress
def bound_confirmation_settles_unknown(m: RunnerMachineBase) -> None:
    """A healthy confirmation bound to the reference settles an UNKNOWN claim as CONFIRMED."""
    _settled_by(m, "confirmed", ActionStatus.CONFIRMED, bound_confirmation_settles_unknown)


@progress
def fenced_absence_settles_failed(m: RunnerMachineBase) -> None:
    """A healthy, conclusive, retry-safe absence bound to the reference settles it as FAILED."""
    _settled_by(m, "absent retry-safe", ActionStatus.FAILED, fenced_absence_settles_failed)
