"""What recorded facts settle a receipt to, and the value a caller may see.

Pure functions, no ledger: every COMPLETED receipt (an execute's outcome, a
verifier's observation merged in, a takeover's settlement, a fenced worker's
evidence folded into a completed claim) is built by :func:`completed`, its
statuses derived by ``_evidence.settle``; :func:`exposed_value` is the one
rule for which value a caller may see. ``_completing`` and ``_recovery``
write what these build, under the proven-write rule.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

from dataoad._evidence import (
    Settlement,
    aggregate_attempts,
    attempt_evidence,
    recovered_value_correlated,
    settle,
)
from dataoad._observing import Observation, caller_metadata, protocol_metadata, with_observation
from dataoad._receipt import ActionReceipt, AttemptRecord, utc_now
from dataoad._records import ObservationSource, RecoveryRecord, VerificationObservation
from dataoad._status import ActionStatus, ClaimState
from dataoad._verification import MISSING

__all__ = [
    "completed",
    "exposed_value",
    "observation_merged",
    "rebased_over_evidence",
    "start_rebased_over_evidence",
    "zombie_merged",
]


def completed(
    current: ActionReceipt,
    records: Sequence[AttemptRecord],
    observations: Sequence[VerificationObservation],
    base_metadata: Mapping[str, Any],
    error: str | None,
    recovery: RecoveryRecord | None = None,
) -> tuple[ActionReceipt, Settlement]:
    """``current`` COMPLETED at its next version, every status derived from the facts.

    The one place a settled receipt is built: ``base_metadata`` is the
    caller's, the observation keys (and ``recovery``, when given) are
    derived here.
    """
    settlement = settle(records, observations)
    final = current.evolve(
        claim_state=ClaimState.COMPLETED,
        attempt_records=tuple(records),
        execution_status=settlement.execution_status,
        verification_status=settlement.verification_status,
        final_status=settlement.final_status,
        provider_request_id=settlement.provider_request_id,
        error=error,
        metadata=protocol_metadata(base_metadata, observations, settlement, recovery),
        version=current.version + 1,
        updated_at=utc_now(),
    )
    return final, settlement


def exposed_value(settlement: Settlement, own: object, observation: Observation | None) -> object:
    """The value a caller may see: the operation's own (``own``), or a correlated recovered one.

    The operation's own value is tied to the retained provider request id
    only when that id is none or its own attempt's confirmation named it: a
    value from one charge is never shown under another charge's id. A
    verifier's value is shown only when its provider request id is the
    retained one. MISSING when neither may be shown.
    """
    if settlement.final_status is not ActionStatus.CONFIRMED:
        return MISSING
    conflict = settlement.provider_request_id_conflict
    result = None if observation is None else observation.result
    own_id = (
        result.provider_request_id
        if result is not None
        and observation is not None
        and observation.status is ActionStatus.CONFIRMED
        else None
    )
    if own is not MISSING and not conflict and settlement.provider_request_id in (None, own_id):
        return own
    if (
        result is not None
        and result.has_value
        and recovered_value_correlated(
            settlement.final_status,
            conflict,
            result.provider_request_id,
            settlement.provider_request_id,
        )
    ):
        return result.value
    return MISSING


def observation_merged(
    current: ActionReceipt,
    observation_record: VerificationObservation | None,
    source: ObservationSource,
    method: str,
) -> tuple[ActionReceipt, Settlement]:
    """``current`` completed with one more observation (if any) merged in.

    A PENDING claim settled by recovery gains a recovery record naming
    ``method``; a completed one keeps the one it has.
    """
    observations = current.observations
    if observation_record is not None:
        observations = with_observation(current.attempt_records, observations, observation_record)
    recovery = None
    if source is ObservationSource.RECOVER and current.claim_state is ClaimState.PENDING:
        recovery = RecoveryRecord(method, utc_now(), current.attempts)
    return completed(
        current,
        current.attempt_records,
        observations,
        caller_metadata(current),
        current.error,
        recovery,
    )


def zombie_merged(
    current: ActionReceipt,
    finished: AttemptRecord,
    observation: VerificationObservation | None,
) -> ActionReceipt | None:
    """``current`` with a fenced worker's facts about its attempt merged in; None if nothing new."""
    if not 1 <= finished.number <= len(current.attempt_records):
        return None  # attempts are counted before invocation, so this cannot be ours
    records = list(current.attempt_records)
    stored = records[finished.number - 1]
    execution = stored.execution_status
    seen = finished.execution_status
    # What the zombie saw directly outranks "never seen" and "ambiguous"; a
    # success it saw is evidence that the effect happened, whatever else says.
    if seen is not None and (
        execution in (None, ActionStatus.UNKNOWN) or seen is ActionStatus.CONFIRMED
    ):
        execution = seen
    records[finished.number - 1] = dataclasses.replace(
        stored,
        execution_status=execution,
        verification_status=stored.verification_status or finished.verification_status,
        error=stored.error or finished.error,
        provider_request_id=stored.provider_request_id or finished.provider_request_id,
        finished_at=stored.finished_at or finished.finished_at,
    )
    observations = current.observations
    if observation is not None and all(
        dataclasses.replace(o, number=None) != dataclasses.replace(observation, number=None)
        for o in observations
    ):
        observations = with_observation(records, observations, observation)
    if tuple(records) == current.attempt_records and observations == current.observations:
        return None
    # caller_metadata keeps the recovery record: only observation keys are rederived.
    base = caller_metadata(current)
    if current.claim_state is ClaimState.COMPLETED:
        return completed(current, records, observations, base, current.error)[0]
    # Still PENDING: evidence only; its holder's outcome will settle it.
    return current.evolve(
        attempt_records=tuple(records),
        metadata=protocol_metadata(base, observations, None),
        version=current.version + 1,
        updated_at=utc_now(),
    )


