"""The operator audit: every operator verb leaves one record of who, where, why and what came of it.

On every backend: the record's time is the ledger's own clock; records are
listed newest first and filtered at the exact bounds; they outlive the
receipts they name (pruning keeps them); a bad operator name or reason is
refused before anything is written; a refused verb is recorded as refused;
a verb that was done but could not be audited says so.
"""

from __future__ import annotations

import asyncio
import getpass
import socket
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest

from dataoad import (
    ActionNotFoundError,
    ActionRunner,
    ActionStatus,
    AuditNotRecordedError,
    ClaimState,
    DefinitiveFailure,
    InMemoryLedger,
    InvalidArgumentError,
    OperatorRecord,
    RecoveryRefusedError,
    RetryPolicy,
    SQLiteLedger,
    SyncActionRunner,
)
from dataoad._receipt import AttemptRecord
from dataoad._records import MAX_RECEIPT_OPERATOR_RECORDS
from dataoad.testing import ManualClock
from suite_support import (
    LEDGER_START,
    CountingOperation,
    closing,
    confirmed,
    execute,
    fenced_absent,
    fixed_verifier,
    stranded,
    unknown,
    unstarted,
)


async def test_every_operator_verb_leaves_its_record_stamped_by_the_ledger(
    clocked: tuple[Any, ManualClock],
) -> None:
    ledger, clock = clocked
    runner = ActionRunner(ledger)
    lost = await unknown(ledger)
    await runner.recover_pending(
        lost.receipt.action_id, fixed_verifier(confirmed()), operator="ana", reason="ticket 7"
    )
    clock.advance(1)
    declined = await runner.execute(
        "charge",
        CountingOperation(DefinitiveFailure("declined")),
        request={"n": 2},
        idempotency_key="declined",
    )
    await runner.reopen(declined.receipt.action_id, operator="bo", reason="customer retried")
    clock.advance(1)
    held = await unstarted(ledger, "never-started")
    await runner.release_unstarted(held.action_id, operator="cy")
    records = await ledger.audit()
    assert [(r.verb, r.operator, r.outcome) for r in records] == [
        ("release_unstarted", "cy", "released"),
        ("reopen", "bo", "reopened"),
        ("recover", "ana", "CONFIRMED"),
    ]
    recover = records[-1]
    assert recover.action_id == lost.receipt.action_id
    assert recover.reason == "ticket 7"
    assert recover.namespace == ""
    assert recover.host == socket.gethostname()
    # Stamped by the ledger's clock, not this host's.
    assert [r.at for r in records] == [
        LEDGER_START + timedelta(seconds=2),
        LEDGER_START + timedelta(seconds=1),
        LEDGER_START,
    ]
    assert records[0].reason is None
    # Each receipt carries its own records, the very ones the audit lists
    # (the released claim is gone: the audit alone keeps its record).
    assert await ledger.get(records[0].action_id) is None
    for record in records[1:]:
        receipt = await ledger.get(record.action_id)
        assert receipt is not None
        assert receipt.operator_records == (record,)


async def test_a_verb_that_finds_its_work_done_records_that_it_changed_nothing(
    new_ledger: Callable[[], Any],
) -> None:
    ledger = new_ledger()
    runner = ActionRunner(ledger)
    lost = await unknown(ledger)
    asked = CountingOperation(confirmed())

    async def verifier(receipt: Any) -> Any:
        return await asked()

    first = await runner.recover_pending(lost.receipt.action_id, verifier, operator="ana")
    again = await runner.recover_pending(lost.receipt.action_id, verifier, operator="ana")
    assert (first.status, first.replayed) == (ActionStatus.CONFIRMED, False)
    assert (again.status, again.replayed, again.receipt) == (
        ActionStatus.CONFIRMED,
        True,
        first.receipt,
    )
    assert asked.calls == 1  # a settled receipt is not verified again
    declined = await runner.execute(
        "charge",
        CountingOperation(DefinitiveFailure("declined")),
        request={"n": 2},
        idempotency_key="declined",
    )
    await runner.reopen(declined.receipt.action_id, operator="bo")
    await runner.reopen(declined.receipt.action_id, operator="bo")
    assert [r.outcome for r in reversed(await ledger.audit())] == [
        "CONFIRMED",
        "already CONFIRMED: nothing changed",
        "reopened",
        "already free: nothing changed",
    ]
    await closing(ledger)


