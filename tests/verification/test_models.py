"""Unit tests of the reference model: it must itself say what the specification says."""

from __future__ import annotations

from typing import Any

import pytest

from models import AbstractLedger, Evidence, ModelReceipt, World
from models.protocol import (
    aggregate,
    classify_execution,
    classify_verification,
    merge,
    permitted_outcomes,
    retry_allowed,
)


def test_execution_classification() -> None:
    assert classify_execution("definitive", has_verifier=False) == "FAILED"
    assert classify_execution("raised", has_verifier=False) == "UNKNOWN"
    assert classify_execution("returned", has_verifier=False) == "CONFIRMED"
    assert classify_execution("returned", has_verifier=True) == "UNKNOWN"


@pytest.mark.parametrize(
    ("evidence", "expected"),
    [
        (None, "UNKNOWN"),
        (Evidence("CONFIRMED"), "CONFIRMED"),
        (Evidence("CONFIRMED", bound=False), "UNKNOWN"),
        (Evidence("CONFIRMED", healthy=False), "UNKNOWN"),
        (Evidence("FAILED"), "UNKNOWN"),
        (Evidence("FAILED", retry_safe=True), "FAILED"),
        (Evidence("FAILED", retry_safe=True, conclusive=False), "UNKNOWN"),
        (Evidence("FAILED", retry_safe=True, healthy=False), "UNKNOWN"),
        (Evidence("FAILED", retry_safe=True, bound=False), "UNKNOWN"),
        (Evidence("UNKNOWN"), "UNKNOWN"),
    ],
)
def test_verification_classification(evidence: Evidence | None, expected: str) -> None:
    assert classify_verification(evidence) == expected


def test_aggregation_never_erases_unknown() -> None:
    assert aggregate([]) is None
    assert aggregate(["UNKNOWN", "FAILED"]) == "UNKNOWN"
    assert aggregate(["FAILED", "FAILED"]) == "FAILED"
    assert aggregate(["UNKNOWN", "CONFIRMED"]) == "CONFIRMED"


def test_merge_is_order_independent_and_flags_contradictions() -> None:
    assert merge(["CONFIRMED", "FAILED"]) == ("UNKNOWN", True)
    assert merge(["FAILED", "CONFIRMED"]) == ("UNKNOWN", True)
    assert merge(["UNKNOWN", "CONFIRMED"]) == ("CONFIRMED", False)
    assert merge([]) == (None, False)


def test_retry_rule() -> None:
    base: dict[str, Any] = {"max_attempts": 3, "retry_on_failed": True, "retry_on_unknown": False}
    assert retry_allowed("FAILED", attempts=1, retryable=True, **base)
    assert not retry_allowed("FAILED", attempts=1, retryable=False, **base)
    assert not retry_allowed("FAILED", attempts=3, retryable=True, **base)
    assert not retry_allowed("UNKNOWN", attempts=1, retryable=True, **base)
    assert not retry_allowed("CONFIRMED", attempts=1, retryable=True, **base)


def test_permitted_outcomes_follow_the_world() -> None:
    assert permitted_outcomes(effect_exists=True, may_appear_later=False) == {
        "CONFIRMED",
        "UNKNOWN",
    }
    assert permitted_outcomes(effect_exists=False, may_appear_later=False) == {"FAILED", "UNKNOWN"}
    assert permitted_outcomes(effect_exists=False, may_appear_later=True) == {"UNKNOWN"}


def test_world_fences_attempts_in_flight_and_unsent() -> None:
    world = World()
    assert world.send_in_flight("r", 1)
    assert world.may_appear_later("r")
    assert world.fence("r", 1) == 1
    assert not world.may_appear_later("r")
    assert world.commit("r", 1) is None, "a fenced attempt committed"
    assert world.commit("r", 2) is not None, "a later attempt was refused"
    assert world.count("r") == 1
    world.send_in_flight("s", 1)
    assert world.commit_in_flight("s") == 1
    assert world.holds("s")


