"""Leases, takeover and fencing through the runner: what a caller sees.

The ledger-level rules are in the contract (``dataoad.testing.LeaseContract``);
the runner machine races them. These are the fixed scenarios, each on the
in-memory ledger with a clock of its own (the ledger's clock alone judges
leases), and the clock-skew checks on SQLite and PostgreSQL.
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

import dataoad._clock as clock_module
from dataoad import (
    ActionInProgressError,
    ActionRunner,
    ActionStatus,
    ClaimFencedError,
    DefinitiveFailure,
    InMemoryLedger,
    InvalidArgumentError,
    NothingInvokedError,
    RetryPolicy,
    SQLiteLedger,
    SyncActionRunner,
    current_attempt,
)
from dataoad._leases import RENEWAL_TASK_NAME
from dataoad.testing import FaultyLedger, LedgerFault, LedgerFaultError, ManualClock
from suite_support import skew_wall_clock
from suite_support.leases import (
    LEASE,
    REQUEST,
    Crash,
    absent_retry_safe,
    confirmed_by,
    counting,
    crash_after_start,
    crash_before_start,
    paused_holder,
)
from suite_support.services import postgres_dsn, unique_table


async def test_a_live_claim_is_in_progress_and_an_expired_unstarted_one_is_run_by_the_taker() -> (
    None
):
    clock = ManualClock()
    ledger = InMemoryLedger(clock=clock)
    dead = ActionRunner(ledger, owner="A", lease=LEASE)
    action_id = await crash_before_start(ledger, dead)
    taker = ActionRunner(ledger, owner="B", lease=LEASE)
    op = counting()
    clock.advance(LEASE - 1)
    with pytest.raises(ActionInProgressError):
        await taker.execute("charge", op, request=REQUEST, idempotency_key="k")
    clock.advance(1)
    result = await taker.execute("charge", op, request=REQUEST, idempotency_key="k")
    assert result.taken_over is True
    assert result.status is ActionStatus.CONFIRMED
    assert op.calls == [1]
    assert result.receipt.action_id == action_id
    assert result.receipt.owner == "B"
    assert result.receipt.fencing_token == 2
    assert result.receipt.lease_expires_at is None  # completed
    replay = await taker.execute("charge", op, request=REQUEST, idempotency_key="k")
    assert replay.replayed
    assert replay.taken_over is False
    assert op.calls == [1]


async def test_an_expired_started_claim_without_a_verifier_completes_unknown_uninvoked() -> None:
    clock = ManualClock()
    ledger = InMemoryLedger(clock=clock)
    await crash_after_start(ActionRunner(ledger, owner="A"))
    clock.advance(LEASE)
    op = counting()
    result = await ActionRunner(ledger, owner="B").execute(
        "charge", op, request=REQUEST, idempotency_key="k", policy=RetryPolicy(max_attempts=3)
    )
    assert op.calls == []
    assert result.taken_over
    assert result.status is ActionStatus.UNKNOWN
    assert result.receipt.attempts == 1
    assert result.receipt.recovery is not None
    assert result.receipt.recovery.method == "take_over"


async def test_an_expired_started_claim_is_settled_by_bound_evidence_only() -> None:
    clock = ManualClock()
    ledger = InMemoryLedger(clock=clock)

    async def dies() -> None:
        raise Crash

    for key in ("bound", "unbound"):
        with pytest.raises(Crash):
            await ActionRunner(ledger, owner="A").execute(
                "charge", dies, request=REQUEST, idempotency_key=key, provider_reference=key
            )
    clock.advance(LEASE)
    op = counting()
    taker = ActionRunner(ledger, owner="B")
    confirmed = await taker.execute(
        "charge",
        op,
        request=REQUEST,
        idempotency_key="bound",
        provider_reference="bound",
        verifier=confirmed_by("bound"),
    )
    assert confirmed.status is ActionStatus.CONFIRMED
    assert confirmed.taken_over
    # A confirmation of some other reference proves nothing about this claim.
    other = await taker.execute(
        "charge",
        op,
        request=REQUEST,
        idempotency_key="unbound",
        provider_reference="unbound",
        verifier=confirmed_by("elsewhere"),
    )
    assert other.status is ActionStatus.UNKNOWN
    assert op.calls == []


async def test_a_taken_over_attempt_is_retried_only_on_retry_safe_absence_and_policy() -> None:
    clock = ManualClock()
    ledger = InMemoryLedger(clock=clock)

    async def dies() -> None:
        raise Crash

    with pytest.raises(Crash):
        await ActionRunner(ledger, owner="A").execute(
            "charge", dies, request=REQUEST, idempotency_key="k", provider_reference="ref"
        )
    clock.advance(LEASE)
    op = counting()
    # Retry-safe absence, but a policy that does not retry: settled FAILED, not invoked.
    failed = await ActionRunner(ledger, owner="B").execute(
        "charge",
        op,
        request=REQUEST,
        idempotency_key="k",
        provider_reference="ref",
        verifier=absent_retry_safe("ref"),
    )
    assert failed.status is ActionStatus.FAILED
    assert op.calls == []
    with pytest.raises(Crash):
        await ActionRunner(ledger, owner="A").execute(
            "charge", dies, request=REQUEST, idempotency_key="k2", provider_reference="ref2"
        )
    clock.advance(LEASE)
    retried = await ActionRunner(ledger, owner="B").execute(
        "charge",
        op,
        request=REQUEST,
        idempotency_key="k2",
        provider_reference="ref2",
        verifier=absent_retry_safe("ref2"),
        policy=RetryPolicy(max_attempts=2, retry_on_failed=True),
    )
    assert op.calls == [1]
    assert retried.taken_over
    assert retried.receipt.attempts == 2
    assert retried.receipt.attempt_records[0].verification_status is ActionStatus.FAILED
    assert retried.receipt.attempt_records[0].retry_decision == "retry"
    # The verifier's read-back after the return decides: still absent, so not CONFIRMED.
    assert retried.status is ActionStatus.FAILED


async def test_a_zombie_is_fenced_and_its_success_is_kept_as_evidence() -> None:
    clock = ManualClock()
    ledger = InMemoryLedger(clock=clock)
    zombie = await paused_holder(ActionRunner(ledger, owner="A"))
    clock.advance(LEASE)  # A is paused past its lease (a GC pause, a partition)
    taker_op = counting()
    taken = await ActionRunner(ledger, owner="B").execute(
        "charge", taker_op, request=REQUEST, idempotency_key="k"
    )
    assert taken.status is ActionStatus.UNKNOWN
    assert taker_op.calls == []
    zombie.finish.set()
    with pytest.raises(ClaimFencedError) as info:
        await zombie.task
    error = info.value
    assert error.operation_invoked is True
    assert error.observed_status is ActionStatus.CONFIRMED
    assert error.receipt is not None
    stored = await ledger.get(error.receipt.action_id)
    assert stored is not None
    assert stored.owner == "B"  # the zombie never overwrote the new owner's record
    assert stored.attempt_records[0].execution_status is ActionStatus.CONFIRMED
    assert stored.final_status is ActionStatus.CONFIRMED  # its success is evidence


async def test_a_zombie_fenced_before_its_retry_starts_invokes_nothing_more() -> None:
    clock = ManualClock()
    ledger = InMemoryLedger(clock=clock)
    gate = asyncio.Event()
    original = ledger.start_attempt

    async def paused_start(receipt: Any, **lease: Any) -> bool:
        if receipt.owner == "A":
            await gate.wait()
        return await original(receipt, **lease)

    ledger.start_attempt = paused_start  # type: ignore[method-assign]
    calls = 0

    async def declines_retryably() -> None:
        nonlocal calls
        calls += 1
        raise DefinitiveFailure("declined", retryable=True)

    zombie = asyncio.create_task(
        ActionRunner(ledger, owner="A").execute(
            "charge",
            declines_retryably,
            request=REQUEST,
            idempotency_key="k",
            policy=RetryPolicy(max_attempts=2, retry_on_failed=True),
        )
    )
    await asyncio.sleep(0.01)  # attempt 1 ran; attempt 2's start is paused
    assert calls == 1
    clock.advance(LEASE)
    taken = await ActionRunner(ledger, owner="B").execute(
        "charge", declines_retryably, request=REQUEST, idempotency_key="k"
    )
    assert taken.taken_over
    assert calls == 1  # a started claim is settled read-only by its taker
    gate.set()
    with pytest.raises(ClaimFencedError) as info:
        await zombie
    assert info.value.operation_invoked is True  # attempt 1 ran, attempt 2 never did
    assert calls == 1


async def test_the_runner_renews_its_lease_while_the_attempt_runs() -> None:
    ledger = InMemoryLedger()
    release = asyncio.Event()

    async def long_charge() -> str:
        await release.wait()
        return "ch"

    holder = asyncio.create_task(
        ActionRunner(ledger, owner="A", lease=0.3).execute(
            "charge", long_charge, request=REQUEST, idempotency_key="k"
        )
    )
    await asyncio.sleep(1.0)  # more than three leases: only renewals keep the claim
    other = counting()
    with pytest.raises(ActionInProgressError):
        await ActionRunner(ledger, owner="B", lease=0.3).execute(
            "charge", other, request=REQUEST, idempotency_key="k"
        )
    release.set()
    result = await holder
    assert result.status is ActionStatus.CONFIRMED
    assert other.calls == []


async def test_an_attempt_shorter_than_a_third_of_the_lease_starts_no_renewal_task() -> None:
    """The renewals start on a timer: a quick attempt costs no task; a long one is renewed."""

    def renewal_tasks() -> list[str]:
        return [
            t.get_name() for t in asyncio.all_tasks() if t.get_name().startswith(RENEWAL_TASK_NAME)
        ]

    seen: dict[str, list[str]] = {}

    async def quick() -> str:
        await asyncio.sleep(0.05)
        seen["quick"] = renewal_tasks()
        return "ch"

    async def slow() -> str:
        await asyncio.sleep(0.15)  # past a third of the 0.3 s lease
        seen["slow"] = renewal_tasks()
        return "ch"

    # The quick call's lease is long (its renewal timer is 1 s away): a loop
    # woken late from the 50 ms sleep must not run that timer first.
    ledger = InMemoryLedger()
    await ActionRunner(ledger, owner="A", lease=3.0).execute(
        "charge", quick, request=REQUEST, idempotency_key="quick"
    )
    runner = ActionRunner(ledger, owner="A", lease=0.3)
    await runner.execute("charge", slow, request=REQUEST, idempotency_key="slow")
    assert seen["quick"] == []
    assert len(seen["slow"]) == 1
    assert renewal_tasks() == []  # ended with its attempt


class RefusesRenewals(FaultyLedger):
    """Answers every renewal with a refusal (the claim was fenced); ``calls`` records each."""

    async def renew(self, action_id: str, fencing_token: int, lease: float) -> bool:
        await self._fault("renew")
        return False


def renewals(ledger: FaultyLedger) -> int:
    """How many renewals the runner asked ``ledger`` for."""
    return ledger.calls.count("renew")


async def test_the_first_renewal_comes_at_a_third_of_the_lease_not_later() -> None:
    # Lease 0.6 s: renewals at 0.2 s and 0.4 s. An attempt of 0.3 s sees exactly
    # the first; a timer that started the task with a pause first would renew at 0.4 s.
    ledger = FaultyLedger(InMemoryLedger())
    renewals_seen: list[int] = []

    async def slow() -> str:
        await asyncio.sleep(0.3)
        renewals_seen.append(renewals(ledger))
        return "ch"

    runner = ActionRunner(ledger, owner="A", lease=0.6)
    await runner.execute("charge", slow, request=REQUEST, idempotency_key="k")
    assert renewals_seen == [1]


async def test_a_runner_clock_renews_only_after_its_first_pause() -> None:
    # On a clock of the runner's own the renewal task starts with the attempt
    # and pauses a third of the lease first: no renewal before that pause.
    ledger = FaultyLedger(InMemoryLedger())
    renewals_at_pause: list[int] = []

    class HeldClock:
        def monotonic(self) -> float:
            return 0.0

        async def sleep(self, seconds: float) -> None:
            renewals_at_pause.append(renewals(ledger))
            await asyncio.Event().wait()  # cancelled with the attempt

    async def charge() -> str:
        for _ in range(20):
            await asyncio.sleep(0)  # the renewal task runs up to its pause
        return "ch"

    runner = ActionRunner(ledger, owner="A", lease=LEASE, clock=HeldClock())
    await runner.execute("charge", charge, request=REQUEST, idempotency_key="k")
    assert renewals_at_pause == [0]
    assert renewals(ledger) == 0


async def test_a_refused_renewal_reports_the_held_claim_as_fenced_at_warning() -> None:
    ledger = RefusesRenewals(InMemoryLedger())
    events: list[Any] = []

    class Collect:
        def on_event(self, event: Any) -> None:
            events.append(event)

    async def slow() -> str:
        await asyncio.sleep(0.25)  # past the first renewal at 0.1 s
        return "ch"

    runner = ActionRunner(ledger, owner="A", lease=0.3, observers=[Collect()])
    result = await runner.execute("charge", slow, request=REQUEST, idempotency_key="k")
    fenced = [e for e in events if e.kind.value == "fenced"]
    assert renewals(ledger) == 1  # a refusal ends the renewals: the write will say why
    assert len(fenced) == 1
    assert fenced[0].receipt is not None
    assert fenced[0].receipt.action_id == result.receipt.action_id
    assert fenced[0].receipt.owner == "A"
    assert fenced[0].level == logging.WARNING


async def test_a_renewal_task_that_raised_never_replaces_the_attempts_outcome() -> None:
    # A renewal that fails (here: the runner's clock raises) is a lost renewal,
    # never the attempt's outcome: the operation ran and its outcome is recorded.
    class BrokenClock:
        def monotonic(self) -> float:
            return 0.0

        async def sleep(self, seconds: float) -> None:
            raise RuntimeError("clock broke")

    op = counting()

    async def charge() -> str:
        await asyncio.sleep(0.01)  # the renewal task fails meanwhile
        return str(await op())

    runner = ActionRunner(InMemoryLedger(), owner="A", lease=LEASE, clock=BrokenClock())
    result = await runner.execute("charge", charge, request=REQUEST, idempotency_key="k")
    assert result.status is ActionStatus.CONFIRMED
    assert len(op.calls) == 1


async def test_current_attempt_tells_sync_and_async_operations_their_fence() -> None:
    seen: list[Any] = []

    async def async_op() -> str:
        seen.append(current_attempt())
        return "ok"

    def sync_op() -> str:
        seen.append(current_attempt())
        return "ok"

    assert current_attempt() is None
    runner = ActionRunner(InMemoryLedger(), owner="A")
    await runner.execute(
        "charge", async_op, request=REQUEST, idempotency_key="a", provider_reference="r"
    )
    await runner.execute("charge", sync_op, request=REQUEST, idempotency_key="s")
    assert [(c.idempotency_key, c.attempt, c.fencing_token) for c in seen] == [
        ("a", 1, 1),
        ("s", 1, 1),
    ]
    assert seen[0].provider_reference == "r"
    assert current_attempt() is None
    # It names the action each ran under, as its receipt does.
    ids = [(await runner.ledger.find("charge", key)) for key in ("a", "s")]
    assert [(c.action_id, c.action_name) for c in seen] == [
        (r.action_id, "charge") for r in ids if r is not None
    ]
    assert len({c.action_id for c in seen}) == 2


def test_current_attempt_tells_a_sync_runners_operation_its_fence() -> None:
    seen: list[Any] = []

    def sync_op() -> str:
        seen.append(current_attempt())
        return "ok"

    with SyncActionRunner(InMemoryLedger()) as sync_runner:
        sync_runner.execute("charge", sync_op, request=REQUEST, idempotency_key="t")
    assert [(c.idempotency_key, c.attempt, c.fencing_token) for c in seen] == [("t", 1, 1)]
    assert current_attempt() is None


async def test_recover_stale_settles_every_expired_claim_without_invoking() -> None:
    clock = ManualClock()
    ledger = InMemoryLedger(clock=clock)
    dead = ActionRunner(ledger, owner="A")
    await crash_after_start(dead, key="started")
    unstarted = await crash_before_start(ledger, dead)
    live = ActionRunner(ledger, owner="L")
    await live.execute("charge", counting(), request=REQUEST, idempotency_key="done")
    sweeper = ActionRunner(ledger, owner="S")
    assert await sweeper.recover_stale() == []  # nothing has expired yet
    clock.advance(LEASE)
    results = await sweeper.recover_stale()
    assert [r.receipt.idempotency_key for r in results] == ["started"]
    assert results[0].status is ActionStatus.UNKNOWN
    assert results[0].taken_over
    assert await ledger.get(unstarted) is None  # released: nothing ever ran
    assert await ledger.receipts(pending=True) == []


async def test_a_faulted_ledger_can_be_swept_and_its_listing_faulted() -> None:
    clock = ManualClock()
    inner = InMemoryLedger(clock=clock)
    await crash_after_start(ActionRunner(inner, owner="A"), key="started")
    clock.advance(LEASE)
    faulty = FaultyLedger(inner)
    faulty.inject("receipts", LedgerFault.FAIL_BEFORE_WRITE)
    sweeper = ActionRunner(faulty, owner="S")
    # The ledger's error reaches the caller as Dataoad's own, never raw (its cause kept).
    with pytest.raises(NothingInvokedError) as raised:
        await sweeper.recover_stale()
    assert isinstance(raised.value.__cause__, LedgerFaultError)
    assert len(await inner.receipts(pending=True)) == 1  # the failed listing changed nothing
    results = await sweeper.recover_stale()
    assert [r.receipt.idempotency_key for r in results] == ["started"]
    assert "receipts" in faulty.calls


async def test_progress_a_stranded_claim_is_settled_within_one_lease_and_one_sweep() -> None:
    """Progress: after any crash, one lease and one sweep leave no PENDING claim."""

    clock = ManualClock()
    ledger = InMemoryLedger(clock=clock)
    dead = ActionRunner(ledger, owner="A")
    for key in ("a", "b", "c"):
        await crash_after_start(dead, key=key)
    clock.advance(LEASE)
    await ActionRunner(ledger, owner="S").recover_stale(limit=100)
    assert await ledger.receipts(pending=True) == []


@pytest.mark.parametrize("lease", [0, -1, math.nan, math.inf, "30", True, 86_401, [1]], ids=repr)
def test_bad_leases_are_refused_before_anything(lease: Any) -> None:
    with pytest.raises(InvalidArgumentError, match="lease"):
        ActionRunner(InMemoryLedger(), lease=lease)


# Plain ids: mutmut cannot select a test whose id holds a lone surrogate.
@pytest.mark.parametrize(
    "owner",
    ["", 3, "x" * 201, "a\ud800"],
    ids=["empty", "not a str", "too long", "lone surrogate"],
)
def test_bad_owners_are_refused(owner: Any) -> None:
    with pytest.raises(InvalidArgumentError, match="owner"):
        ActionRunner(InMemoryLedger(), owner=owner)


def test_a_ledger_without_leases_needs_lease_none() -> None:
    class OldLedger:
        async def claim(self, receipt: Any) -> Any: ...
        async def get(self, action_id: str) -> Any: ...
        async def find(self, name: str, key: str) -> Any: ...
        async def start_attempt(self, receipt: Any) -> Any: ...
        async def record(self, receipt: Any) -> Any: ...
        async def release(self, action_id: str, version: int) -> Any: ...
        async def close(self) -> None: ...

    with pytest.raises(InvalidArgumentError, match="lease=None"):
        ActionRunner(OldLedger())  # type: ignore[arg-type]
    assert ActionRunner(OldLedger(), lease=None).lease is None  # type: ignore[arg-type]


async def test_recover_stale_refuses_a_bad_limit_before_the_ledger() -> None:
    runner = ActionRunner(InMemoryLedger())
    for bad in (0, -1, 10_001, 1.5, "5"):
        with pytest.raises(InvalidArgumentError, match="limit"):
            await runner.recover_stale(limit=bad)  # type: ignore[arg-type]


async def test_a_worker_clock_far_ahead_never_takes_a_live_sqlite_claim(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Skew: only the ledger's clock decides; a taker whose own clock is an hour ahead waits."""
    ledger_clock = ManualClock()

    async with SQLiteLedger(tmp_path / "l.sqlite3", clock=ledger_clock) as ledger:
        await crash_after_start(ActionRunner(ledger, owner="A"))
    real = clock_module.utc_now
    skewed = skew_wall_clock(monkeypatch, lambda: real().replace(year=2099))
    assert {"dataoad._leases", "dataoad._attempts", "dataoad._settled"} <= skewed
    async with SQLiteLedger(tmp_path / "l.sqlite3", clock=ledger_clock) as ledger:
        with pytest.raises(ActionInProgressError):
            await ActionRunner(ledger, owner="B").execute(
                "charge", counting(), request=REQUEST, idempotency_key="k"
            )
        ledger_clock.advance(LEASE)
        taken = await ActionRunner(ledger, owner="B").execute(
            "charge", counting(), request=REQUEST, idempotency_key="k"
        )
        assert taken.taken_over