async def test_a_receipt_keeps_its_records_whatever_copy_a_writer_holds(
    clocked: tuple[Any, ManualClock],
) -> None:
    ledger, clock = clocked
    declined = await ActionRunner(ledger).execute(
        "charge",
        CountingOperation(DefinitiveFailure("declined")),
        request={"n": 2},
        idempotency_key="declined",
    )
    held = await ledger.get(declined.receipt.action_id)
    assert held is not None
    assert held.operator_records == ()
    note = await ledger.append_audit(
        OperatorRecord("ana", "h", "verify", held.action_id, "", "looked", "FAILED")
    )
    assert (await ledger.get(held.action_id)).version == held.version  # not a new version
    # A writer still holding the copy read before the record (a concurrent
    # runner) writes the next version: the record stays on the receipt.
    clock.advance(1)
    now = clock()
    assert await ledger.retire(
        held.evolve(version=held.version + 1, retired_at=now, updated_at=now)
    )
    after = await ledger.get(held.action_id)
    assert after is not None
    assert after.retired_at is not None
    assert after.operator_records == (note,)


async def test_every_write_of_a_claim_keeps_its_operator_records(
    clocked: tuple[Any, ManualClock],
) -> None:
    """A takeover, a new attempt's start and the outcome each write the next version:
    none of them drops the records the ledger appended before."""
    ledger, clock = clocked
    left = await stranded(ledger)  # its worker's 30 s lease runs out below
    note = await ledger.append_audit(
        OperatorRecord("ana", "h", "verify", left.action_id, "", "looked", "PENDING")
    )
    clock.advance(60)
    settled = await execute(
        ActionRunner(ledger, owner="B", policy=RetryPolicy(max_attempts=2, retry_on_failed=True)),
        CountingOperation("ch_2"),
        verifier=fixed_verifier(fenced_absent(), confirmed()),
    )
    assert settled.taken_over
    assert settled.receipt.attempts == 2  # taken over, a new attempt started, its outcome
    stored = await ledger.get(left.action_id)
    assert stored is not None
    assert stored.version > left.version + 2
    assert stored.operator_records == (note,)


async def test_writes_from_a_copy_read_before_a_record_keep_it(
    clocked: tuple[Any, ManualClock],
) -> None:
    """Take over, start an attempt, record: each written from a copy that lacks the record."""
    ledger, clock = clocked
    left = await stranded(ledger)
    held = await ledger.get(left.action_id)  # read before the operator's record
    assert held is not None
    note = await ledger.append_audit(
        OperatorRecord("ana", "h", "verify", held.action_id, "", "looked", "PENDING")
    )
    clock.advance(60)
    now = clock()
    taken = held.evolve(
        owner="B", fencing_token=held.fencing_token + 1, version=held.version + 1, updated_at=now
    )
    second = AttemptRecord(number=2, started_at=now)
    started = taken.evolve(
        attempts=2,
        attempt_records=(*taken.attempt_records, second),
        version=taken.version + 1,
    )
    done = started.evolve(
        claim_state=ClaimState.COMPLETED,
        execution_status=ActionStatus.UNKNOWN,
        final_status=ActionStatus.UNKNOWN,
        version=started.version + 1,
    )
    writes: list[tuple[str, Callable[[], Awaitable[bool]]]] = [
        ("take_over", lambda: ledger.take_over(taken, lease=30.0)),
        ("start_attempt", lambda: ledger.start_attempt(started, lease=30.0)),
        ("record", lambda: ledger.record(done)),
    ]
    for verb, write in writes:
        assert await write(), verb
        stored = await ledger.get(held.action_id)
        assert stored is not None
        assert stored.operator_records == (note,), verb


