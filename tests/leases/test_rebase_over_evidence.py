"""The rule ``rebased_over_evidence``: a holder's write rebuilt over a zombie's merged evidence.

``test_owner_outcome_after_zombie.py`` shows it end to end on every ledger;
these pin its parts. The holder wrote ``final`` over ``durable``; the ledger
refused it because a fenced worker merged evidence into the claim, which is
now ``stored``. The write is rebuilt over ``stored`` only when nothing but
that evidence changed, with the evidence folded in once, at the version
after ``stored``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest

from dataoad import (
    ActionReceipt,
    ActionRunner,
    ActionStatus,
    ClaimState,
    DefinitiveFailure,
    InMemoryLedger,
    ObservationSource,
    RetryPolicy,
)
from dataoad._receipt import AttemptRecord
from dataoad._records import VerificationObservation
from dataoad._settled import rebased_over_evidence, start_rebased_over_evidence, zombie_merged
from dataoad.testing import ManualClock
from suite_support import CountingOperation

CONFIRMED, FAILED, UNKNOWN = ActionStatus.CONFIRMED, ActionStatus.FAILED, ActionStatus.UNKNOWN
CLOCK = ManualClock()


def claim() -> ActionReceipt:
    """A claim held by A with two attempts: a retryable failure, then one still running."""
    now = CLOCK()
    first = AttemptRecord(
        number=1,
        started_at=now,
        execution_status=FAILED,
        retry_decision="retry",
        finished_at=now,
    )
    running = AttemptRecord(number=2, started_at=now + timedelta(seconds=1))
    return ActionReceipt(
        action_id="a-1",
        action_name="charge",
        idempotency_key="k",
        request_hash="0" * 64,
        provider_reference="order-1",
        risk=None,
        claim_state=ClaimState.PENDING,
        attempts=2,
        execution_status=None,
        verification_status=None,
        final_status=None,
        provider_request_id=None,
        error=None,
        metadata={"team": "payments"},
        attempt_records=(first, running),
        version=3,
        created_at=now,
        updated_at=now,
        owner="A",
        fencing_token=2,
    )


def answer(status: ActionStatus, attempt: int = 2, seconds: int = 5) -> VerificationObservation:
    return VerificationObservation(
        source=ObservationSource.EXECUTE,
        attempt=attempt,
        status=status,
        observed_at=CLOCK() + timedelta(seconds=seconds),
        claimed=status,
        verified_provider_reference="order-1",
    )


def the_zombie_saw(
    receipt: ActionReceipt,
    status: ActionStatus | None = CONFIRMED,
    observation: VerificationObservation | None = None,
    **facts: Any,
) -> ActionReceipt:
    """``receipt`` after a fenced worker merged what it saw of attempt 2 (a new version)."""
    record = dataclasses.replace(receipt.attempt_records[1], execution_status=status, **facts)
    merged = zombie_merged(receipt, record, observation)
    assert merged is not None
    return merged


def holders_write(durable: ActionReceipt) -> ActionReceipt:
    """The holder's next write over ``durable``: its third attempt started."""
    third = AttemptRecord(number=3, started_at=CLOCK() + timedelta(seconds=9))
    return durable.evolve(
        attempts=3,
        attempt_records=(*durable.attempt_records, third),
        version=durable.version + 1,
        updated_at=third.started_at,
    )


def test_a_zombies_attempt_is_folded_in_at_the_version_after_what_is_stored() -> None:
    durable = claim()
    stored = the_zombie_saw(durable, CONFIRMED, provider_request_id="ch_A")
    final = holders_write(durable)
    rebased = rebased_over_evidence(final, durable, stored)
    assert rebased is not None
    assert rebased.version == stored.version + 1
    assert rebased.attempt_records[1].execution_status is CONFIRMED
    assert rebased.attempt_records[1].provider_request_id == "ch_A"
    # The holder's own write is all there: its attempt, its claim, its metadata.
    assert rebased.attempt_records[2] == final.attempt_records[2]
    assert (rebased.attempts, rebased.owner, rebased.fencing_token) == (3, "A", 2)
    assert rebased.is_pending
    assert rebased.metadata["team"] == "payments"


def test_the_version_follows_what_is_stored_not_how_many_facts_were_folded() -> None:
    durable = claim()
    # Two merges of the same attempt (its outcome, then its request id):
    # stored is two versions ahead, and one record differs.
    stored = the_zombie_saw(the_zombie_saw(durable, CONFIRMED), CONFIRMED, provider_request_id="x")
    assert stored.version == durable.version + 2
    rebased = rebased_over_evidence(holders_write(durable), durable, stored)
    assert rebased is not None
    assert rebased.version == stored.version + 1
    assert rebased.attempt_records[1].provider_request_id == "x"


