"""Rules found under-tested by targeted mutation of the core; each test kills one mutant."""

from __future__ import annotations

import asyncio
import dataclasses

import pytest

from dataoad import (
    ActionInProgressError,
    ActionPersistenceError,
    ActionRunner,
    ActionStatus,
    ClaimState,
    DefinitiveFailure,
    InMemoryLedger,
    InvalidRequestError,
    RecoveryRefusedError,
    ResultValueUnavailableError,
    VerificationHealth,
    VerificationResult,
)
from dataoad.testing import FaultyLedger, LedgerFault
from tests.support import REF, REQUEST, CountingOperation, confirmed, fenced_absent, fixed_verifier

C, F, U = ActionStatus.CONFIRMED, ActionStatus.FAILED, ActionStatus.UNKNOWN
run = asyncio.run


def test_execute_recovered_value_needs_non_null_request_id():
    async def s():
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

    run(s())


def test_persistence_error_carries_final_not_execution_status():
    async def s():
        inner = InMemoryLedger()
        faulty = FaultyLedger(inner)
        r = ActionRunner(faulty)
        faulty.inject("record", LedgerFault.FAIL_BEFORE_WRITE)
        with pytest.raises(ActionPersistenceError) as info:
            await r.execute(
                "a",
                CountingOperation(TimeoutError()),
                request=REQUEST,
                idempotency_key="k",
                provider_reference=REF,
                verifier=fixed_verifier(confirmed(rid="pr_1")),
            )
        e = info.value
        assert e.observed_status is C
        assert e.observed_metadata["verification"]["status"] == "CONFIRMED"
        assert tuple(e.observed_metadata["provider_request_ids"]) == ("pr_1",)

    run(s())


def test_reconcile_of_failed_receipt_does_not_call_verifier():
    async def s():
        r = ActionRunner(InMemoryLedger())
        done = await r.execute(
            "a",
            CountingOperation(DefinitiveFailure("no")),
            request=REQUEST,
            idempotency_key="k",
            provider_reference=REF,
        )
        assert done.status is F
        v = fixed_verifier(confirmed())
        again = await r.reconcile(done.receipt.action_id, v)
        assert again.receipt == done.receipt
        assert v.calls == []

    run(s())


def test_recover_pending_refuses_if_new_attempt_starts_during_verification():
    async def s():
        inner = InMemoryLedger()
        faulty = FaultyLedger(inner)
        faulty.inject("record", LedgerFault.FAIL_BEFORE_WRITE)
        with pytest.raises(ActionPersistenceError) as info:
            await ActionRunner(faulty).execute(
                "a",
                CountingOperation(TimeoutError()),
                request=REQUEST,
                idempotency_key="k",
                provider_reference=REF,
            )
        aid = info.value.receipt.action_id

        async def verify(receipt):
            cur = await inner.get(aid)
            recs = (*cur.attempt_records, dataclasses.replace(cur.attempt_records[0], number=2))
            assert await inner.start_attempt(
                cur.evolve(attempts=2, attempt_records=recs, version=cur.version + 1)
            )
            return fenced_absent()

        with pytest.raises(RecoveryRefusedError):
            await ActionRunner(inner).recover_pending(aid, verify)
        assert (await inner.get(aid)).claim_state is ClaimState.PENDING

    run(s())


def test_failed_reconcile_write_raises_persistence_error():
    async def s():
        inner = InMemoryLedger()
        faulty = FaultyLedger(inner)
        r = ActionRunner(faulty)
        first = await r.execute(
            "a",
            CountingOperation(TimeoutError()),
            request=REQUEST,
            idempotency_key="k",
            provider_reference=REF,
        )
        faulty.inject("record", LedgerFault.FAIL_BEFORE_WRITE)
        with pytest.raises(ActionPersistenceError) as info:
            await r.reconcile(first.receipt.action_id, fixed_verifier(confirmed()))
        assert info.value.operation_invoked is False
        assert info.value.observed_status is C
        assert (await inner.get(first.receipt.action_id)).final_status is U

    run(s())