async def test_a_receipt_carries_its_newest_records_and_the_audit_all(
    clocked: tuple[Any, ManualClock],
) -> None:
    ledger, clock = clocked
    lost = await unknown(ledger)
    action_id = lost.receipt.action_id

    async def note(n: int) -> OperatorRecord:
        clock.advance(1)
        record: OperatorRecord = await ledger.append_audit(
            OperatorRecord("ana", "h", "verify", action_id, "", f"look {n}", "UNKNOWN")
        )
        return record

    written = [await note(n) for n in range(MAX_RECEIPT_OPERATOR_RECORDS)]
    at_the_bound = await ledger.get(action_id)
    assert at_the_bound is not None
    assert list(at_the_bound.operator_records) == written
    written.append(await note(MAX_RECEIPT_OPERATOR_RECORDS))
    past_it = await ledger.get(action_id)
    assert past_it is not None
    assert list(past_it.operator_records) == written[1:]  # the oldest gives way
    assert len(await ledger.audit(action_id=action_id)) == MAX_RECEIPT_OPERATOR_RECORDS + 1


async def test_the_default_operator_is_the_os_user(new_ledger: Callable[[], Any]) -> None:
    ledger = new_ledger()
    lost = await unknown(ledger)
    await ActionRunner(ledger).recover_pending(lost.receipt.action_id, fixed_verifier(confirmed()))
    (record,) = await ledger.audit()
    assert record.operator == getpass.getuser()
    await closing(ledger)


async def test_the_sweep_records_each_claim_it_released_or_settled(
    clocked: tuple[Any, ManualClock],
) -> None:
    ledger, clock = clocked
    left = await stranded(ledger)  # its worker's 30 s lease runs out below
    never = await unstarted(ledger, "unstarted", owner="gone", lease=1.0)
    clock.advance(60)
    results = await ActionRunner(ledger).recover_stale(
        fixed_verifier(confirmed()), operator="sweeper", reason="nightly"
    )
    assert [r.status for r in results] == [ActionStatus.CONFIRMED]
    records = await ledger.audit()
    assert {(r.action_id, r.outcome) for r in records} == {
        (left.action_id, "CONFIRMED"),
        (never.action_id, "released (never started)"),
    }
    assert {(r.verb, r.operator, r.reason) for r in records} == {
        ("recover_stale", "sweeper", "nightly")
    }


async def test_a_refused_verb_is_recorded_as_refused_and_changes_nothing(
    new_ledger: Callable[[], Any],
) -> None:
    ledger = new_ledger()
    runner = ActionRunner(ledger)
    done = await runner.execute("charge", CountingOperation("ok"), request={}, idempotency_key="k")
    with pytest.raises(RecoveryRefusedError):
        await runner.release_unstarted(done.receipt.action_id, operator="dee")
    with pytest.raises(RecoveryRefusedError):
        await runner.reopen(done.receipt.action_id, operator="dee")
    assert await ledger.get(done.receipt.action_id) == done.receipt
    records = await ledger.audit()
    assert [r.verb for r in records] == ["reopen", "release_unstarted"]
    assert all(r.outcome.startswith("refused: ") for r in records)
    await closing(ledger)


@pytest.mark.parametrize(
    ("operator", "reason"),
    [
        ("", None),
        ("a" * 201, None),
        ("ana\nforged line", None),
        ("ana\x00", None),
        (7, None),
        ("ana", ""),
        ("ana", "x" * 2001),
        ("ana", 3),
    ],
)
async def test_a_bad_operator_or_reason_is_refused_before_anything_is_written(
    new_ledger: Callable[[], Any], operator: Any, reason: Any
) -> None:
    ledger = new_ledger()
    runner = ActionRunner(ledger)
    lost = await unknown(ledger)
    held = await unstarted(ledger, "held")
    verifier = fixed_verifier(confirmed())
    calls = [
        runner.recover_pending(lost.receipt.action_id, verifier, operator=operator, reason=reason),
        runner.recover_stale(verifier, operator=operator, reason=reason),
        runner.reopen(lost.receipt.action_id, operator=operator, reason=reason),
        runner.release_unstarted(held.action_id, operator=operator, reason=reason),
    ]
    for call in calls:
        with pytest.raises(InvalidArgumentError):
            await call
    assert await ledger.get(lost.receipt.action_id) == lost.receipt
    assert await ledger.get(held.action_id) == held
    assert await ledger.audit() == []
    await closing(ledger)


async def test_the_longest_operator_and_reason_are_kept_whole(
    new_ledger: Callable[[], Any],
) -> None:
    ledger = new_ledger()
    lost = await unknown(ledger)
    name, why = "o" * 200, "r" * 2000
    await ActionRunner(ledger).recover_pending(
        lost.receipt.action_id, fixed_verifier(confirmed()), operator=name, reason=why
    )
    (record,) = await ledger.audit()
    assert (record.operator, record.reason) == (name, why)
    await closing(ledger)