def test_a_zombies_observation_is_folded_in_once() -> None:
    durable = claim()
    seen = answer(CONFIRMED)
    # The zombie's verifier answered; the attempt record itself is unchanged.
    stored = the_zombie_saw(durable, None, seen)
    assert stored.attempt_records == durable.attempt_records
    rebased = rebased_over_evidence(holders_write(durable), durable, stored)
    assert rebased is not None
    assert [dataclasses.replace(o, number=None) for o in rebased.observations] == [seen]
    assert rebased.metadata["verification_observation_count"] == 1
    assert rebased.version == stored.version + 1


def test_a_zombies_attempt_and_observation_are_both_folded_in() -> None:
    durable = claim()
    seen = answer(CONFIRMED)
    stored = the_zombie_saw(durable, CONFIRMED, seen)
    rebased = rebased_over_evidence(holders_write(durable), durable, stored)
    assert rebased is not None
    assert rebased.attempt_records[1].execution_status is CONFIRMED
    assert [dataclasses.replace(o, number=None) for o in rebased.observations] == [seen]
    assert rebased.version == stored.version + 1


REFUSED: dict[str, Callable[[ActionReceipt, ActionReceipt], ActionReceipt]] = {
    "not a later version": lambda durable, stored: stored.evolve(version=durable.version),
    "an older version": lambda durable, stored: stored.evolve(version=durable.version - 1),
    "another holder": lambda durable, stored: stored.evolve(owner="B"),
    "another fence": lambda durable, stored: stored.evolve(fencing_token=3),
    "another attempt count": lambda durable, stored: stored.evolve(attempts=3),
    "an attempt record more": lambda durable, stored: stored.evolve(
        attempt_records=(*stored.attempt_records, AttemptRecord(number=3, started_at=CLOCK()))
    ),
    "an attempt record less": lambda durable, stored: stored.evolve(
        attempt_records=stored.attempt_records[:1]
    ),
    "completed": lambda durable, stored: stored.evolve(
        claim_state=ClaimState.COMPLETED, final_status=CONFIRMED
    ),
    "retired": lambda durable, stored: stored.evolve(retired_at=CLOCK()),
    "the caller's metadata": lambda durable, stored: stored.evolve(
        metadata={**stored.metadata, "team": "refunds"}
    ),
    "another request id on the claim": lambda durable, stored: stored.evolve(
        provider_request_id="ch_other"
    ),
}


@pytest.mark.parametrize("change", list(REFUSED), ids=list(REFUSED))
def test_anything_but_evidence_changed_refuses_the_rebase(change: str) -> None:
    durable = claim()
    stored = REFUSED[change](durable, the_zombie_saw(durable, CONFIRMED, answer(CONFIRMED)))
    assert rebased_over_evidence(holders_write(durable), durable, stored) is None


def test_the_same_receipt_again_is_no_evidence_to_rebase_over() -> None:
    durable = claim()
    assert rebased_over_evidence(holders_write(durable), durable, durable) is None


def test_a_later_version_alone_rebases_the_holders_write_stamped_anew() -> None:
    durable = claim()
    stored = durable.evolve(version=durable.version + 1)
    final = holders_write(durable)
    rebased = rebased_over_evidence(final, durable, stored)
    assert rebased is not None
    assert rebased.version == stored.version + 1
    assert rebased.attempt_records == final.attempt_records
    assert rebased.updated_at != final.updated_at


def verified_absent(durable: ActionReceipt) -> ActionReceipt:
    """``durable`` after the holder's verifier proved attempt 2 absent, retry-safe."""
    records = list(durable.attempt_records)
    records[1] = dataclasses.replace(
        records[1], execution_status=UNKNOWN, verification_status=FAILED, finished_at=CLOCK()
    )
    return durable.evolve(attempt_records=tuple(records))


@pytest.mark.parametrize(
    ("zombie_saw", "may_start"),
    [(FAILED, True), (UNKNOWN, True), (CONFIRMED, False)],
    ids=["a decline", "a lost answer", "a success"],
)
def test_a_retry_starts_over_a_zombies_evidence_only_while_it_still_allows_one(
    zombie_saw: ActionStatus, may_start: bool
) -> None:
    durable = verified_absent(claim())
    # What the zombie saw comes with its words (a lost answer changes nothing else).
    stored = the_zombie_saw(durable, zombie_saw, error="what the zombie saw")
    start = holders_write(durable)
    rebased = start_rebased_over_evidence(start, durable, stored)
    if may_start:
        outcome = rebased_over_evidence(start, durable, stored)
        assert rebased is not None
        assert outcome is not None
        assert rebased.evolve(updated_at=outcome.updated_at) == outcome
        assert rebased.attempts == 3
    else:
        # The earlier attempts no longer all prove FAILED: no new attempt over them.
        assert rebased is None
        assert rebased_over_evidence(start, durable, stored) is not None  # an outcome still folds


