"""Small helpers shared by the example-based tests."""

from __future__ import annotations

import asyncio
import fcntl
import os
import sys
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from dataoad import (
    ActionPersistenceError,
    ActionReceipt,
    ActionRunner,
    ActionStatus,
    DefinitiveFailure,
    EventKind,
    InMemoryLedger,
    RunnerEvent,
    VerificationHealth,
    VerificationResult,
)
from dataoad import _clock as clock_module
from dataoad._receipt import utc_now
from dataoad.testing import FaultyLedger, LedgerFault, unstarted_claim

FAIL = LedgerFault.FAIL_BEFORE_WRITE
LOSE = LedgerFault.LOSE_ACKNOWLEDGEMENT

REF = "order-1"
REQUEST: dict[str, Any] = {"customer_id": "c1", "amount_cents": 2500}
#: Where the ``clocked`` fixture's ledger clock starts: far from this host's,
#: so that a time stamped by the host's clock would show.
LEDGER_START = datetime(2031, 3, 1, 8, 0, tzinfo=UTC)


class CountingOperation:
    """An operation that counts its calls and follows a script of behaviours."""

    def __init__(self, *script: Any) -> None:
        # Each entry: an exception instance to raise, or a value to return.
        self.script = list(script)
        self.calls = 0

    async def __call__(self) -> Any:
        self.calls += 1
        step = self.script.pop(0) if self.script else "ok"
        if isinstance(step, BaseException):
            raise step
        return step


def confirmed(ref: str = REF, rid: str | None = "pr_1", value: Any = None) -> VerificationResult:
    if value is None:
        return VerificationResult.confirmed(
            verified_provider_reference=ref, provider_request_id=rid
        )
    return VerificationResult.confirmed(
        verified_provider_reference=ref, provider_request_id=rid, value=value
    )


def fenced_absent(ref: str = REF) -> VerificationResult:
    return VerificationResult.absent(verified_provider_reference=ref, retry_safe=True)


def fixed_verifier(*results: Any) -> Callable[[Any], Any]:
    """A verifier returning (or raising) the given results in turn; counts calls."""
    queue = list(results)
    calls: list[Any] = []

    def verify(receipt: Any) -> Any:
        calls.append(receipt)
        item = queue.pop(0) if len(queue) > 1 else queue[0]
        if isinstance(item, BaseException):
            raise item
        return item

    verify.calls = calls  # type: ignore[attr-defined]
    return verify


#: The ways to run an action: the runner itself, the decorator on an async
#: function, the sync facade, and the decorator on a sync function.
FRONT_ENDS = ("execute", "decorator", "sync", "sync-decorator")
#: The same, and again with the operation turned into a plain (sync)
#: function, for each front end that takes an operation (the async
#: decorator's body is the operation, and is async by definition): the
#: runner must treat both kinds alike.
SYNC_OPERATION = "+sync operation"
FRONT_ENDS_AND_OPERATION_KINDS = FRONT_ENDS + tuple(
    f + SYNC_OPERATION for f in FRONT_ENDS if f != "decorator"
)


def as_sync_operation(operation: Any) -> Callable[[], Any]:
    """``operation`` as a plain function, run off the loop; a coroutine it makes runs to its end there."""
    import inspect

    def sync_operation() -> Any:
        value = operation()
        if inspect.isawaitable(value):

            async def finish() -> Any:
                return await value

            return asyncio.run(finish())
        return value

    return sync_operation


async def call_via(
    front_end: str, runner: Any, action_name: str, operation: Any, **kwargs: Any
) -> Any:
    """Run one action through ``front_end``; same arguments as ``ActionRunner.execute``."""
    import functools
    import inspect

    from dataoad import SyncActionRunner, guarded

    if front_end.endswith(SYNC_OPERATION):
        front_end = front_end.removesuffix(SYNC_OPERATION)
        operation = as_sync_operation(operation)

    if front_end == "execute":
        return await runner.execute(action_name, operation, **kwargs)
    if front_end in ("decorator", "sync-decorator"):
        request = kwargs.pop("request")
        key = kwargs.pop("idempotency_key")
        reference = kwargs.pop("provider_reference", None)
        options = {
            "request": lambda: request,
            "idempotency_key": lambda: key,
            "provider_reference": lambda: reference,
            "verifier": kwargs.pop("verifier", None),
            "policy": kwargs.pop("policy", None),
            "risk": kwargs.pop("risk", None),
            "wait_in_progress": kwargs.pop("wait_in_progress", None),
        }
        assert not kwargs, f"unsupported in this shim: {sorted(kwargs)}"
        if front_end == "decorator":

            async def guarded_async() -> Any:
                value = operation()
                return await value if inspect.isawaitable(value) else value

            return await guarded(action_name, runner=runner, **options)(guarded_async)()

        def guarded_sync() -> Any:
            return operation()  # an async operation's coroutine is awaited by the runner

        facade = SyncActionRunner(runner.ledger, policy=runner.policy)
        try:
            function = guarded(action_name, runner=facade, **options)(guarded_sync)
            return await asyncio.to_thread(function)
        finally:
            _stop_without_closing_the_ledger(facade)
    assert front_end == "sync"
    # The facade runs its own loop on its own thread: call it from a thread,
    # as synchronous code would, sharing the same (thread-safe) ledger.
    facade = SyncActionRunner(runner.ledger, policy=runner.policy)
    try:
        call = functools.partial(facade.execute, action_name, operation, **kwargs)
        return await asyncio.to_thread(call)
    finally:
        _stop_without_closing_the_ledger(facade)


