"""Answers no honest provider gives, judged as no evidence: never a hang, never an escape.

A sync operation or verifier that raises ``StopIteration`` (``next(iter([]))``
on an empty page) once left its call pending for good: a future refuses that
exception. A ``VerificationResult`` whose fields were changed after it was
made (``object.__setattr__``) once escaped the judgement as a plain error,
the claim left PENDING. A verifier that changed the receipt it was handed
changed what the in-memory ledger held.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Callable
from typing import Any

import pytest

from dataoad import (
    ActionRunner,
    ActionStatus,
    ClaimState,
    InMemoryLedger,
    SyncActionRunner,
    VerificationResult,
)
from suite_support import REF, REQUEST, confirmed

#: Far longer than any of these calls may take (milliseconds): one still running then hung.
HANG = 5.0


def _stops() -> Any:
    return next(iter([]))  # StopIteration, as code paging through an empty list raises


async def _execute(runner: ActionRunner, operation: Any, **options: Any) -> Any:
    return await asyncio.wait_for(
        runner.execute(
            "charge",
            operation,
            request=REQUEST,
            idempotency_key="k",
            provider_reference=REF,
            **options,
        ),
        HANG,
    )


async def test_a_sync_operation_raising_stop_iteration_is_recorded_unknown() -> None:
    ledger = InMemoryLedger()
    result = await _execute(ActionRunner(ledger), _stops)
    assert result.status is ActionStatus.UNKNOWN
    stored = await ledger.find("charge", "k")
    assert stored is not None
    assert stored.claim_state is ClaimState.COMPLETED
    assert stored.attempt_records[-1].error is not None
    assert "StopIteration" in stored.attempt_records[-1].error


def test_a_sync_runner_whose_operation_raises_stop_iteration_answers() -> None:
    with SyncActionRunner(InMemoryLedger()) as runner:
        result = runner.execute("charge", _stops, request=REQUEST, idempotency_key="k")
    assert result.status is ActionStatus.UNKNOWN


async def test_a_sync_verifier_raising_stop_iteration_is_no_answer_at_once() -> None:
    def verify(receipt: Any) -> Any:
        return _stops()

    loop = asyncio.get_running_loop()
    began = loop.time()
    result = await _execute(ActionRunner(InMemoryLedger()), lambda: "ch_1", verifier=verify)
    assert result.status is ActionStatus.UNKNOWN
    assert loop.time() - began < 5  # not the verifier timeout (30 s by default)


def _set(**fields: Any) -> Callable[[VerificationResult], VerificationResult]:
    def changed(result: VerificationResult) -> VerificationResult:
        for name, value in fields.items():
            object.__setattr__(result, name, value)  # past __post_init__'s checks
        return result

    return changed


class _Hostile(str):
    def __ne__(self, other: object) -> bool:
        raise RuntimeError("compared")

    __hash__ = str.__hash__


@pytest.mark.parametrize(
    "change",
    [
        _set(reason=7),
        _set(outcome="CONFIRMED"),
        _set(verified_provider_reference=_Hostile(REF)),
        _set(details={1: 2}),  # a key JSON has no form for
        _set(details={"amount": float("nan")}),
        _set(retry_safe=1),
    ],
    ids=["reason-not-text", "outcome-not-a-status", "reference-raises", "int-key", "nan", "flag"],
)
async def test_a_result_changed_after_it_was_made_is_no_evidence(
    change: Callable[[VerificationResult], VerificationResult],
) -> None:
    ledger = InMemoryLedger()
    calls: list[int] = []

    async def operation() -> str:
        calls.append(1)
        return "ch_1"

    async def verify(receipt: Any) -> VerificationResult:
        return change(confirmed())

    result = await _execute(ActionRunner(ledger), operation, verifier=verify)
    assert result.status is ActionStatus.UNKNOWN
    assert calls == [1]
    stored = await ledger.find("charge", "k")
    assert stored is not None
    assert stored.claim_state is ClaimState.COMPLETED  # not left PENDING
    assert stored.final_status is ActionStatus.UNKNOWN
    observation = stored.observations[-1]
    assert observation.attempt == 1
    assert observation.status is ActionStatus.UNKNOWN
    assert observation.error is not None
    assert observation.error.startswith(
        (
            "verifier returned a VerificationResult whose fields could not be judged (",
            "verifier returned a VerificationResult that no ledger can store",
        )
    )


async def test_an_unchanged_result_still_confirms() -> None:
    async def verify(receipt: Any) -> VerificationResult:
        return confirmed()

    result = await _execute(ActionRunner(InMemoryLedger()), lambda: "ch_1", verifier=verify)
    assert result.status is ActionStatus.CONFIRMED


@pytest.mark.parametrize("answer_for", ["its own", "the original"])
async def test_a_verifier_that_changes_the_receipt_it_is_handed_changes_nothing(
    answer_for: str,
) -> None:
    ledger = InMemoryLedger()

    async def verify(receipt: Any) -> VerificationResult:
        object.__setattr__(receipt, "provider_reference", "someone-elses-charge")
        reference = "someone-elses-charge" if answer_for == "its own" else REF
        return dataclasses.replace(confirmed(), verified_provider_reference=reference)

    result = await _execute(ActionRunner(ledger), lambda: "ch_1", verifier=verify)
    # Bound to the receipt's own reference, never to what the verifier made of it.
    expected = ActionStatus.UNKNOWN if answer_for == "its own" else ActionStatus.CONFIRMED
    assert result.status is expected
    stored = await ledger.find("charge", "k")
    assert stored is not None
    assert stored.provider_reference == REF
    assert result.receipt.provider_reference == REF


async def test_a_verifier_that_writes_into_the_receipts_frozen_parts_changes_nothing() -> None:
    ledger = InMemoryLedger()

    handed: list[Any] = []

    async def verify(receipt: Any) -> VerificationResult:
        handed.append(receipt)
        dict.__setitem__(receipt.metadata, "planted", True)  # past FrozenDict's refusal
        object.__setattr__(receipt.attempt_records[0], "error", "planted")
        return confirmed()

    result = await _execute(
        ActionRunner(ledger), lambda: "ch_1", verifier=verify, metadata={"order": "o-1"}
    )
    assert result.status is ActionStatus.CONFIRMED  # an honest answer still counts
    stored = await ledger.find("charge", "k")
    assert stored is not None
    assert "planted" not in stored.metadata
    assert stored.attempt_records[0].error is None
    assert "planted" not in result.receipt.metadata
    # What it was handed was the receipt as it stood, every field there.
    assert handed[0].operator_records == ()
    assert handed[0].attempt_records[0].number == 1
    assert handed[0].action_id == stored.action_id


async def test_a_verifier_that_writes_into_its_own_answer_later_changes_nothing_kept() -> None:
    ledger = InMemoryLedger()
    kept: list[VerificationResult] = []

    async def verify(receipt: Any) -> VerificationResult:
        answer = dataclasses.replace(confirmed(), details={"seen": "ch_1"})
        kept.append(answer)
        return answer

    result = await _execute(ActionRunner(ledger), lambda: "ch_1", verifier=verify)
    assert result.status is ActionStatus.CONFIRMED
    assert kept[0].details is not None
    dict.__setitem__(kept[0].details, "seen", object())  # type: ignore[index]  # after it was judged
    stored = await ledger.find("charge", "k")
    assert stored is not None
    assert stored.observations[-1].details == {"seen": "ch_1"}