def test_a_start_is_never_rebased_where_an_outcome_would_not_be() -> None:
    durable = verified_absent(claim())
    stored = the_zombie_saw(durable, FAILED).evolve(owner="B")
    assert start_rebased_over_evidence(holders_write(durable), durable, stored) is None


# -- through the proven write: a write that fails while evidence lands -----------


class EvidenceLandsThenFails(InMemoryLedger):
    """On the first ``verb`` write: a fenced worker's evidence about attempt 1 lands, then
    the write's connection drops (nothing of it stored)."""

    def __init__(self, verb: str) -> None:
        super().__init__()
        self.verb = verb
        self.struck = False

    async def _strike(self, receipt: ActionReceipt) -> None:
        if self.struck:
            return
        self.struck = True
        stored = await self.get(receipt.action_id)
        assert stored is not None
        first = dataclasses.replace(stored.attempt_records[0], provider_request_id="ch_zombie")
        merged = zombie_merged(stored, first, None)
        assert merged is not None
        assert await super().record(merged)
        raise ConnectionError("connection reset")

    async def start_attempt(self, receipt: ActionReceipt, **options: Any) -> bool:
        if self.verb == "start_attempt":
            await self._strike(receipt)
        return await super().start_attempt(receipt, **options)

    async def record(self, receipt: ActionReceipt) -> bool:
        if self.verb == "record" and receipt.claim_state is ClaimState.COMPLETED:
            await self._strike(receipt)
        return await super().record(receipt)


@pytest.mark.parametrize("verb", ["start_attempt", "record"])
async def test_a_write_that_fails_while_evidence_lands_is_rebuilt_over_it(verb: str) -> None:
    ledger = EvidenceLandsThenFails(verb)
    op = CountingOperation(DefinitiveFailure("busy", retryable=True), "ch_2")

    result = await ActionRunner(
        ledger, policy=RetryPolicy(max_attempts=2, retry_on_failed=True)
    ).execute("charge", op, request={}, idempotency_key="k")
    assert ledger.struck
    assert result.status is CONFIRMED
    assert result.receipt.attempts == 2  # each attempt ran once
    stored = await ledger.get(result.receipt.action_id)
    assert stored == result.receipt
    assert stored.attempt_records[0].provider_request_id == "ch_zombie"  # folded in


def test_an_observation_the_holders_write_dropped_is_not_brought_back(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Observations are kept bounded: each write drops the oldest that prove nothing more.

    Attempt 1's confirmation naming ``ch_1`` is still needed in ``stored``
    (nothing else there names ``ch_1``), but the holder's own write dropped
    it, as its own confirmation names ``ch_1`` too. Only what the zombie
    added since ``durable`` is folded in: what ``durable`` already held is
    the holder's to keep or drop, and is not brought back (which would also
    renumber the zombie's answer).
    """
    from dataoad._observing import caller_metadata, protocol_metadata, with_observation

    monkeypatch.setattr("dataoad._evidence.MAX_KEPT_OBSERVATIONS", 2)

    def observed(receipt: ActionReceipt, *seen: VerificationObservation) -> ActionReceipt:
        observations = receipt.observations
        for observation in seen:
            observations = with_observation(receipt.attempt_records, observations, observation)
        metadata = protocol_metadata(caller_metadata(receipt), observations, None)
        return receipt.evolve(metadata=metadata)

    first = dataclasses.replace(answer(CONFIRMED, attempt=1, seconds=1), provider_request_id="ch_1")
    durable = observed(claim(), first, answer(UNKNOWN, seconds=2))
    own = dataclasses.replace(answer(CONFIRMED, seconds=6), provider_request_id="ch_1")
    final = observed(holders_write(durable), own)
    assert [o.attempt for o in final.observations] == [2, 2]  # attempt 1's answer dropped
    zombies = answer(UNKNOWN, seconds=7)
    stored = the_zombie_saw(durable, None, zombies)
    assert first in [dataclasses.replace(o, number=None) for o in stored.observations]
    rebased = rebased_over_evidence(final, durable, stored)
    assert rebased is not None
    kept = rebased.observations
    assert [dataclasses.replace(o, number=None) for o in kept] == [own, zombies]
    assert [o.number for o in kept] == [3, 4]
