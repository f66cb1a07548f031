"""What is stored: hashes not requests, bounded errors, never provider values."""

from __future__ import annotations

import dataclasses
import json
from datetime import UTC, datetime
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from dataoad import ActionReceipt, ActionRunner, ActionStatus, ClaimState, InMemoryLedger
from dataoad._frozen import FrozenDict
from dataoad._receipt import MAX_ERROR_LENGTH, AttemptRecord, build_receipt
from dataoad.testing import make_receipt
from suite_support import REF, CountingOperation, confirmed, fixed_verifier


def stored_text(receipt: object) -> str:
    return json.dumps(dataclasses.asdict(receipt), default=str)  # type: ignore[call-overload]


async def test_raw_request_and_provider_values_are_never_stored() -> None:
    secret_request = {"card_number": "4111-SECRET-REQUEST"}
    secret_value = {"token": "SECRET-PROVIDER-VALUE"}

    ledger = InMemoryLedger()
    runner = ActionRunner(ledger)
    await runner.execute("a", lambda: secret_value, request=secret_request, idempotency_key="k1")
    await runner.execute(
        "a",
        CountingOperation(TimeoutError()),
        request=secret_request,
        idempotency_key="k2",
        provider_reference=REF,
        verifier=fixed_verifier(confirmed(value=secret_value)),
    )
    for receipt in ledger.snapshot():
        text = stored_text(receipt)
        assert "SECRET-REQUEST" not in text
        assert "SECRET-PROVIDER-VALUE" not in text


async def test_stored_error_strings_are_bounded() -> None:
    class Unprintable(Exception):
        def __str__(self) -> str:
            raise RuntimeError("cannot print")

    runner = ActionRunner(InMemoryLedger())
    huge = await runner.execute(
        "a", CountingOperation(TimeoutError("x" * 50_000)), request={}, idempotency_key="k1"
    )
    assert huge.receipt.error is not None
    assert len(huge.receipt.error) <= MAX_ERROR_LENGTH
    assert huge.receipt.error.startswith("TimeoutError: xxx")
    assert len(huge.receipt.attempt_records[0].error or "") <= MAX_ERROR_LENGTH
    odd = await runner.execute(
        "a", CountingOperation(Unprintable()), request={}, idempotency_key="k2"
    )
    assert odd.status is ActionStatus.UNKNOWN
    assert odd.receipt.error is not None
    assert odd.receipt.error.startswith("Unprintable")


async def test_verifier_error_and_reason_strings_are_bounded() -> None:
    runner = ActionRunner(InMemoryLedger())
    result = await runner.execute(
        "a",
        CountingOperation(TimeoutError()),
        request={},
        idempotency_key="k",
        provider_reference=REF,
        verifier=fixed_verifier(RuntimeError("y" * 50_000)),
    )
    observation = result.receipt.metadata["verification"]
    assert len(observation["error"]) <= MAX_ERROR_LENGTH


async def test_version_increases_by_one_per_durable_transition() -> None:
    runner = ActionRunner(InMemoryLedger())
    result = await runner.execute(
        "a",
        CountingOperation(TimeoutError()),
        request={},
        idempotency_key="k",
        provider_reference=REF,
    )
    # claim counting attempt 1 (1), completion (2)
    assert result.receipt.version == 2
    settled = await runner.reconcile(result.receipt.action_id, fixed_verifier(confirmed()))
    assert settled.receipt.version == 3


async def test_receipts_are_immutable_snapshots() -> None:
    runner = ActionRunner(InMemoryLedger())
    result = await runner.execute("a", lambda: 1, request={}, idempotency_key="k")
    try:
        result.receipt.attempts = 9  # type: ignore[misc]
    except dataclasses.FrozenInstanceError:
        pass
    else:
        raise AssertionError("receipt was mutable")
    assert (await runner.receipt(result.receipt.action_id)).attempts == 1


# -- ActionReceipt.evolve: every transition of every call copies through it ----------------

_T1 = datetime(2026, 1, 2, tzinfo=UTC)


def test_evolve_copies_and_leaves_the_original_as_it_was() -> None:
    original = make_receipt(metadata={"k": [1]}, stored_at=_T1, lease_expires_at=_T1)
    before = dataclasses.asdict(original)
    copy = original.evolve(attempts=1, error="boom")
    assert copy is not original
    assert (copy.attempts, copy.error) == (1, "boom")
    assert dataclasses.asdict(original) == before
    # Nothing of the copy is the original's to change: not even its field store.
    assert vars(copy) is not vars(original)
    assert copy.metadata is original.metadata  # unchanged and deeply frozen: shared
    for field in dataclasses.fields(ActionReceipt):
        if field.name not in ("attempts", "error"):
            assert getattr(copy, field.name) == getattr(original, field.name), field.name


def test_evolve_refuses_an_unknown_field_and_builds_nothing() -> None:
    original = make_receipt()
    with pytest.raises(TypeError, match="has no field 'atempts'"):
        original.evolve(atempts=2, version=2)
    assert original.attempts == 0
    assert original.version == 1


