"""The runner's lifecycle verbs: namespaces, ``expires_after`` and ``reopen``, on every ledger.

The ledger-level rules are in the contract (``dataoad.testing.LifecycleContract``);
here the runner is driven end to end, counting provider calls.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from dataoad import (
    ActionInProgressError,
    ActionNotFoundError,
    ActionRunner,
    ActionStatus,
    DefinitiveFailure,
    IdempotencyConflictError,
    InMemoryLedger,
    InvalidArgumentError,
    RecoveryRefusedError,
    SQLiteLedger,
    SyncActionRunner,
)
from dataoad._receipt import utc_now
from dataoad.testing import PaymentVerifier
from suite_support import UnknownLandsFirst
from suite_support.services import PostgresTestTable


class LedgerTime:
    """A ledger's own clock that the test moves: real time plus an offset."""

    def __init__(self) -> None:
        self.offset = timedelta()

    def __call__(self) -> datetime:
        return utc_now() + self.offset

    def advance(self, seconds: float) -> None:
        self.offset += timedelta(seconds=seconds)


class SkewedRunnerClock:
    """A runner's clock whose wall time is ``skew`` off (monotonic time never passes)."""

    def __init__(self, skew: timedelta = timedelta()) -> None:
        self.skew = skew

    def monotonic(self) -> float:
        return 0.0

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(0)

    def wall_time(self) -> datetime:
        return utc_now() + self.skew


class Calls:
    """An operation that counts its invocations and answers as told."""

    def __init__(self, answer: Callable[[int], Any] = lambda n: f"ch_{n}") -> None:
        self.count = 0
        self.answer = answer

    async def __call__(self) -> Any:
        self.count += 1
        return self.answer(self.count)


@pytest.fixture
def ledger_time() -> LedgerTime:
    """The clock of the ``ledger`` fixture's ledger (the only clock that judges an age)."""
    return LedgerTime()


@pytest.fixture(params=["memory", "sqlite", "postgres"])
async def ledger(
    request: pytest.FixtureRequest, tmp_path: Path, ledger_time: LedgerTime
) -> AsyncIterator[Any]:
    if request.param == "memory":
        yield InMemoryLedger(clock=ledger_time)
    elif request.param == "sqlite":
        async with SQLiteLedger(tmp_path / "ledger.sqlite3", clock=ledger_time) as lite:
            yield lite
    else:
        table = PostgresTestTable()
        await table.create()
        pg = table.client(max_size=12, clock=ledger_time)
        try:
            yield pg
        finally:
            await pg.close()
            await table.drop()


def declined(n: int) -> Any:
    raise DefinitiveFailure("card declined")


async def test_namespaces_never_replay_conflict_or_block_each_other(ledger: Any) -> None:
    a = ActionRunner(ledger, namespace="tenant-a")
    b = ActionRunner(ledger, namespace="tenant-b")
    calls = Calls()
    first = await a.execute("charge", calls, request={"n": 1}, idempotency_key="order-1")
    # The same key with another request in another namespace is not a conflict.
    other = await b.execute("charge", calls, request={"n": 2}, idempotency_key="order-1")
    assert calls.count == 2
    assert (first.receipt.namespace, other.receipt.namespace) == ("tenant-a", "tenant-b")
    assert first.receipt.action_id != other.receipt.action_id
    replay = await a.execute("charge", calls, request={"n": 1}, idempotency_key="order-1")
    assert replay.replayed
    assert replay.receipt.action_id == first.receipt.action_id
    with pytest.raises(IdempotencyConflictError):
        await a.execute("charge", calls, request={"n": 2}, idempotency_key="order-1")
    assert calls.count == 2
    # An action id of one namespace is not found from another.
    for verb in (b.receipt, b.reopen, b.release_unstarted):
        with pytest.raises(ActionNotFoundError):
            await verb(first.receipt.action_id)
    with pytest.raises(ActionNotFoundError):
        # Never called (the id is not found first): a placeholder, not a verifier.
        await b.reconcile(first.receipt.action_id, lambda r: None)  # type: ignore[arg-type, return-value]
    default = ActionRunner(ledger)
    assert default.namespace == ""
    third = await default.execute("charge", calls, request={"n": 3}, idempotency_key="order-1")
    assert calls.count == 3
    assert third.receipt.namespace == ""
    listed = await ledger.receipts(namespace="tenant-a")
    assert [r.action_id for r in listed] == [first.receipt.action_id]