async def test_an_unknown_id_is_not_audited(new_ledger: Callable[[], Any]) -> None:
    ledger = new_ledger()
    with pytest.raises(ActionNotFoundError):
        await ActionRunner(ledger).recover_pending("0" * 32, fixed_verifier(confirmed()))
    assert await ledger.audit() == []
    await closing(ledger)


async def test_records_outlive_the_receipts_they_name(clocked: tuple[Any, ManualClock]) -> None:
    ledger, clock = clocked
    lost = await unknown(ledger)
    await ActionRunner(ledger).recover_pending(
        lost.receipt.action_id, fixed_verifier(fenced_absent()), operator="ana"
    )
    clock.advance(3600)
    deleted = await ledger.prune(older_than=60, statuses=(ActionStatus.FAILED,))
    assert deleted == 1
    assert await ledger.get(lost.receipt.action_id) is None
    (record,) = await ledger.audit(action_id=lost.receipt.action_id)
    assert record.outcome == "FAILED"


async def charged_an_hour_ago(ledger: Any, clock: ManualClock, count: int) -> None:
    """``count`` confirmed charges (keys k0, k1, ...), an hour old by the ledger's clock."""
    runner = ActionRunner(ledger)
    for n in range(count):
        await runner.execute(
            "charge", CountingOperation("ok"), request={"n": n}, idempotency_key=f"k{n}"
        )
    clock.advance(3600)


async def test_a_prune_through_the_api_is_audited(clocked: tuple[Any, ManualClock]) -> None:
    ledger, clock = clocked
    await charged_an_hour_ago(ledger, clock, 3)
    # A dry run deletes nothing and is not an operator verb: no record.
    assert await ledger.prune(older_than=60, dry_run=True) == 3
    assert await ledger.audit() == []
    # A bad name or reason is refused before anything is read or deleted.
    with pytest.raises(InvalidArgumentError):
        await ledger.prune(older_than=60, operator="bad\nname")
    with pytest.raises(InvalidArgumentError):
        await ledger.prune(older_than=60, reason=7)
    assert len(await ledger.receipts()) == 3
    assert await ledger.audit() == []
    assert await ledger.prune(older_than=60, operator="cy", reason="retention") == 3
    (record,) = await ledger.audit()
    assert (record.verb, record.operator, record.reason) == ("prune", "cy", "retention")
    assert (record.action_id, record.namespace) == (None, None)
    cutoff = (LEDGER_START + timedelta(seconds=3600 - 60)).isoformat()
    assert record.outcome == f"deleted 3 CONFIRMED,FAILED receipt(s) stored before {cutoff}"
    assert record.at == LEDGER_START + timedelta(seconds=3600)
    # A prune that finds nothing was still run by someone: recorded, with its count.
    assert await ledger.prune(older_than=60, namespace="tenant") == 0
    latest = (await ledger.audit(limit=1))[0]
    assert latest.operator == getpass.getuser()
    assert latest.namespace == "tenant"
    assert latest.outcome.startswith("deleted 0 ")


async def test_a_prune_cancelled_part_way_records_what_it_deleted(
    clocked: tuple[Any, ManualClock],
) -> None:
    ledger, clock = clocked
    await charged_an_hour_ago(ledger, clock, 5)
    shown: list[int] = []
    third = asyncio.Event()

    async def before_delete(batch: Any) -> None:
        shown.append(len(batch))
        if len(shown) == 3:
            third.set()
            await asyncio.Event().wait()  # Ctrl-C arrives while the third batch is exported

    prune = asyncio.create_task(
        ledger.prune(older_than=60, batch_size=1, before_delete=before_delete, operator="cy")
    )
    await third.wait()
    prune.cancel()
    with pytest.raises(asyncio.CancelledError):
        await prune
    assert len(await ledger.receipts()) == 3  # two batches went before the cancellation
    (record,) = await ledger.audit()
    assert (record.verb, record.operator) == ("prune", "cy")
    assert record.outcome.startswith("cancelled: CancelledError after deleting 2 ")
    # A prune cut off by a timeout is recorded too, then the timeout raised.
    shown.clear()
    third.clear()

    async def prune_until_the_third_batch() -> None:
        async with asyncio.timeout(None) as deadline:

            async def expire_at_the_third_batch() -> None:
                await third.wait()
                deadline.reschedule(asyncio.get_running_loop().time())

            expiring = asyncio.create_task(expire_at_the_third_batch())
            try:
                await ledger.prune(older_than=60, batch_size=1, before_delete=before_delete)
            finally:
                await expiring

    with pytest.raises(TimeoutError):
        await prune_until_the_third_batch()
    assert len(await ledger.receipts()) == 1  # the third batch was never deleted
    latest = (await ledger.audit(limit=1))[0]
    assert latest.outcome.startswith("cancelled: CancelledError after deleting 2 ")
    assert len(await ledger.audit()) == 2