async def test_postgres_judges_leases_by_the_server_clock(monkeypatch: pytest.MonkeyPatch) -> None:
    """Skew on PostgreSQL: clients whose clocks are a day ahead or behind change nothing."""
    from dataoad import PostgresLedger

    dsn, table = postgres_dsn(), unique_table()

    async with PostgresLedger(dsn, table=table) as ledger:
        await ledger.migrate()
        await crash_after_start(ActionRunner(ledger, owner="A", lease=1.0))
        real = clock_module.utc_now
        for skew_years in (1, -1):

            def skewed_now(years: int = skew_years) -> datetime:
                return real().replace(year=real().year + years)

            skewed = skew_wall_clock(monkeypatch, skewed_now)
            assert {"dataoad._leases", "dataoad._attempts", "dataoad._settled"} <= skewed
            with pytest.raises(ActionInProgressError):
                await ActionRunner(ledger, owner="B", lease=1.0).execute(
                    "charge", counting(), request=REQUEST, idempotency_key="k"
                )
        await asyncio.sleep(1.2)  # the server's clock passes the lease
        taken = await ActionRunner(ledger, owner="B", lease=1.0).execute(
            "charge", counting(), request=REQUEST, idempotency_key="k"
        )
        assert taken.taken_over
        assert taken.status is ActionStatus.UNKNOWN