async def test_a_claim_in_progress_in_one_namespace_does_not_block_another(ledger: Any) -> None:
    started, release = asyncio.Event(), asyncio.Event()

    async def slow() -> str:
        started.set()
        await release.wait()
        return "ok"

    a = ActionRunner(ledger, namespace="a")
    b = ActionRunner(ledger, namespace="b")
    running = asyncio.create_task(a.execute("charge", slow, request={}, idempotency_key="k"))
    await started.wait()
    with pytest.raises(ActionInProgressError):
        await a.execute("charge", slow, request={}, idempotency_key="k")
    done = await b.execute("charge", lambda: "b", request={}, idempotency_key="k")
    assert done.status is ActionStatus.CONFIRMED
    release.set()
    assert (await running).status is ActionStatus.CONFIRMED


@pytest.mark.parametrize("answer", [lambda n: f"ch_{n}", declined], ids=["confirmed", "failed"])
async def test_an_expired_definitive_receipt_is_claimed_afresh(
    ledger: Any, ledger_time: LedgerTime, answer: Callable[[int], Any]
) -> None:
    clock = ledger_time
    runner = ActionRunner(ledger)
    calls = Calls(answer)
    first = await runner.execute(
        "charge", calls, request={"n": 1}, idempotency_key="k", expires_after=3600
    )
    clock.advance(3599)
    replay = await runner.execute(
        "charge", calls, request={"n": 1}, idempotency_key="k", expires_after=3600
    )
    assert replay.replayed
    assert calls.count == 1
    clock.advance(2)
    # Without expires_after the old receipt still replays: expiry is per call.
    assert (await runner.execute("charge", calls, request={"n": 1}, idempotency_key="k")).replayed
    fresh = await runner.execute(
        "charge", calls, request={"n": 2}, idempotency_key="k", expires_after=3600
    )
    assert calls.count == 2
    assert not fresh.replayed
    assert fresh.receipt.action_id != first.receipt.action_id
    old = await runner.receipt(first.receipt.action_id)
    assert old.retired_at is not None
    assert old.final_status is first.status
    assert old.attempt_records == first.receipt.attempt_records
    assert old.version == first.receipt.version + 1


@pytest.mark.parametrize("skew_hours", [1, -1, 24 * 31])
async def test_no_host_clock_expires_a_fresh_receipt(
    ledger: Any, monkeypatch: pytest.MonkeyPatch, skew_hours: int
) -> None:
    """Issue V2: a writer whose clock runs slow, or a caller whose clock runs fast.

    Only the ledger's clock judges an age. The writer stamps ``updated_at``
    an hour (or a month) behind and the caller's wall time is as far ahead,
    so a receipt 1 s old looks older than ``expires_after`` to anyone who
    compares the two: it must still replay, and the charge must run once.
    """
    skew = timedelta(hours=skew_hours)
    calls = Calls()
    import dataoad._attempts as attempts_module
    import dataoad._settled as settled_module

    def slow_writer() -> datetime:
        return utc_now() - skew

    monkeypatch.setattr(settled_module, "utc_now", slow_writer)
    monkeypatch.setattr(attempts_module, "utc_now", slow_writer)
    writer = ActionRunner(ledger)
    first = await writer.execute("charge", calls, request={"n": 1}, idempotency_key="k")
    # The writer's clock was off by the skew.
    assert abs(first.receipt.updated_at - (utc_now() - skew)) < timedelta(minutes=1)
    monkeypatch.undo()
    caller = ActionRunner(ledger, clock=SkewedRunnerClock(skew))
    again = await caller.execute(
        "charge", calls, request={"n": 1}, idempotency_key="k", expires_after=600
    )
    assert again.replayed
    assert again.receipt.action_id == first.receipt.action_id
    assert calls.count == 1
    stored = await caller.receipt(first.receipt.action_id)
    assert stored.retired_at is None