async def test_a_verb_cancelled_while_it_runs_is_recorded_as_cancelled(
    new_ledger: Callable[[], Any],
) -> None:
    ledger = new_ledger()
    lost = await unknown(ledger)
    asking = asyncio.Event()

    async def slow_verifier(receipt: Any) -> Any:
        asking.set()
        await asyncio.Event().wait()

    recovering = asyncio.create_task(
        ActionRunner(ledger).recover_pending(lost.receipt.action_id, slow_verifier, operator="cy")
    )
    await asking.wait()
    recovering.cancel()
    with pytest.raises(asyncio.CancelledError):
        await recovering
    (record,) = await ledger.audit()
    assert (record.verb, record.operator, record.action_id) == (
        "recover",
        "cy",
        lost.receipt.action_id,
    )
    assert record.outcome == "cancelled: its write may have been made"
    await closing(ledger)


async def test_a_time_with_no_utc_value_is_refused_before_anything_is_read_or_written(
    clocked: tuple[Any, ManualClock],
) -> None:
    ledger, clock = clocked
    await ActionRunner(ledger).execute(
        "charge", CountingOperation("ok"), request={}, idempotency_key="k"
    )
    clock.advance(3600)
    east, west = timezone(timedelta(hours=5)), timezone(timedelta(hours=-5))
    # One microsecond inside Python's range in UTC, and one outside it.
    for outside, inside in (
        (datetime(1, 1, 1, 4, 59, 59, 999999, tzinfo=east), datetime(1, 1, 1, 5, tzinfo=east)),
        (datetime.max.replace(tzinfo=west), datetime.max.replace(tzinfo=UTC)),
    ):
        calls: tuple[Callable[[datetime], Awaitable[Any]], ...] = (
            lambda when: ledger.prune(completed_before=when, operator="cy"),
            lambda when: ledger.receipts(since=when),
            lambda when: ledger.audit(since=when),
        )
        for call in calls:
            with pytest.raises(InvalidArgumentError, match="has no UTC time"):
                await call(outside)
            await call(inside)
    assert len(await ledger.receipts()) == 0  # the prune up to datetime.max deleted it
    assert [r.outcome.split(" ")[:2] for r in await ledger.audit()] == [
        ["deleted", "1"],
        ["deleted", "0"],
    ]


async def test_the_listing_filters_at_its_exact_bounds(clocked: tuple[Any, ManualClock]) -> None:
    ledger, clock = clocked
    stamped = []
    for n, (who, space) in enumerate([("ana", ""), ("bo", "t1"), ("ana", "t1")]):
        record = OperatorRecord(who, "h", "prune", f"id{n}", space, None, f"deleted {n}")
        stamped.append(await ledger.append_audit(record))
        clock.advance(10)
    assert [r.at for r in stamped] == [LEDGER_START + timedelta(seconds=10 * n) for n in range(3)]
    assert await ledger.audit() == stamped[::-1]
    # since: at or after, to the microsecond, on both sides.
    at = stamped[1].at
    assert await ledger.audit(since=at) == stamped[:0:-1]
    assert await ledger.audit(since=at + timedelta(microseconds=1)) == [stamped[2]]
    assert await ledger.audit(since=at - timedelta(microseconds=1)) == stamped[:0:-1]
    assert await ledger.audit(operator="ana") == [stamped[2], stamped[0]]
    assert await ledger.audit(namespace="t1") == [stamped[2], stamped[1]]
    assert await ledger.audit(namespace="") == [stamped[0]]
    assert await ledger.audit(action_id="id1") == [stamped[1]]
    assert await ledger.audit(limit=1) == [stamped[2]]
    assert await ledger.audit(limit=100_000) == stamped[::-1]
    assert await ledger.audit(operator="x" * 1000, action_id="x" * 1000) == []  # the longest
    for bad in (
        {"limit": 0},
        {"limit": 100_001},
        {"limit": True},
        {"since": datetime(2031, 1, 1)},  # no time zone
        {"operator": ""},
        {"operator": "x" * 1001},
        {"namespace": 3},
        {"action_id": ""},
        {"action_id": 7},
        {"action_id": "x" * 1001},
    ):
        with pytest.raises(InvalidArgumentError):
            await ledger.audit(**bad)
    with pytest.raises(InvalidArgumentError):  # the ledger stamps the time
        await ledger.append_audit(stamped[0])


