"""The guard every example test runs under holds each injected ledger fault to its scenario."""

from __future__ import annotations

import pytest

from dataoad import InMemoryLedger
from dataoad.testing import FaultyLedger, LedgerFault, LedgerFaultError, unstarted_claim
from suite_support.fault_guard import guarding_injected_faults

LOSE = LedgerFault.LOSE_ACKNOWLEDGEMENT


async def _lose_the_ack_of_a_refused_release(faulty: FaultyLedger) -> None:
    faulty.inject("release", LOSE)
    with pytest.raises(LedgerFaultError, match="acknowledgement lost"):
        await faulty.release("no-such-action", 1)  # nothing to release: refused


@pytest.mark.refused_write_may_lose_its_ack("this test checks the guard that forbids it")
async def test_a_lost_acknowledgement_of_a_refused_write_fails_the_test(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    with (
        pytest.raises(AssertionError, match=r"stored nothing: \['release -> False'\]"),
        guarding_injected_faults(monkeypatch, unstruck_allowed=False, refused_allowed=False),
    ):
        await _lose_the_ack_of_a_refused_release(FaultyLedger(InMemoryLedger()))


@pytest.mark.refused_write_may_lose_its_ack("this test checks the guard's own escape hatch")
async def test_a_test_may_lose_a_refused_write_s_acknowledgement_on_purpose(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    with guarding_injected_faults(monkeypatch, unstruck_allowed=False, refused_allowed=True):
        await _lose_the_ack_of_a_refused_release(FaultyLedger(InMemoryLedger()))


async def test_a_lost_acknowledgement_of_a_stored_claim_passes(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    inner = InMemoryLedger()
    receipt = unstarted_claim("charge", "k", {"amount": 1}, provider_reference="ref-1")
    with guarding_injected_faults(monkeypatch, unstruck_allowed=False, refused_allowed=False):
        faulty = FaultyLedger(inner)
        faulty.inject("claim", LOSE)
        with pytest.raises(LedgerFaultError):
            await faulty.claim(receipt)
    assert await inner.get(receipt.action_id) is not None  # the claim was stored


async def _lose_the_ack_of_a_replayed_claim(inner: InMemoryLedger) -> None:
    faulty = FaultyLedger(inner)
    faulty.inject("claim", LOSE)
    again = unstarted_claim("charge", "k", {"amount": 1}, provider_reference="ref-1")
    with pytest.raises(LedgerFaultError):
        await faulty.claim(again)  # the key is held: answered, nothing created


@pytest.mark.refused_write_may_lose_its_ack("this test checks the guard that forbids it")
async def test_a_lost_acknowledgement_of_a_claim_of_a_held_key_fails_the_test(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    inner = InMemoryLedger()
    await inner.claim(unstarted_claim("charge", "k", {"amount": 1}, provider_reference="ref-1"))
    with (
        pytest.raises(
            AssertionError, match=r"stored nothing: \['claim -> not created \(held by \w+\)'\]"
        ),
        guarding_injected_faults(monkeypatch, unstruck_allowed=False, refused_allowed=False),
    ):
        await _lose_the_ack_of_a_replayed_claim(inner)


@pytest.mark.faults_may_remain("this test checks the guard that forbids it")
async def test_a_fault_that_never_strikes_fails_the_test(monkeypatch: pytest.MonkeyPatch) -> None:
    with (
        pytest.raises(AssertionError, match="never struck"),
        guarding_injected_faults(monkeypatch, unstruck_allowed=False, refused_allowed=False),
    ):
        FaultyLedger(InMemoryLedger()).inject("record", LedgerFault.FAIL_BEFORE_WRITE)
    with guarding_injected_faults(monkeypatch, unstruck_allowed=True, refused_allowed=False):
        FaultyLedger(InMemoryLedger()).inject("record", LedgerFault.FAIL_BEFORE_WRITE)