def test_the_cli_lists_and_sweeps_stale_claims(tmp_path: Path) -> None:
    """`receipts list --stale` shows expired claims; `recover --stale --yes` settles them."""
    import subprocess
    import sys
    import time

    path = tmp_path / "ledger.sqlite3"

    async def strand() -> None:
        async with SQLiteLedger(path) as ledger:
            # A third of 0.6 s to prove the lease, against a loaded machine's commit.
            await crash_after_start(ActionRunner(ledger, owner="A", lease=0.6), key="s")
            await ActionRunner(ledger).execute(
                "charge", counting(), request=REQUEST, idempotency_key="done"
            )

    asyncio.run(strand())

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "dataoad", *args, "--ledger", str(path)],
            capture_output=True,
            text=True,
            check=False,
            stdin=subprocess.DEVNULL,
        )

    time.sleep(0.7)
    listed = cli("receipts", "list", "--stale", "--json")
    assert listed.returncode == 0, listed.stderr
    assert [r["idempotency_key"] for r in json.loads(listed.stdout)] == ["s"]
    refused = cli("recover", "--stale")
    assert refused.returncode == 2  # no terminal to confirm on, and no --yes
    both = cli("recover", "deadbeef", "--stale", "--yes")
    assert both.returncode == 2
    swept = cli("recover", "--stale", "--yes")
    assert swept.returncode == 3, swept.stderr  # settled, but UNKNOWN without a verifier
    assert "UNKNOWN" in swept.stdout
    after = cli("receipts", "list", "--stale", "--json")
    assert json.loads(after.stdout) == []