async def test_a_verb_done_but_not_audited_says_so_with_its_result() -> None:
    class NoAudit(InMemoryLedger):
        async def append_audit(self, record: OperatorRecord) -> OperatorRecord:
            raise ConnectionError("audit table unreachable")

    ledger = NoAudit()
    lost = await unknown(ledger)
    with pytest.raises(AuditNotRecordedError) as info:
        await ActionRunner(ledger).recover_pending(
            lost.receipt.action_id, fixed_verifier(confirmed()), operator="ana"
        )
    assert info.value.result.status is ActionStatus.CONFIRMED
    assert info.value.record.operator == "ana"
    stored = await ledger.get(lost.receipt.action_id)
    assert stored is not None
    assert stored.final_status is ActionStatus.CONFIRMED


async def test_a_sweep_whose_records_are_not_appended_settles_all_and_reports_them() -> None:
    # One record that cannot be appended stopped the sweep: the claims after
    # it were never looked at, and what it had settled was not reported.
    class AuditDown(InMemoryLedger):
        async def append_audit(self, record: OperatorRecord) -> OperatorRecord:
            raise ConnectionError("audit table unreachable")

    clock = ManualClock()
    ledger = AuditDown(clock=clock)
    held, running = asyncio.Event(), asyncio.Semaphore(0)

    async def hang() -> None:
        running.release()
        await held.wait()

    dead = ActionRunner(ledger, owner="dead", lease=30.0)
    hung = [
        asyncio.create_task(dead.execute("a", hang, request={}, idempotency_key=k))
        for k in ("s1", "s2", "s3")
    ]
    for _ in hung:
        await running.acquire()
    clock.advance(60)
    with pytest.raises(AuditNotRecordedError) as info:
        await ActionRunner(ledger, owner="sweeper", lease=30.0).recover_stale(operator="ana")
    assert "3 operator record(s) could not be appended" in str(info.value)
    assert info.value.record.operator == "ana"
    # The record named is the first one missing: the first claim settled.
    assert info.value.record.action_id == info.value.result[0].receipt.action_id
    assert [r.status for r in info.value.result] == [ActionStatus.UNKNOWN] * 3
    assert {r.receipt.idempotency_key for r in info.value.result} == {"s1", "s2", "s3"}
    assert all(r.claim_state is ClaimState.COMPLETED for r in ledger.snapshot())
    for task in hung:
        task.cancel()
    await asyncio.gather(*hung, return_exceptions=True)


def test_the_sync_runner_passes_the_operator_on(tmp_path: Path) -> None:
    path = tmp_path / "ledger.sqlite3"

    async def make() -> str:
        async with SQLiteLedger(path) as ledger:
            return (await unknown(ledger)).receipt.action_id  # type: ignore[no-any-return]

    action_id = asyncio.run(make())
    runner = SyncActionRunner(SQLiteLedger(path))
    try:
        runner.recover_pending(action_id, fixed_verifier(confirmed()), operator="sync", reason="r")
    finally:
        runner.close()

    async def read() -> list[OperatorRecord]:
        async with SQLiteLedger(path) as ledger:
            return await ledger.audit()

    (record,) = asyncio.run(read())
    assert (record.operator, record.reason, record.outcome) == ("sync", "r", "CONFIRMED")