def rebased_over_evidence(
    final: ActionReceipt, durable: ActionReceipt, stored: ActionReceipt
) -> ActionReceipt | None:
    """The owner's ``final`` (written over ``durable``) rebuilt over ``stored``.

    Only when ``stored`` is ``durable`` with nothing but a fenced worker's
    evidence merged in (its attempt records and observations, a later
    version): the claim is still the owner's, under the same fence, with
    the same attempts. That evidence is folded into the owner's outcome as
    :func:`zombie_merged` folds it into a stored receipt, the settlement
    re-derived from all of it, at the version after ``stored``. None when
    ``stored`` changed in any other way (the owner's write is then refused
    as before).
    """
    # Everything but the evidence must be ``durable``'s to the letter: the
    # last comparison holds the holder, the fence, the attempts, the claim's
    # state and the retirement to that (equality covers every such field).
    if (
        stored.version <= durable.version
        or len(stored.attempt_records) != len(durable.attempt_records)
        or caller_metadata(stored) != caller_metadata(durable)
        or stored.evolve(
            attempt_records=durable.attempt_records,
            metadata=durable.metadata,
            version=durable.version,
            updated_at=durable.updated_at,
        )
        != durable
    ):
        return None
    rebased = final
    seen = {dataclasses.replace(o, number=None) for o in durable.observations}
    added = [o for o in stored.observations if dataclasses.replace(o, number=None) not in seen]
    for old, new in zip(durable.attempt_records, stored.attempt_records, strict=True):
        if old != new:
            rebased = zombie_merged(rebased, new, None) or rebased
    for observation in added:
        record = stored.attempt_records[min(observation.attempt, len(stored.attempt_records)) - 1]
        rebased = zombie_merged(rebased, record, observation) or rebased
    return rebased.evolve(version=stored.version + 1, updated_at=utc_now())


def start_rebased_over_evidence(
    proposed: ActionReceipt, durable: ActionReceipt, stored: ActionReceipt
) -> ActionReceipt | None:
    """An attempt start rebuilt over a fenced worker's evidence, as ``rebased_over_evidence``.

    None also when that evidence takes away what allowed the retry: once
    the earlier attempts no longer all prove FAILED (the fenced worker saw
    its call succeed, say), the ledger holds evidence that the effect may
    have happened, and no new attempt may start over it. The start is then
    refused, nothing is invoked, and the claim settles read-only.
    """
    rebased = rebased_over_evidence(proposed, durable, stored)
    if rebased is None:
        return None
    earlier = [
        attempt_evidence(r.execution_status, r.verification_status)
        for r in rebased.attempt_records[:-1]
    ]
    if aggregate_attempts(earlier) is not ActionStatus.FAILED:
        return None
    return rebased