@pytest.mark.parametrize("honours_fencing", [True, False])
async def test_a_provider_that_honours_fencing_refuses_the_zombies_late_request(
    honours_fencing: bool,
) -> None:
    """The zombie's charge, sent after a takeover and a retry, lands only without fencing."""
    from dataoad.testing import FakePaymentProvider, PaymentVerifier

    clock = ManualClock()
    ledger = InMemoryLedger(clock=clock)
    provider = FakePaymentProvider()
    paused = asyncio.Event()
    resume = asyncio.Event()

    async def charge() -> Any:
        attempt = current_attempt()
        assert attempt is not None
        token = attempt.fencing_token if honours_fencing else None
        if attempt.fencing_token == 1:
            paused.set()
            await resume.wait()  # a GC pause: the lease runs out meanwhile
        return await provider.charge(
            customer_id="c", amount_cents=100, client_reference="order-1", fencing_token=token
        )

    call: dict[str, Any] = {
        "request": REQUEST,
        "idempotency_key": "order-1",
        "provider_reference": "order-1",
        "verifier": PaymentVerifier(provider),
        "policy": RetryPolicy(max_attempts=2, retry_on_failed=True),
    }
    zombie = asyncio.create_task(ActionRunner(ledger, owner="A").execute("charge", charge, **call))
    await paused.wait()
    clock.advance(LEASE)
    taken = await ActionRunner(ledger, owner="B").execute("charge", charge, **call)
    assert taken.taken_over
    assert taken.status is ActionStatus.CONFIRMED  # verified absent, retried, charged once
    resume.set()
    with pytest.raises(ClaimFencedError):
        await zombie
    if honours_fencing:
        assert len(provider.charges) == 1
        assert provider.fenced_refusals == 1
    else:
        # Exactly the limit leases cannot lift: a provider that ignores fencing
        # accepts the zombie's late request.
        assert len(provider.charges) == 2