async def test_expiry_boundary_is_exact_on_the_ledger_clock(
    ledger: Any, ledger_time: LedgerTime
) -> None:
    """A receipt stored at T expires for ``expires_after=E`` at T+E, not a moment before.

    Measured from the moment the ledger stored the definitive outcome (not
    from the claim): the operation takes 100 s of ledger time here.
    """
    calls = Calls()

    async def slow_operation() -> Any:
        ledger_time.advance(100)  # the claim is 100 s older than the outcome
        return await calls()

    runner = ActionRunner(ledger, lease=None)
    first = await runner.execute("charge", slow_operation, request={}, idempotency_key="k")
    stored = await runner.receipt(first.receipt.action_id)
    assert stored.stored_at is not None
    ledger_time.advance(3600 - 100 - 0.5)  # 3600 s after the claim, 3499.5 s after the outcome
    assert (
        await runner.execute("charge", calls, request={}, idempotency_key="k", expires_after=3500)
    ).replayed
    ledger_time.advance(0.5)
    done = await runner.execute(
        "charge", calls, request={}, idempotency_key="k", expires_after=3500
    )
    assert not done.replayed
    assert calls.count == 2


async def test_unknown_and_pending_never_expire(ledger: Any, ledger_time: LedgerTime) -> None:
    clock = ledger_time
    runner = ActionRunner(ledger)

    async def lost() -> None:
        raise TimeoutError("no answer")

    calls = Calls()
    unknown = await runner.execute("charge", lost, request={}, idempotency_key="u")
    assert unknown.status is ActionStatus.UNKNOWN
    clock.advance(10**6)
    again = await runner.execute("charge", calls, request={}, idempotency_key="u", expires_after=0)
    assert again.replayed
    assert again.status is ActionStatus.UNKNOWN
    assert calls.count == 0
    started, release = asyncio.Event(), asyncio.Event()

    async def slow() -> str:
        started.set()
        await release.wait()
        return "ok"

    running = asyncio.create_task(runner.execute("charge", slow, request={}, idempotency_key="p"))
    await started.wait()
    with pytest.raises(ActionInProgressError):
        await runner.execute("charge", calls, request={}, idempotency_key="p", expires_after=0)
    release.set()
    await running
    assert calls.count == 0
    assert (await runner.receipt(unknown.receipt.action_id)).retired_at is None


async def test_an_expired_key_may_be_claimed_with_another_request(ledger: Any) -> None:
    runner = ActionRunner(ledger)
    await runner.execute("charge", lambda: 1, request={"n": 1}, idempotency_key="k")
    with pytest.raises(IdempotencyConflictError):
        await runner.execute("charge", lambda: 2, request={"n": 2}, idempotency_key="k")
    fresh = await runner.execute(
        "charge", lambda: 2, request={"n": 2}, idempotency_key="k", expires_after=0
    )
    assert fresh.value == 2


async def test_of_many_callers_of_an_expired_key_exactly_one_invokes(ledger: Any) -> None:
    runner = ActionRunner(ledger)
    calls = Calls()
    first = await runner.execute("charge", calls, request={}, idempotency_key="k")
    peers = [ActionRunner(ledger) for _ in range(8)]
    outcomes = await asyncio.gather(
        *(
            p.execute(
                "charge",
                calls,
                request={},
                idempotency_key="k",
                expires_after=0,
                wait_in_progress=5,
            )
            for p in peers
        ),
        return_exceptions=True,
    )
    # Each caller either claimed afresh (after it expired the last one) or replayed
    # a claim another caller made; with expires_after=0 a caller may also expire
    # the claim another caller just completed, so count what the ledger holds.
    assert all(not isinstance(o, BaseException) for o in outcomes), outcomes
    receipts = await ledger.receipts(action_name="charge")
    assert calls.count == len(receipts)
    assert sum(r.holds_key for r in receipts) == 1
    assert all(r.retired_at is not None for r in receipts if r.action_id == first.receipt.action_id)
    fresh_claims = {o.receipt.action_id for o in outcomes if not o.replayed}  # type: ignore[union-attr]
    assert len(fresh_claims) == calls.count - 1