def test_a_new_version_is_not_stored_until_the_ledger_says_so() -> None:
    stored = make_receipt(stored_at=_T1)
    assert stored.evolve(version=2).stored_at is None
    assert stored.evolve(version=2, stored_at=_T1).stored_at == _T1  # a ledger stamping it
    assert stored.evolve(error="same version").stored_at == _T1  # a stamp of this version


def test_evolve_freezes_what_it_is_given() -> None:
    metadata: dict[str, Any] = {"k": [1]}
    records = [AttemptRecord(number=1, started_at=_T1)]
    copy = make_receipt().evolve(metadata=metadata, attempt_records=records, attempts=1)
    metadata["k"].append(2)
    records.append(AttemptRecord(number=2, started_at=_T1))
    assert copy.metadata == {"k": (1,)}  # lists freeze to tuples
    assert isinstance(copy.metadata, FrozenDict)
    assert copy.attempt_records == (AttemptRecord(number=1, started_at=_T1),)
    assert type(copy.attempt_records) is tuple


def test_nobody_holds_a_completed_claim() -> None:
    held = make_receipt(lease_expires_at=_T1)
    assert held.evolve(version=2).lease_expires_at == _T1
    assert held.evolve(claim_state=ClaimState.COMPLETED, version=2).lease_expires_at is None
    assert (
        held.evolve(lease_expires_at=_T1, claim_state=ClaimState.COMPLETED).lease_expires_at is None
    )


@given(
    st.fixed_dictionaries(
        {},
        optional={
            "attempts": st.integers(0, 5),
            "error": st.none() | st.text(max_size=5),
            "version": st.integers(1, 9),
            "claim_state": st.sampled_from(ClaimState),
            "final_status": st.none() | st.sampled_from(ActionStatus),
            "owner": st.none() | st.text(max_size=5),
            "lease_expires_at": st.none() | st.just(_T1),
            "stored_at": st.none() | st.just(_T1),
            "metadata": st.dictionaries(st.text(max_size=3), st.integers(), max_size=2),
        },
    )
)
def test_evolve_builds_what_a_fresh_receipt_of_those_fields_would_be(
    changes: dict[str, Any],
) -> None:
    original = make_receipt(stored_at=_T1, lease_expires_at=_T1, metadata={"m": 1})
    copy = original.evolve(**changes)
    fields = {f.name: getattr(original, f.name) for f in dataclasses.fields(ActionReceipt)}
    fields.update(changes)
    if "version" in changes and "stored_at" not in changes:
        fields["stored_at"] = None
    fresh = ActionReceipt(**fields)
    for field in dataclasses.fields(ActionReceipt):  # compare=False fields included
        assert getattr(copy, field.name) == getattr(fresh, field.name), field.name


# -- build_receipt: every proposed claim and every SQL read is built through it ------------


@given(
    st.fixed_dictionaries(
        {},
        optional={
            "attempts": st.integers(0, 5),
            "claim_state": st.sampled_from(ClaimState),
            "final_status": st.none() | st.sampled_from(ActionStatus),
            "owner": st.none() | st.text(max_size=5),
            "lease_expires_at": st.none() | st.just(_T1),
            "stored_at": st.none() | st.just(_T1),
            "retired_at": st.none() | st.just(_T1),
            "fencing_token": st.integers(1, 3),
            "metadata": st.dictionaries(
                st.text(max_size=3), st.lists(st.integers(), max_size=2), max_size=2
            ),
            "attempt_records": st.lists(
                st.builds(AttemptRecord, number=st.integers(1, 3), started_at=st.just(_T1)),
                max_size=2,
            ),
        },
    )
)
def test_build_receipt_builds_what_the_dataclass_builds(changes: dict[str, Any]) -> None:
    fields = {f.name: getattr(make_receipt(), f.name) for f in dataclasses.fields(ActionReceipt)}
    fields.update(changes)
    fresh = ActionReceipt(**fields)
    built = build_receipt(dict(fields))
    assert type(built) is ActionReceipt
    for field in dataclasses.fields(ActionReceipt):  # compare=False fields included
        assert getattr(built, field.name) == getattr(fresh, field.name), field.name
    # Frozen as the dataclass freezes: deeply, and a list of records becomes a tuple.
    assert isinstance(built.metadata, FrozenDict)
    assert all(type(value) is tuple for value in built.metadata.values())
    assert type(built.attempt_records) is tuple
    with pytest.raises(dataclasses.FrozenInstanceError):
        built.attempts = 9  # type: ignore[misc]


def test_build_receipt_refuses_a_missing_or_unknown_field() -> None:
    fields = {f.name: getattr(make_receipt(), f.name) for f in dataclasses.fields(ActionReceipt)}
    missing = dict(fields)
    del missing["owner"]
    with pytest.raises(TypeError, match="'owner'"):
        build_receipt(missing)
    unknown = dict(missing, ownr="w")
    with pytest.raises(TypeError, match="'owner'"):
        build_receipt(unknown)
    with pytest.raises(TypeError, match="'ownr'"):
        build_receipt(dict(fields, ownr="w"))