def test_abstract_ledger_transitions() -> None:
    ledger = AbstractLedger()
    claim = ModelReceipt("a1", "charge", "k", "h", pending=True, attempts=0, version=1)
    assert ledger.claim(claim) == (claim, True)
    other = ModelReceipt("a2", "charge", "k", "h", pending=True, attempts=0, version=1)
    assert ledger.claim(other) == (claim, False)
    started = ModelReceipt("a1", "charge", "k", "h", pending=True, attempts=1, version=2)
    assert not ledger.release("a1", 2)
    assert ledger.start_attempt(started)
    assert not ledger.start_attempt(started)
    assert not ledger.release("a1", 2), "released a started claim"
    done = ModelReceipt(
        "a1", "charge", "k", "h", pending=False, attempts=1, version=3, final="UNKNOWN"
    )
    assert ledger.record(done)
    reopened = ModelReceipt("a1", "charge", "k", "h", pending=True, attempts=1, version=4)
    assert not ledger.record(reopened)
    fresh = ModelReceipt("a3", "charge", "j", "h", pending=True, attempts=0, version=1)
    ledger.claim(fresh)
    assert ledger.release("a3", 1)
    assert ledger.find("charge", "j") is None


def test_evidence_permits_decisive_statuses_only_with_their_evidence() -> None:
    from models.protocol import Evidence, evidence_permits

    confirmed = Evidence("CONFIRMED")
    fenced = Evidence("FAILED", retry_safe=True)
    # A return proves the effect only where the caller had no verifier.
    assert evidence_permits(["CONFIRMED"], []) == {"CONFIRMED", "UNKNOWN"}
    assert evidence_permits(["UNKNOWN"], [(1, None)]) == {"UNKNOWN"}
    # A confirmation must be healthy and bound to count.
    assert evidence_permits(["UNKNOWN"], [(1, confirmed)]) == {"CONFIRMED", "UNKNOWN"}
    assert evidence_permits(["UNKNOWN"], [(1, Evidence("CONFIRMED", bound=False))]) == {"UNKNOWN"}
    assert evidence_permits(["UNKNOWN"], [(1, Evidence("CONFIRMED", healthy=False))]) == {"UNKNOWN"}
    # FAILED: every attempt settled, by its own failure or a later fenced absence.
    assert evidence_permits(["FAILED"], []) == {"FAILED", "UNKNOWN"}
    assert evidence_permits(["UNKNOWN", "FAILED"], []) == {"UNKNOWN"}
    assert evidence_permits(["UNKNOWN", "FAILED"], [(2, fenced)]) == {"FAILED", "UNKNOWN"}
    assert evidence_permits(["UNKNOWN", "UNKNOWN"], [(1, fenced)]) == {"UNKNOWN"}
    assert evidence_permits([None], [(1, Evidence("FAILED"))]) == {"UNKNOWN"}
    # Anything confirming rules FAILED out; nothing recorded permits only UNKNOWN.
    assert evidence_permits(["FAILED"], [(1, confirmed)]) == {"CONFIRMED", "UNKNOWN"}
    assert evidence_permits([], []) == {"UNKNOWN"}


def test_the_lease_scenarios_are_clean_and_expire_leases_everywhere() -> None:
    """``python -m models`` lets a lease run out at every point of the lease scenarios."""
    from models.__main__ import run_abstract

    results = run_abstract("default")
    assert all(r.violation is None for r in results)
    lease = [r for r in results if "lease expiry" in r.label]
    assert len(lease) == 3
    assert all(r.states > 100 for r in lease)


def test_the_model_catches_a_takeover_that_reinvokes_a_started_attempt(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Broken on purpose: a taker that runs the operation again is a second mutation."""
    import dataclasses

    import models.abstract as abstract
    from models.__main__ import run_abstract

    def reinvokes(state: Any, plan: Any, existing: Any, ref: str, me: str) -> Any:
        proposed = dataclasses.replace(
            existing, owner=me, token=existing.token + 1, version=existing.version + 1
        )
        yield ("ledger.take_over",)
        if not state.ledger.take_over(proposed, abstract.LEASE):
            return "in progress"
        taken = state.ledger.by_id[existing.action_id]
        return (yield from abstract._attempts(state, plan, taken, ref))

    monkeypatch.setattr(abstract, "_take_over", reinvokes)
    results = run_abstract("default")
    found = [r.violation for r in results if r.violation is not None]
    assert [v.name for v in found] == ["no-second-mutation-after-unknown"]