def test_release_refused_when_claim_changes_before_release():
    async def s():
        inner = InMemoryLedger()
        faulty = FaultyLedger(inner)
        faulty.inject("start_attempt", LedgerFault.FAIL_BEFORE_WRITE)
        with pytest.raises(ActionPersistenceError) as info:
            await ActionRunner(faulty).execute(
                "a", CountingOperation(), request=REQUEST, idempotency_key="k"
            )
        aid = info.value.receipt.action_id
        await inner.get(aid)

        class Racing(FaultyLedger):
            async def release(self, action_id, version):
                from dataoad import AttemptRecord
                from dataoad._receipt import utc_now

                c = await inner.get(action_id)
                await inner.start_attempt(
                    c.evolve(
                        attempts=1,
                        attempt_records=(AttemptRecord(number=1, started_at=utc_now()),),
                        version=c.version + 1,
                    )
                )
                return await inner.release(action_id, version)

        with pytest.raises(RecoveryRefusedError):
            await ActionRunner(Racing(inner)).release_unstarted(aid)
        assert (await inner.get(aid)) is not None

    run(s())


def test_lost_claim_ack_with_competitor_does_not_invoke():
    async def s():
        inner = InMemoryLedger()
        op = CountingOperation()
        CountingOperation()

        class Racing(FaultyLedger):
            async def claim(self, receipt):
                comp = receipt.evolve(action_id="competitor")
                await inner.claim(comp)
                raise ConnectionError("ack lost")

        with pytest.raises(ActionInProgressError):
            await ActionRunner(Racing(inner)).execute("a", op, request=REQUEST, idempotency_key="k")
        assert op.calls == 0
        assert (await inner.get("competitor")).attempts == 0

    run(s())


def test_verifier_reason_is_bounded():
    async def s():
        r = ActionRunner(InMemoryLedger())
        res = await r.execute(
            "a",
            CountingOperation(TimeoutError()),
            request={},
            idempotency_key="k",
            provider_reference=REF,
            verifier=fixed_verifier(VerificationResult.unknown(reason="z" * 50_000)),
        )
        assert len(res.receipt.metadata["verification"]["reason"]) <= 1000

    run(s())


def test_large_verifier_details_not_stored():
    async def s():
        r = ActionRunner(InMemoryLedger())
        res = await r.execute(
            "a",
            CountingOperation(TimeoutError()),
            request={},
            idempotency_key="k",
            provider_reference=REF,
            verifier=fixed_verifier(
                VerificationResult.unknown(reason="x", details={"blob": "b" * 10_000})
            ),
        )
        assert res.receipt.metadata["verification"]["details"] == {"truncated": True}

    run(s())


def test_recovery_absence_racing_worker_confirmation_is_unknown_conflict():
    async def s():
        inner = InMemoryLedger()
        faulty = FaultyLedger(inner)
        faulty.inject("record", LedgerFault.FAIL_BEFORE_WRITE)
        with pytest.raises(ActionPersistenceError) as info:
            await ActionRunner(faulty).execute(
                "a",
                CountingOperation("v"),
                request=REQUEST,
                idempotency_key="k",
                provider_reference=REF,
            )
        aid = info.value.receipt.action_id

        async def verify(receipt):
            cur = await inner.get(aid)  # the original worker finally records CONFIRMED
            recs = (dataclasses.replace(cur.attempt_records[0], execution_status=C),)
            assert await inner.record(
                cur.evolve(
                    claim_state=ClaimState.COMPLETED,
                    attempt_records=recs,
                    execution_status=C,
                    final_status=C,
                    version=cur.version + 1,
                )
            )
            return fenced_absent()

        res = await ActionRunner(inner).recover_pending(aid, verify)
        assert res.status is U
        assert res.receipt.metadata["verification_conflict"] is True

    run(s())