async def test_reopen_frees_a_definitive_failure_only(ledger: Any) -> None:
    runner = ActionRunner(ledger)
    calls = Calls()
    failed = await runner.execute("charge", Calls(declined), request={}, idempotency_key="f")
    assert failed.status is ActionStatus.FAILED
    # Without reopen the key replays FAILED, even with retry_on_failed.
    assert (await runner.execute("charge", calls, request={}, idempotency_key="f")).replayed
    await runner.reopen(failed.receipt.action_id)
    await runner.reopen(failed.receipt.action_id)  # twice: nothing more happens
    fresh = await runner.execute("charge", calls, request={}, idempotency_key="f")
    assert fresh.status is ActionStatus.CONFIRMED
    assert calls.count == 1
    old = await runner.receipt(failed.receipt.action_id)
    assert old.final_status is ActionStatus.FAILED
    assert old.retired_at is not None

    async def lost() -> None:
        raise TimeoutError

    confirmed = await runner.execute("charge", calls, request={}, idempotency_key="c")
    unknown = await runner.execute("charge", lost, request={}, idempotency_key="u")
    started, release = asyncio.Event(), asyncio.Event()

    async def slow() -> None:
        started.set()
        await release.wait()

    running = asyncio.create_task(runner.execute("charge", slow, request={}, idempotency_key="p"))
    await started.wait()
    pending = (await ledger.receipts(pending=True))[0]
    for receipt in (confirmed.receipt, unknown.receipt, pending):
        before = await runner.receipt(receipt.action_id)
        with pytest.raises(RecoveryRefusedError):
            await runner.reopen(receipt.action_id)
        assert await runner.receipt(receipt.action_id) == before
    release.set()
    await running


async def test_reopen_decides_again_when_the_receipt_changes_under_it() -> None:
    ledger = UnknownLandsFirst()
    runner = ActionRunner(ledger)
    failed = await runner.execute("charge", Calls(declined), request={}, idempotency_key="f")
    with pytest.raises(RecoveryRefusedError, match="UNKNOWN"):
        await runner.reopen(failed.receipt.action_id)
    stored = await ledger.get(failed.receipt.action_id)
    assert stored is not None
    assert stored.retired_at is None
    assert (await ledger.find("charge", "f")) == stored


async def test_bad_lifecycle_arguments_are_refused_before_the_ledger_is_touched() -> None:
    class Untouchable(InMemoryLedger):
        async def find(self, *args: Any, **kwargs: Any) -> Any:
            raise AssertionError("the ledger was read")

        async def claim(self, *args: Any, **kwargs: Any) -> Any:
            raise AssertionError("the ledger was written")

    ledger = Untouchable()
    for namespace in (None, 3, "x" * 129, "a\x00b", "\ud800"):
        with pytest.raises(InvalidArgumentError, match="namespace"):
            ActionRunner(ledger, namespace=namespace)  # type: ignore[arg-type]
    runner = ActionRunner(ledger, namespace="n")
    for expires_after in (-1, float("nan"), float("inf"), "60", True, 10**12):
        with pytest.raises(InvalidArgumentError, match="expires_after"):
            # Deliberately bad expires_after values ("60" is no float): as no overload of
            # execute then matches, mypy also rejects the (correct) lambda.
            await runner.execute(
                "charge",
                lambda: 1,  # type: ignore[arg-type, return-value]
                request={},
                idempotency_key="k",
                expires_after=expires_after,  # type: ignore[arg-type]
            )
    # Each part within its own limit, but together too big for every backend's index.
    with pytest.raises(InvalidArgumentError, match="bytes"):
        await ActionRunner(ledger, namespace="\U0001f600" * 128).execute(
            "\U0001f600" * 128, lambda: 1, request={}, idempotency_key="\U0001f600" * 512
        )

    class NoLifecycle:
        def __init__(self) -> None:
            self.inner = InMemoryLedger()

        def __getattr__(self, name: str) -> Any:
            if name in ("retire", "prune"):
                raise AttributeError(name)
            return getattr(self.inner, name)

    old = ActionRunner(NoLifecycle(), lease=None)
    with pytest.raises(InvalidArgumentError, match="retire"):
        await old.execute("charge", lambda: 1, request={}, idempotency_key="k", expires_after=1)
    with pytest.raises(InvalidArgumentError, match="retire"):
        await old.reopen("a" * 32)