def _stop_without_closing_the_ledger(facade: Any) -> None:
    # The test's runner still owns the ledger: stop only the facade's loop.
    facade._loop.call_soon_threadsafe(facade._loop.stop)
    facade._thread.join()
    facade._loop.close()
    facade._closed = True


__all__ = [
    "LEDGER_START",
    "FRONT_ENDS",
    "FRONT_ENDS_AND_OPERATION_KINDS",
    "call_via",
    "REF",
    "REQUEST",
    "CountingOperation",
    "DefinitiveFailure",
    "VerificationHealth",
    "confirmed",
    "fenced_absent",
    "fixed_verifier",
]


#: Every ledger backend; the ``new_ledger`` fixture (tests/conftest.py) makes each.
BACKENDS = ("memory", "sqlite", "postgres")


async def closing(ledger: Any) -> None:
    """Close ``ledger`` if it has anything to close."""
    close = getattr(ledger, "close", None)
    if close is not None:
        await close()


def events(caplog: pytest.LogCaptureFixture) -> list[tuple[str, int, dict[str, Any]]]:
    """(event, level, fields) of every dataoad log record, in order."""
    return [
        (r.dataoad["event"], r.levelno, r.dataoad) for r in caplog.records if hasattr(r, "dataoad")
    ]


async def execute(runner: ActionRunner, op: Any = None, **kwargs: Any) -> Any:
    return await runner.execute(
        "charge",
        op or CountingOperation("ok"),
        request=REQUEST,
        idempotency_key=kwargs.pop("key", "k"),
        provider_reference=REF,
        **kwargs,
    )


async def stranded(ledger: Any) -> ActionReceipt:
    """A PENDING claim with one started attempt, as a crashed worker leaves it."""
    faulty = FaultyLedger(ledger)
    faulty.inject("record", FAIL)
    with pytest.raises(ActionPersistenceError) as info:
        await execute(ActionRunner(faulty))
    assert info.value.receipt is not None
    return info.value.receipt


async def unstarted(
    ledger: Any,
    key: str = "k",
    *,
    action_name: str = "charge",
    request: Any = REQUEST,
    provider_reference: str | None = REF,
    owner: str | None = None,
    lease: float | None = None,
) -> ActionReceipt:
    """A PENDING claim with no attempt counted: it never invoked anything.

    Only a runner before the fused claim (v0.1) left these, when its
    attempt start failed; the runner now counts attempt 1 in the claim
    itself. Written straight to the ledger, in exactly that runner's shape.
    """
    receipt = unstarted_claim(
        action_name, key, request, provider_reference=provider_reference, owner=owner
    )
    stored, created = await (
        ledger.claim(receipt) if lease is None else ledger.claim(receipt, lease=lease)
    )
    assert created, "the key is already held"
    return stored  # type: ignore[no-any-return]


async def unknown(ledger: Any) -> Any:
    """A completed UNKNOWN action: the call timed out and nothing verified it."""
    return await execute(ActionRunner(ledger), CountingOperation(TimeoutError("lost")))


def skew_wall_clock(monkeypatch: pytest.MonkeyPatch, skewed: Callable[[], datetime]) -> set[str]:
    """Make the library's wall clock (``utc_now``) answer ``skewed`` everywhere; the modules.

    Every module imports ``utc_now`` by name, so patching ``dataoad._clock``
    alone moves nothing: a skew test that did so once passed on a ledger
    that judged leases by the writer's clock.
    """
    original = clock_module.utc_now
    patched = set()
    for name, module in list(sys.modules.items()):
        if name.split(".")[0] == "dataoad" and getattr(module, "utc_now", None) is original:
            monkeypatch.setattr(module, "utc_now", skewed)
            patched.add(name)
    return patched


async def refuse(*args: Any, **kwargs: Any) -> bool:
    """A conditional write whose condition no longer holds (whatever it was called with).

    Keyword arguments too: a stand-in that raised TypeError for a lease
    would test a failed write, not a refused one.
    """
    return False