def test_untrusted_confirmation_request_id_not_retained():
    async def s():
        r = ActionRunner(InMemoryLedger())
        bad = VerificationResult(
            outcome=C,
            health=VerificationHealth.DEGRADED,
            verified_provider_reference=REF,
            provider_request_id="pr_x",
        )
        res = await r.execute(
            "a",
            CountingOperation(TimeoutError()),
            request={},
            idempotency_key="k",
            provider_reference=REF,
            verifier=fixed_verifier(bad),
        )
        assert res.status is U
        assert tuple(res.receipt.metadata["provider_request_ids"]) == ()
        assert res.receipt.provider_request_id is None

    run(s())


def test_float_subclass_rejected():
    class Fl(float):
        pass

    r = ActionRunner(InMemoryLedger())
    with pytest.raises(InvalidRequestError):
        run(r.execute("a", lambda: 1, request={"a": Fl(1.5)}, idempotency_key="k"))


def test_depth_boundary():
    from dataoad._canonical import MAX_DEPTH, validate_request

    def nest(n):
        d = {}
        for _ in range(n):
            d = {"a": d}
        return d

    validate_request(nest(MAX_DEPTH - 1))
    with pytest.raises(InvalidRequestError):
        validate_request(nest(MAX_DEPTH))


def test_ledger_contract_refuses_invalid_transitions():
    async def s():
        inner = InMemoryLedger()
        done = await ActionRunner(inner).execute("a", lambda: 1, request={}, idempotency_key="k")
        cur = done.receipt  # COMPLETED, attempts 1, version 3
        from dataoad import AttemptRecord
        from dataoad._receipt import utc_now

        extra = (*cur.attempt_records, AttemptRecord(number=2, started_at=utc_now()))
        assert not await inner.start_attempt(
            cur.evolve(
                claim_state=ClaimState.PENDING,
                attempts=2,
                attempt_records=extra,
                version=cur.version + 1,
            )
        )
        assert not await inner.record(
            cur.evolve(claim_state=ClaimState.PENDING, version=cur.version + 1)
        )
        assert not await inner.record(
            cur.evolve(attempts=2, attempt_records=extra, version=cur.version + 1)
        )
        assert not await inner.record(cur.evolve(request_hash="0" * 64, version=cur.version + 1))
        # pending claim: version skip, attempts jump, record count mismatch

        pend = cur.evolve(
            action_id="p",
            idempotency_key="k2",
            claim_state=ClaimState.PENDING,
            attempts=0,
            attempt_records=(),
            version=1,
            execution_status=None,
            verification_status=None,
            final_status=None,
        )
        assert (await inner.claim(pend))[1]
        r1 = (AttemptRecord(number=1, started_at=utc_now()),)
        assert not await inner.start_attempt(pend.evolve(attempts=1, attempt_records=r1, version=3))
        assert not await inner.start_attempt(
            pend.evolve(attempts=2, attempt_records=r1 * 2, version=2)
        )
        assert not await inner.start_attempt(pend.evolve(attempts=1, attempt_records=(), version=2))
        assert not await inner.release("p", 2)
        assert await inner.release("p", 1)

    run(s())


def test_three_concurrent_confirmations_withhold_value():
    async def s():
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

        def vf(ans):
            async def v(_):
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
            not o.value_available
            for o in outs
            if o.receipt.metadata["provider_request_id_conflict"]
        )

    asyncio.run(s())


def test_replay_never_exposes_a_value_even_after_reconciling() -> None:
    async def s() -> None:
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

    run(s())


def test_oversized_verifier_identifiers_are_refused_and_stay_unknown() -> None:
    from dataoad import InvalidArgumentError

    with pytest.raises(InvalidArgumentError):
        VerificationResult.confirmed(verified_provider_reference="r" * 1001)

    def verify(receipt: object) -> VerificationResult:
        return VerificationResult.confirmed(
            verified_provider_reference=REF, provider_request_id="p" * 100_000
        )

    async def s() -> None:
        r = ActionRunner(InMemoryLedger())
        res = await r.execute(
            "a",
            CountingOperation(TimeoutError()),
            request={},
            idempotency_key="k",
            provider_reference=REF,
            verifier=verify,
        )
        assert res.status is U
        assert len(str(res.receipt.metadata)) < 5000

    run(s())