def test_the_sync_runner_takes_namespace_expiry_and_reopen() -> None:
    with SyncActionRunner(InMemoryLedger(), namespace="t") as runner:
        assert runner.namespace == "t"
        failed = runner.execute("charge", lambda: declined(1), request={}, idempotency_key="k")
        assert failed.receipt.namespace == "t"
        runner.reopen(failed.receipt.action_id)
        again = runner.execute("charge", lambda: "ok", request={}, idempotency_key="k")
        assert again.status is ActionStatus.CONFIRMED
        fresh = runner.execute(
            "charge", lambda: "new", request={}, idempotency_key="k", expires_after=0
        )
        assert fresh.value == "new"


async def test_a_verifier_replay_of_unknown_still_settles_without_expiring() -> None:
    from dataoad.testing import ChargeFault, FakePaymentProvider

    provider = FakePaymentProvider(charge_faults=[ChargeFault.TIMEOUT_AFTER_COMMIT])
    runner = ActionRunner(InMemoryLedger())

    async def charge() -> Any:
        return await provider.charge(customer_id="c", amount_cents=5, client_reference="r")

    first = await runner.execute(
        "charge", charge, request={}, idempotency_key="k", provider_reference="r"
    )
    assert first.status is ActionStatus.UNKNOWN
    settled = await runner.execute(
        "charge",
        charge,
        request={},
        idempotency_key="k",
        provider_reference="r",
        verifier=PaymentVerifier(provider),
        expires_after=0,
    )
    assert settled.replayed
    assert settled.status is ActionStatus.CONFIRMED
    assert provider.charge_calls == 1


@pytest.mark.parametrize("fault", ["FAIL_BEFORE_WRITE", "LOSE_ACKNOWLEDGEMENT"])
async def test_a_faulted_retire_never_invokes_unproven(fault: str) -> None:
    from dataoad import NothingInvokedError
    from dataoad.testing import FaultyLedger, LedgerFault

    inner = InMemoryLedger()
    ledger = FaultyLedger(inner)
    runner = ActionRunner(ledger)
    calls = Calls()
    first = await runner.execute("charge", calls, request={}, idempotency_key="k")
    ledger.inject("retire", LedgerFault[fault])
    if fault == "FAIL_BEFORE_WRITE":
        with pytest.raises(NothingInvokedError) as info:
            await runner.execute("charge", calls, request={}, idempotency_key="k", expires_after=0)
        assert info.value.operation_invoked is False
        assert info.value.receipt is None
        assert calls.count == 1
        assert (await inner.get(first.receipt.action_id)) == first.receipt  # unchanged
    else:
        # The retire committed and its acknowledgement was lost: the read-back proves it.
        fresh = await runner.execute(
            "charge", calls, request={}, idempotency_key="k", expires_after=0
        )
        assert not fresh.replayed
        assert calls.count == 2
        old = await inner.get(first.receipt.action_id)
        assert old is not None
        assert old.retired_at is not None