async def stranded_pending(attempted: bool) -> tuple[InMemoryLedger, str, CountingOperation]:
    """A PENDING claim left behind by a failed ledger write."""
    inner = InMemoryLedger()
    op = CountingOperation(TimeoutError())
    if not attempted:
        return inner, (await unstarted(inner, action_name="a")).action_id, op
    faulty = FaultyLedger(inner)
    faulty.inject("record", LedgerFault.FAIL_BEFORE_WRITE)
    with pytest.raises(ActionPersistenceError) as info:
        await ActionRunner(faulty).execute(
            "a", op, request=REQUEST, idempotency_key="k", provider_reference=REF
        )
    assert info.value.receipt is not None
    return inner, info.value.receipt.action_id, op


async def reached(event: asyncio.Event, task: asyncio.Future[Any], within: float = 30) -> None:
    """Wait until ``event`` is set; fail at once if ``task`` ends first (a bug, not a hang)."""
    waiter = asyncio.ensure_future(event.wait())
    await asyncio.wait({waiter, task}, timeout=within, return_when=asyncio.FIRST_COMPLETED)
    waiter.cancel()
    if not event.is_set():
        raise AssertionError(f"the call ended (or {within} s passed) before getting there: {task}")


class Recorder:
    """An observer that keeps every event."""

    def __init__(self) -> None:
        self.events: list[RunnerEvent] = []

    def on_event(self, event: RunnerEvent) -> None:
        self.events.append(event)

    def of(self, kind: EventKind) -> list[RunnerEvent]:
        """The events of one kind, in order."""
        return [e for e in self.events if e.kind is kind]


class Unlisted:
    """A leasing ledger without the Inspection listing."""

    def __init__(self) -> None:
        self.inner = InMemoryLedger()

    def __getattr__(self, name: str) -> Any:
        if name == "receipts":
            raise AttributeError(name)
        return getattr(self.inner, name)


async def old_postgres_table(
    conn: Any, table: str, steps: Sequence[int], rows: Sequence[dict[str, Any]]
) -> None:
    """``public.table`` exactly as the code of schema ``steps[-1]`` migrated and filled it.

    ``rows`` come from that code's SQLite fixture (times as ISO text).
    """
    from dataoad.ledgers.postgres import MIGRATIONS

    qualified = f'"public"."{table}"'
    for step in steps:
        for statement in MIGRATIONS[step]:
            await conn.execute(
                statement.format(
                    table=qualified,
                    key_index=f"{table}_key",
                    audit_table=f'"public"."{table}_audit"',
                    audit_index=f"{table}_audit_ix",
                )
            )
    await conn.execute(
        f'CREATE TABLE "public"."{table}_schema" (version integer PRIMARY KEY, '
        "applied_at timestamptz NOT NULL DEFAULT now())"
    )
    for step in steps:
        await conn.execute(f'INSERT INTO "public"."{table}_schema" (version) VALUES ($1)', step)
    for row in rows:
        values = {
            name: datetime.fromisoformat(value)
            if name.endswith("_at") and value is not None
            else value
            for name, value in row.items()
        }
        names = ", ".join(values)
        marks = ", ".join(f"${i + 1}" for i in range(len(values)))
        await conn.execute(f"INSERT INTO {qualified} ({names}) VALUES ({marks})", *values.values())


def lock_is_free(lock_file: Path) -> bool:
    """Whether another descriptor (as another process would) can take the writer lock now."""
    fd = os.open(lock_file, os.O_CREAT | os.O_RDWR, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    finally:
        os.close(fd)  # also releases it
    return True


async def reconciled_at_once(runner: Any, action_id: str, *answers: VerificationResult) -> None:
    """Reconcile ``action_id`` once per answer, concurrently: every verifier is asked before
    any answers, so the answers meet in one merge race (contradicting ones: UNKNOWN)."""
    all_asked = asyncio.Event()
    asked: list[VerificationResult] = []

    def answering(answer: VerificationResult) -> Any:
        async def verify(receipt: Any) -> VerificationResult:
            asked.append(answer)
            if len(asked) == len(answers):
                all_asked.set()
            await all_asked.wait()
            return answer

        return verify

    await asyncio.gather(*(runner.reconcile(action_id, answering(a)) for a in answers))


class UnknownLandsFirst(InMemoryLedger):
    """A ledger where a zombie's UNKNOWN evidence lands just before each retire.

    ``then`` is raised after it (the retire's connection dropped), or the
    retire goes on and is refused by the changed receipt.
    """

    def __init__(self, then: Exception | None = None) -> None:
        super().__init__()
        self.then = then

    async def retire(self, receipt: Any, **options: Any) -> bool:
        stored = await self.get(receipt.action_id)
        assert stored is not None
        await self.record(
            stored.evolve(
                final_status=ActionStatus.UNKNOWN,
                version=stored.version + 1,
                updated_at=utc_now(),
            )
        )
        if self.then is not None:
            raise self.then
        return await super().retire(receipt, **options)