async def test_a_sweep_settles_a_stale_claim_that_gained_evidence_after_it_was_listed() -> None:
    """Between the sweep's listing and its takeover, a fenced zombie merges its outcome into
    the claim (a new version, the same holder, the same expired lease): the sweep takes the
    claim over from what is stored, instead of leaving a claim that was stale behind."""
    clock = ManualClock()

    class MergesBeforeTheFirstTakeover(InMemoryLedger):
        merged = False

        async def take_over(self, receipt: Any, *, lease: float) -> bool:
            if not self.merged:
                self.merged = True
                stored = await self.get(receipt.action_id)
                assert stored is not None
                merged = stored.evolve(
                    version=stored.version + 1,
                    metadata={**stored.metadata, "zombie": "ch_1"},
                )
                assert await self.record(merged)
            return await super().take_over(receipt, lease=lease)

    ledger = MergesBeforeTheFirstTakeover(clock=clock)
    await crash_after_start(ActionRunner(ledger, owner="A"), key="started")
    clock.advance(LEASE)
    results = await ActionRunner(ledger, owner="S").recover_stale()
    assert ledger.merged
    assert [r.receipt.idempotency_key for r in results] == ["started"]
    assert await ledger.receipts(pending=True) == []


async def test_a_lease_is_renewed_three_times_per_lease() -> None:
    """The docs: renewed three times per lease, so a lease survives two lost renewals."""

    class SteppedClock:
        """The runner's clock: records each sleep and holds it until the test lets go."""

        def __init__(self) -> None:
            self.sleeps: list[float] = []
            self.asked = asyncio.Event()

        def monotonic(self) -> float:
            return 0.0

        async def sleep(self, seconds: float) -> None:
            self.sleeps.append(seconds)
            self.asked.set()
            await asyncio.Event().wait()  # cancelled with the attempt

    clock = SteppedClock()

    async def charge() -> str:
        await clock.asked.wait()
        return "ch_1"

    runner = ActionRunner(InMemoryLedger(), owner="A", lease=LEASE, clock=clock)
    result = await runner.execute("charge", charge, request=REQUEST, idempotency_key="k")
    assert result.status is ActionStatus.CONFIRMED
    assert clock.sleeps == [LEASE / 3]


