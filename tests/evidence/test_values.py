"""Values a result may expose: the operation's own, or a verifier's recovered one only when correlated."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import pytest

from dataoad import (
    ActionReceipt,
    ActionRunner,
    ActionStatus,
    InMemoryLedger,
    ResultValueUnavailableError,
    VerificationResult,
)
from suite_support import REF, REQUEST, CountingOperation, confirmed, execute, fixed_verifier

C, F, U = ActionStatus.CONFIRMED, ActionStatus.FAILED, ActionStatus.UNKNOWN


async def test_a_value_recovered_by_the_verifier_is_exposed_when_its_request_id_matches() -> None:
    result = await execute(
        ActionRunner(InMemoryLedger()),
        CountingOperation(TimeoutError("lost")),
        verifier=fixed_verifier(confirmed(rid="pr_7", value="receipt-7")),
    )
    assert result.status is ActionStatus.CONFIRMED
    assert result.value == "receipt-7"
    unbound = await execute(
        ActionRunner(InMemoryLedger()),
        CountingOperation(TimeoutError("lost")),
        verifier=fixed_verifier(confirmed(rid=None, value="receipt-?")),
    )
    assert unbound.status is ActionStatus.CONFIRMED
    assert not unbound.value_available


async def test_the_operations_own_value_wins_over_the_verifiers() -> None:
    result = await execute(
        ActionRunner(InMemoryLedger()),
        CountingOperation("from-the-call"),
        verifier=fixed_verifier(confirmed(rid="pr_7", value="from-the-read")),
    )
    assert result.value == "from-the-call"


def test_the_missing_value_marker_reads_as_missing_and_stays_one_object() -> None:
    import copy
    import pickle

    from dataoad._verification import MISSING

    assert repr(MISSING) == "<missing>"
    assert pickle.loads(pickle.dumps(MISSING)) is MISSING
    assert copy.deepcopy(MISSING) is MISSING


async def test_execute_recovered_value_needs_non_null_request_id() -> None:
    r = ActionRunner(InMemoryLedger())
    res = await r.execute(
        "a",
        CountingOperation(TimeoutError()),
        request=REQUEST,
        idempotency_key="k",
        provider_reference=REF,
        verifier=fixed_verifier(confirmed(rid=None, value="v")),
    )
    assert res.status is C
    assert res.value_available is False
    with pytest.raises(ResultValueUnavailableError):
        _ = res.value


async def test_three_concurrent_confirmations_withhold_value() -> None:
    r = ActionRunner(InMemoryLedger())
    u = await r.execute(
        "a",
        CountingOperation(TimeoutError()),
        request=REQUEST,
        idempotency_key="k",
        provider_reference=REF,
    )
    gate = asyncio.Event()
    n = 0

    def vf(ans: VerificationResult) -> Callable[[ActionReceipt], Awaitable[VerificationResult]]:
        async def v(_: ActionReceipt) -> VerificationResult:
            nonlocal n
            n += 1
            if n == 3:
                gate.set()
            await gate.wait()
            return ans

        return v

    outs = await asyncio.gather(
        *(
            r.reconcile(u.receipt.action_id, vf(confirmed(rid=rid, value=rid)))
            for rid in ("pr_2", "pr_1", "pr_1")
        )
    )
    final = await r.receipt(u.receipt.action_id)
    assert final.metadata["provider_request_id_conflict"] is True
    assert all(
        not o.value_available for o in outs if o.receipt.metadata["provider_request_id_conflict"]
    )


async def test_replay_never_exposes_a_value_even_after_reconciling() -> None:
    r = ActionRunner(InMemoryLedger())
    op = CountingOperation(TimeoutError())
    await r.execute("a", op, request=REQUEST, idempotency_key="k", provider_reference=REF)
    replay = await r.execute(
        "a",
        op,
        request=REQUEST,
        idempotency_key="k",
        provider_reference=REF,
        verifier=fixed_verifier(confirmed(rid="pr_1", value="charge")),
    )
    assert replay.replayed is True
    assert replay.status is C
    assert replay.value_available is False
    with pytest.raises(ResultValueUnavailableError):
        _ = replay.value


def test_no_value_is_exposed_from_conflicting_or_missing_evidence() -> None:
    """The exposure rule on its own: a conflict between confirmations hides even the
    operation's own value, so does a retained id its own confirmation did not name
    (the value belongs to some other charge), and without an observation there is
    nothing to recover."""
    from dataoad._evidence import Settlement
    from dataoad._settled import exposed_value as _exposed_value
    from dataoad._verification import MISSING

    def settled(*ids: str) -> Settlement:
        return Settlement(
            execution_status=ActionStatus.UNKNOWN,
            verification_status=ActionStatus.CONFIRMED,
            final_status=ActionStatus.CONFIRMED,
            verification_conflict=False,
            provider_request_ids=ids,
        )

    from dataoad._observing import Observation, _record
    from dataoad._records import ObservationSource

    def own(status: ActionStatus, rid: str | None) -> Observation:
        answer = VerificationResult(
            outcome=status, verified_provider_reference=REF, provider_request_id=rid
        )
        return Observation(answer, _record(ObservationSource.EXECUTE, 1, status, answer, None))

    returned = {"charge": "ch_1"}  # the operation's own value
    assert _exposed_value(settled(), returned, None) == {"charge": "ch_1"}
    assert _exposed_value(settled("pr_1"), returned, own(C, "pr_1")) == {"charge": "ch_1"}
    assert _exposed_value(settled(), returned, own(C, None)) == {"charge": "ch_1"}
    assert _exposed_value(settled("pr_1"), returned, None) is MISSING
    assert _exposed_value(settled("pr_1"), returned, own(C, None)) is MISSING
    assert _exposed_value(settled("pr_1"), returned, own(C, "pr_2")) is MISSING
    assert _exposed_value(settled("pr_1"), returned, own(ActionStatus.UNKNOWN, "pr_1")) is MISSING
    assert _exposed_value(settled("pr_1", "pr_2"), returned, own(C, "pr_1")) is MISSING
    nothing = MISSING  # the operation returned none
    assert _exposed_value(settled("pr_1"), nothing, None) is MISSING

    answer = VerificationResult.confirmed(
        verified_provider_reference=REF, provider_request_id="pr_1", value="recovered"
    )
    seen = Observation(answer, _record(ObservationSource.EXECUTE, 1, C, answer, None))
    assert _exposed_value(settled("pr_1"), nothing, seen) == "recovered"
    assert _exposed_value(settled("pr_1", "pr_2"), nothing, seen) is MISSING