async def test_a_renewal_extends_the_lease_by_a_whole_lease_from_the_ledgers_now() -> None:
    ledger_clock = ManualClock()
    ledger = InMemoryLedger(clock=ledger_clock)
    start = ledger_clock()
    renewed = asyncio.Event()

    class OneRenewal:
        """The runner's clock: a third of the lease passes once, then it holds."""

        def __init__(self) -> None:
            self.slept = 0

        def monotonic(self) -> float:
            return 0.0

        async def sleep(self, seconds: float) -> None:
            self.slept += 1
            if self.slept == 1:
                ledger_clock.advance(seconds)
                return
            renewed.set()
            await asyncio.Event().wait()  # cancelled with the attempt

    seen: list[Any] = []

    async def charge() -> str:
        before = await ledger.find("charge", "k")
        assert before is not None
        seen.append(before.lease_expires_at)
        await renewed.wait()
        after = await ledger.find("charge", "k")
        assert after is not None
        seen.append(after.lease_expires_at)
        return "ch_1"

    runner = ActionRunner(ledger, owner="A", lease=LEASE, clock=OneRenewal())
    await runner.execute("charge", charge, request=REQUEST, idempotency_key="k")
    assert seen == [
        start + timedelta(seconds=LEASE),
        start + timedelta(seconds=LEASE / 3 + LEASE),
    ]
