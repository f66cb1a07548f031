"""The deterministic gate scheduler, instrumented fakes, history and traces.

Contenders are real ``ActionRunner`` calls running as asyncio tasks. Every
ledger call, provider call and verifier call they make first parks at a
*gate*; only the state machine releases a parked contender, one gate at a
time, and it decides at release time what happens there (a fault, a
verifier answer). An interleaving is therefore data Hypothesis draws and
shrinks, and a failing run replays exactly from its printed steps.
"""

from __future__ import annotations

import asyncio
import contextvars
import dataclasses
import enum
import json
import os
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Iterable
from datetime import datetime
from pathlib import Path
from typing import Any, Final, Protocol, TypeVar, cast

from hypothesis import settings

from dataoad import (
    ActionReceipt,
    DefinitiveFailure,
    LeasingLedger,
    Ledger,
    LedgerBusyError,
    VerificationHealth,
    VerificationResult,
    current_attempt,
)
from dataoad.testing import FaultyLedger, LedgerFaultError
from dataoad.testing import LedgerFault as InjectedFault
from dataoad.testing._trace_html import render_html, steps_from_history
from models.world import World
from suite_support.writer_lock import HeldWriterLock

T = TypeVar("T")

#: Every (gate kind, decision) reached in this process, for the reach check (stateful_tests.reach).
REACHED: Counter[tuple[str, str]] = Counter()

_current: contextvars.ContextVar[Contender] = contextvars.ContextVar("dataoad_contender")


def current_contender() -> Contender | None:
    """The contender whose task is running, or None for the machine's own calls."""
    return _current.get(None)


class Crashed(Exception):
    """Raised at a gate of a contender whose process has died."""


class SchedulerStuck(AssertionError):
    """A released contender neither parked nor finished in time."""


class LedgerFault(enum.Enum):
    """What happens at a ledger gate (the harness's faults plus "nothing")."""

    NONE = "none"
    FAIL_BEFORE_WRITE = "write fails"
    LOSE_ACKNOWLEDGEMENT = "write commits, acknowledgement lost"
    #: SQLite only: another process holds the writer lock and does not let go
    #: (stopped, say); the write must give up within busy_timeout.
    LOCK_HELD = "another process holds the writer lock"
    #: SQLite's shared connection only (``group_rules``): the write ran in a
    #: group whose COMMIT failed, so nothing of it was stored. Noted after the
    #: fact, never drawn at a gate.
    GROUP_COMMIT_FAILED = "the write's group failed to commit"


#: The write faults every backend can suffer (LOCK_HELD is SQLite's alone).
WRITE_FAULTS = (
    LedgerFault.NONE,
    LedgerFault.FAIL_BEFORE_WRITE,
    LedgerFault.LOSE_ACKNOWLEDGEMENT,
)

#: How long a stuck lock holder keeps the writer lock before it lets go (a
#: ledger that waits without bound then finishes, late, and is caught).
#: Only a run that waits on pays for it: a write that gives up lets go at once.
LOCK_HOLD_SECONDS = 3.0
#: Longest a write may take against a stuck lock holder: 75 times the
#: busy_timeout the machines give their clients (SQLITE_BUSY_TIMEOUT), so a
#: loaded machine's stall is never taken for a wait that did not give up,
#: and half of LOCK_HOLD_SECONDS, so a wait that ends only when the holder
#: lets go is always caught.
LOCK_WAIT_LIMIT = 1.5


class ProviderFault(enum.Enum):
    """What happens at the provider gate, on either side of the commit."""

    NONE = "commits and answers"
    FAIL_BEFORE_SEND = "raises before sending"
    DECLINE = "declines (definitive)"
    REJECT_RETRYABLE = "rejects before processing (definitive, retryable)"
    COMMIT_THEN_TIMEOUT = "commits, then times out"
    COMMIT_THEN_RESET = "commits, then resets the connection"
    COMMIT_THEN_GARBAGE = "commits, then returns garbage"
    LATE_COMMIT = "times out while still in flight"


#: Provider faults after which the provider has (or may yet have) committed.
COMMITTING = {
    ProviderFault.NONE,
    ProviderFault.COMMIT_THEN_TIMEOUT,
    ProviderFault.COMMIT_THEN_RESET,
    ProviderFault.COMMIT_THEN_GARBAGE,
}


class VerifierAnswer(enum.Enum):
    """What the verifier says at its gate."""

    TRUTHFUL = "truthful read"
    STALE_ABSENT = "healthy-looking absence, not retry-safe"
    UNKNOWN = "unknown (read path down)"
    RAISES = "raises"
    WRONG_REFERENCE = "answers for another reference"
    UNHEALTHY = "degraded read claiming the opposite"
    NOT_A_RESULT = "answers with something that is not a VerificationResult"


@dataclasses.dataclass
class Event:
    """One line of the history: who did what, with machine-readable facts."""

    step: int
    actor: str
    text: str
    facts: dict[str, Any] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass
class Contender:
    """One concurrent caller: a task, where it is parked, what it did."""

    name: str
    kind: str  # execute | reconcile | recover | release
    key: str
    reference: str
    policy: Any = None
    with_verifier: bool = False
    task: asyncio.Task[Any] | None = None
    parked_at: str | None = None
    park: asyncio.Future[str] | None = None
    go: asyncio.Future[Any] | None = None
    crashed: bool = False
    outcome: Any = None
    finished: bool = False
    provider_calls: list[ProviderFault] = dataclasses.field(default_factory=list)
    verifier_answers: list[tuple[VerifierAnswer, str]] = dataclasses.field(default_factory=list)
    ledger_faults: list[tuple[str, LedgerFault]] = dataclasses.field(default_factory=list)
    #: (method, seconds): how long each write that met a stuck lock holder took.
    lock_waits: list[tuple[str, float]] = dataclasses.field(default_factory=list)
    #: (method, seconds): those of them that gave up (LedgerBusyError), and after how long.
    lock_give_ups: list[tuple[str, float]] = dataclasses.field(default_factory=list)
    #: Whether its operation runs on a worker thread (a sync operation).
    in_thread: bool = False
    #: Whether its sync operation was called on the event loop's thread.
    ran_on_loop: bool = False
    #: (action_id, fencing token) of its sync operation's provider call while
    #: that call is under way on its worker thread (None: none is).
    acting_under: tuple[str, int] | None = None
    #: The provider gate its worker thread still waits at after its caller
    #: gave up (was cancelled while its process lived on).
    lingering: asyncio.Future[Any] | None = None
    #: Resolved when its worker thread's provider call has answered.
    answered: asyncio.Future[None] | None = None
    cleared_since_last_call: bool = True  # evidence allowed another invocation
    escape_hatch: bool = False  # policy retries UNKNOWN on purpose
    call_allowed: list[bool] = dataclasses.field(default_factory=list)
    durable_attempts_at_call: list[tuple[int, str | None]] = dataclasses.field(default_factory=list)
    #: How many ledger calls it had made at each provider call.
    ledger_calls_at_call: list[int] = dataclasses.field(default_factory=list)
    action_id: str | None = None
    waited: bool = False  # saw the claim held by another caller and waited
    #: Claims whose creation by this contender committed (acknowledged or not).
    claims: set[str] = dataclasses.field(default_factory=set)
    #: (method, action_id): committed writes this contender made to a PENDING claim.
    pending_writes: list[tuple[str, str]] = dataclasses.field(default_factory=list)
    amount: int = 0  # what the request asks for (the rest is the key)
    #: Whether the machine has reported its outcome (once, when it finished).
    reported: bool = False
    #: A release that returned: the attempts its claim had when last observed
    #: (set when the machine reports the release; None until then).
    released_attempts: int | None = None
    #: action_id -> the fencing token under which this contender holds the claim.
    tokens: dict[str, int] = dataclasses.field(default_factory=dict)
    #: Claims this contender took over from a worker whose lease ran out.
    took_over: set[str] = dataclasses.field(default_factory=set)
    #: Lease rules a committed write broke, as seen by the machine (one line each).
    lease_breaches: list[str] = dataclasses.field(default_factory=list)
    #: Every invocation made while this contender did not hold its claim (one line each).
    invoked_unheld: list[str] = dataclasses.field(default_factory=list)
    #: Whether its next gated write, once it returns, parks at ``STALLED`` (a rule's stall).
    stall_after_write: bool = False
    #: Park at AFTER_GROUP once the next write returns or raises (group_rules).
    park_after_write: bool = False
    #: (action_id, attempts before): every release of a PENDING claim that committed.
    releases: list[tuple[str, int]] = dataclasses.field(default_factory=list)
    #: A sweep's: action_id -> (fencing token, lease end) of each claim stale when it began.
    stale_at_start: dict[str, tuple[int, Any]] = dataclasses.field(default_factory=dict)
    #: The runner's namespace (a machine key ``"t/order-1"`` is in namespace ``t``).
    namespace: str = ""
    #: ``execute(expires_after=...)``: the contender frees an expired key first.
    expires_after: float | None = None
    #: An expiring caller's: (action_id, version) of the definitive receipt
    #: whose exact age (by the ledger's clock) it asked for, when it began.
    expires_exactly: tuple[str, int] | None = None
    #: An expiring caller's: how many seconds more than that age it asked for.
    too_early_by: float = 0.0
    #: Its ledger calls meet faults a quarter as often (a sweep whose
    #: progress is judged only when no fault excused it).
    calm_ledger: bool = False
    #: A reopen's: whether the receipt it named had given up its key when it began.
    retired_before: bool = False
    #: A prune's: the statuses it was asked for, and every receipt it deleted
    #: (as its batch read it, just before the delete).
    prune_statuses: tuple[Any, ...] = ()
    #: Receipts whose key this contender's committed writes freed.
    retired: list[str] = dataclasses.field(default_factory=list)
    #: Each of those writes as the ledger stored it: (the version it retired, the retired one).
    retired_spans: list[tuple[ActionReceipt, ActionReceipt]] = dataclasses.field(
        default_factory=list
    )
    pruned: list[ActionReceipt] = dataclasses.field(default_factory=list)
    #: A duplicate sent when the ledger's clock stood at a claim's lease end
    #: (``"exactly"``) or a microsecond before it (``"early"``): (side, action_id).
    lease_edge: tuple[str, str] | None = None
    #: ``execute(wait_in_progress=...)``: how long it may wait for a claim holder.
    wait: float | None = None
    #: Every reading of the runner's monotonic clock it made (its wait's looks).
    clock_readings: list[float] = dataclasses.field(default_factory=list)
    #: (clock reading, seconds): every pause of its wait between two looks.
    pauses: list[tuple[float, float]] = dataclasses.field(default_factory=list)
    #: ``max_request_bytes`` relative to its request's canonical size: ``"exactly"``
    #: or ``"a byte short"`` (None: the default bound, far above it).
    request_bound: str | None = None

    @property
    def alive(self) -> bool:
        """Whether anything of it may still act: its call, or the worker thread of a
        caller that gave up (a zombie, for the rules that free or settle keys)."""
        return not self.finished or self.acting_under is not None

    def __repr__(self) -> str:
        where = "finished" if self.finished else f"parked at {self.parked_at}"
        return f"<contender {self.name}: {self.kind} {self.key}, {where}>"


NAMES = "ABCDEFGHIJKLMNOPQRSTUVWXYZ"


def contender_name(index: int) -> str:
    """A, B, ... Z, then A1, B1, ...: a run never runs out of names."""
    letter, lap = NAMES[index % len(NAMES)], index // len(NAMES)
    return f"{letter}{lap}" if lap else letter


class History:
    """The numbered narrative of a run, and its JSON trace."""

    def __init__(self, title: str) -> None:
        self.title = title
        self.events: list[Event] = []
        self.step = 0

    def add(self, actor: str, text: str, **facts: Any) -> None:
        self.events.append(Event(self.step, actor, text, facts))

    def narrative(self) -> str:
        return "\n".join(f"{n:3d}. {e.actor}: {e.text}" for n, e in enumerate(self.events, 1))

    def write(self, violation: str) -> Path:
        folder = Path(os.environ.get("DATAOAD_TRACE_DIR", "dataoad-traces"))
        folder.mkdir(parents=True, exist_ok=True)
        path = folder / f"{self.title}.json"
        payload = {
            "machine": self.title,
            "violation": violation,
            "written_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "events": [dataclasses.asdict(e) for e in self.events],
        }
        _replace(path, json.dumps(payload, indent=2, default=str))
        _replace(
            path.with_suffix(".html"),
            render_html(self.title, steps_from_history(self.events), violation),
        )
        return path.resolve()


def _replace(path: Path, text: str) -> None:
    # Tests run in parallel processes (pytest-xdist) that may write the same
    # machine's trace: each writes its own file and swaps it in whole.
    scratch = path.with_name(f".{path.name}.{os.getpid()}")
    scratch.write_text(text, encoding="utf-8")
    os.replace(scratch, path)


def violation(history: History, name: str, detail: str) -> AssertionError:
    """An InvariantViolation carrying the numbered narrative and the JSON trace path."""
    from stateful_tests.violations import violation_type

    path = history.write(f"invariant {name} broken: {detail}")
    return violation_type(name)(
        name,
        f"{detail}\n\nWhat happened:\n{history.narrative()}\n\nTrace written to {path} "
        f"(drawn as a sequence diagram in {path.with_suffix('.html')})",
    )


class MachineLoop(asyncio.Runner):  # type: ignore[misc, unused-ignore]  # final in typeshed only
    """An ``asyncio.Runner`` whose ``run`` skips installing a SIGINT handler.

    ``asyncio.Runner.run`` installs and removes one on every call, and with
    tasks pending that costs a repr of each (an enum lookup fails on the
    handler and formats it). Machines call ``run`` after every gate, so this
    was about a sixth of a runner-machine run. Ctrl-C still interrupts the
    loop, as a plain KeyboardInterrupt.
    """

    def run(self, coro: Any, *, context: contextvars.Context | None = None) -> Any:
        loop = self.get_loop()
        return loop.run_until_complete(loop.create_task(coro, context=context))


class Scheduler:
    """Parks contenders at gates and releases exactly one at a time."""

    def __init__(self, runner: asyncio.Runner, *, timeout: float = 20.0) -> None:
        self.runner = runner
        self.timeout = timeout

    async def gate(self, label: str) -> Any:
        """Park the current contender at ``label`` until the machine releases it."""
        contender = _current.get(None)
        if contender is None:
            return None  # an observer's call, not a contender's: never gated
        if contender.crashed:
            raise Crashed(f"contender {contender.name} is dead")
        loop = asyncio.get_running_loop()
        go = contender.go = loop.create_future()
        contender.parked_at = label
        if contender.park is not None and not contender.park.done():
            contender.park.set_result(label)
        try:
            return await go
        finally:
            if contender.go is go:  # a gate given up on (``give_up``) is no longer its own
                contender.parked_at = None

    def start(self, contender: Contender, body: Callable[[], Awaitable[Any]]) -> None:
        """Start a contender and run it to its first gate (or to its end)."""

        async def wrapper() -> Any:
            return await body()

        loop = self.runner.get_loop()
        contender.park = loop.create_future()
        context = contextvars.copy_context()
        context.run(_current.set, contender)
        contender.task = loop.create_task(wrapper(), context=context)
        self._settle(contender)

    def release(self, contender: Contender, decision: Any) -> None:
        """Let a parked contender pass its gate with ``decision``; run to its next gate."""
        assert contender.go is not None
        assert not contender.go.done()
        contender.park = self.runner.get_loop().create_future()
        contender.go.set_result(decision)
        self._settle(contender)

    def crash(self, contender: Contender) -> None:
        """The contender's process dies: it makes no further call of any kind."""
        contender.crashed = True
        assert contender.task is not None
        contender.task.cancel()
        self._settle(contender)
        self.fail_stranded_gate(contender)

    def give_up(self, contender: Contender) -> None:
        """The caller is cancelled (a tool's time limit) while its process lives on.

        A worker thread parked in the provider is not stopped by that: its
        gate stays parked, no longer the caller's (``lingering``), until
        ``let_go`` releases it or the process dies.
        """
        assert contender.task is not None
        assert contender.lingering is None, "a runner ran on after its caller gave up"
        if contender.in_thread and contender.parked_at == "provider.charge":
            contender.lingering, contender.go, contender.parked_at = contender.go, None, None
        contender.park = self.runner.get_loop().create_future()
        contender.task.cancel()
        self._settle(contender)

    def let_go(self, contender: Contender, decision: Any) -> None:
        """Release the lingering thread's provider gate; return once the provider answered."""
        go, contender.lingering = contender.lingering, None
        answered = contender.answered
        assert go is not None
        assert answered is not None
        go.set_result(decision)

        async def until_answered() -> None:
            done, _ = await asyncio.wait({answered}, timeout=self.timeout)
            if not done:
                raise SchedulerStuck(f"contender {contender.name}'s thread never answered")

        self.runner.run(until_answered())
        self._note_end(contender)

    def stop_all(self, contenders: Iterable[Contender]) -> None:
        """At teardown: every contender still running dies, and its end is collected.

        A task whose exception nobody retrieves is logged when it is garbage
        collected, wherever that happens; on CPython 3.11 a collection inside
        ``ast.parse`` (Hypothesis reads the next machine's source) re-enters
        the parser to format that traceback and fails with a SystemError.
        """
        contenders = list(contenders)
        for c in contenders:
            if c.task is not None and not c.task.done():
                c.crashed = True
                c.task.cancel()
        for c in contenders:
            self.fail_stranded_gate(c)
        tasks = {c.task for c in contenders if c.task is not None}
        pending = {t for t in tasks if not t.done()}
        if pending:
            self.runner.run(asyncio.wait(pending, timeout=self.timeout))
        for task in tasks:
            if task.done() and not task.cancelled():
                task.exception()  # retrieved: its outcome no longer matters

    def fail_stranded_gate(self, contender: Contender) -> None:
        """Fail a gate the contender's cancellation could not reach.

        A sync operation parks at the provider gate from a worker thread, in
        a task of its own: cancelling the contender does not cancel that
        task, and the thread would wait on it for ever.
        """
        for go in (contender.go, contender.lingering):
            if go is not None and not go.done():
                go.set_exception(Crashed(f"contender {contender.name} is dead"))
                self.runner.run(asyncio.sleep(0))
        contender.lingering = None

    def _settle(self, contender: Contender) -> None:
        async def until_parked_or_done() -> None:
            assert contender.task is not None
            assert contender.park is not None
            done, _ = await asyncio.wait(
                {contender.task, contender.park},
                timeout=self.timeout,
                return_when=asyncio.FIRST_COMPLETED,
            )
            if not done:
                raise SchedulerStuck(f"contender {contender.name} neither parked nor finished")

        self.runner.run(until_parked_or_done())
        self._note_end(contender)

    @staticmethod
    def _note_end(contender: Contender) -> None:
        assert contender.task is not None
        if contender.task.done() and not contender.finished:
            contender.finished = True
            if contender.task.cancelled():
                contender.outcome = Crashed("cancelled")
            else:
                exc = contender.task.exception()
                contender.outcome = exc if exc is not None else contender.task.result()


def split_key(key: str) -> tuple[str, str]:
    """A machine key as (namespace, idempotency key): ``"t/order-1"`` is key order-1 of ``t``."""
    namespace, _, idempotency_key = key.rpartition("/")
    return namespace, idempotency_key


@dataclasses.dataclass(frozen=True)
class LeaseGrant:
    """A committed write that granted a claim its lease, bracketed by the ledger's clock.

    The ledger read its clock between ``since`` and ``until``, so the lease
    it stored runs out between ``since + lease`` and ``until + lease``.
    """

    method: str  # claim, start_attempt, take_over or renew
    since: datetime
    until: datetime


class PreReads(Protocol):
    """Where a gated write reads, ungated, the claim it is about to change."""

    async def get(self, action_id: str) -> ActionReceipt | None: ...


#: Where a contender waits while a rule stalls it right after a write returned.
STALLED: Final = "runner.stalled after a write"
#: Where a contender whose write ran in a group waits until the group rule
#: lets it go on (``Contender.park_after_write``), whether the write returned or raised.
AFTER_GROUP: Final = "runner.after its group's commit"


class GatedLedger(FaultyLedger):
    """A ledger client whose every call parks first; the release decides the fault."""

    def __init__(
        self,
        inner: Ledger,
        scheduler: Scheduler,
        released: set[str] | None = None,
        history: History | None = None,
        clock: Callable[[], datetime] | None = None,
        lease_grants: dict[str, LeaseGrant] | None = None,
        pre_reads: PreReads | None = None,
    ) -> None:
        super().__init__(inner)
        self.scheduler = scheduler
        #: Where a write's ungated read of the claim before it goes (``inner``
        #: unless given: the shared-connection machine reads on a connection
        #: of its own, so that read never waits behind the connection it holds).
        self.pre_reads: PreReads = inner if pre_reads is None else pre_reads
        self.history = history
        #: The ledger's clock as the machine keeps it: judges the takeovers it sees.
        self.clock = clock
        #: action_id -> the last committed write that granted its claim a lease.
        self.lease_grants = lease_grants if lease_grants is not None else {}
        # Ids whose release committed, even if its acknowledgement is then lost.
        self.released = released if released is not None else set()

    async def _fault(self, method: str) -> InjectedFault | None:
        decision = await self.scheduler.gate(f"ledger.{method}")
        fault = LedgerFault.NONE if decision is None else decision
        contender = _current.get(None)
        if contender is not None:
            contender.ledger_faults.append((method, fault))
        if fault in (LedgerFault.NONE, LedgerFault.LOCK_HELD):
            return None
        return InjectedFault[fault.name]

    async def _write(self, method: str, call: Callable[[], Awaitable[T]]) -> T:
        fault = await self._fault(method)
        contender = _current.get(None)
        # Taken off before the write, whichever way it goes, so that it never
        # parks a later write outside the group rule.
        parks = contender is not None and contender.park_after_write
        if contender is not None:
            contender.park_after_write = False
        try:
            outcome = await self._written(method, fault, call)
        except Exception:
            if parks:
                await self.scheduler.gate(AFTER_GROUP)
            raise
        if parks:
            await self.scheduler.gate(AFTER_GROUP)
        return outcome

    async def _written(
        self, method: str, fault: InjectedFault | None, call: Callable[[], Awaitable[T]]
    ) -> T:
        contender = _current.get(None)
        if contender is None or not contender.ledger_faults:
            return await self._unfaulted(method, fault, call)
        if contender.ledger_faults[-1] != (method, LedgerFault.LOCK_HELD):
            return await self._unfaulted(method, fault, call)
        # A stuck process holds the writer lock (its own descriptor, as
        # another process would) and lets go only after LOCK_HOLD_SECONDS.
        path = getattr(self.inner, "path", None)
        assert path is not None, "LOCK_HELD is drawn only for SQLite"
        stuck = HeldWriterLock(path)
        stuck.release_after(LOCK_HOLD_SECONDS)
        started = time.monotonic()
        try:
            return await call()
        except LedgerBusyError:
            contender.lock_give_ups.append((method, time.monotonic() - started))
            raise
        finally:
            contender.lock_waits.append((method, time.monotonic() - started))
            stuck.release()

    async def _unfaulted(
        self, method: str, fault: InjectedFault | None, call: Callable[[], Awaitable[T]]
    ) -> T:
        if fault is InjectedFault.FAIL_BEFORE_WRITE:
            raise LedgerFaultError(f"injected: {method} failed before write")
        outcome = await call()
        contender = _current.get(None)
        if contender is not None and contender.stall_after_write:
            # The write returned; the process stalls before its next step
            # (a blocking observer, a pause), while the rule moves time on.
            contender.stall_after_write = False
            await self.scheduler.gate(STALLED)
        if fault is InjectedFault.LOSE_ACKNOWLEDGEMENT:
            raise LedgerFaultError(f"injected: {method} committed, acknowledgement lost")
        return outcome

    async def claim(
        self, receipt: ActionReceipt, *, lease: float | None = None
    ) -> tuple[ActionReceipt, bool]:
        async def claim_and_note() -> tuple[ActionReceipt, bool]:
            since = self._now()
            stored, created = await self.inner.claim(receipt, lease=lease)
            if created:
                self._granted(stored.action_id, "claim", since)
            contender = _current.get(None)
            if created and contender is not None:
                contender.claims.add(stored.action_id)
                contender.tokens[stored.action_id] = stored.fencing_token
            return stored, created

        return await self._write("claim", claim_and_note)

    def _now(self) -> datetime | None:
        return None if self.clock is None else self.clock()

    def _granted(self, action_id: str, method: str, since: datetime | None) -> None:
        until = self._now()
        if since is not None and until is not None:
            self.lease_grants[action_id] = LeaseGrant(method, since, until)

    async def _granting(
        self, method: str, action_id: str, call: Callable[[], Awaitable[bool]]
    ) -> bool:
        """``call``, a write that grants a lease; if it commits, when by the ledger's clock."""
        since = self._now()
        done = await call()
        if done:
            self._granted(action_id, method, since)
        return done

    async def _noting_pending_write(
        self,
        method: str,
        action_id: str,
        call: Callable[[], Awaitable[bool]],
        written: ActionReceipt | None = None,
    ) -> bool:
        # Whose claim a write changes is read before it, ungated: only a
        # write that lands on a PENDING claim moves a claim away from its holder.
        # What a committed write stored is the receipt it proposed (``written``):
        # no second read, which once doubled the exhaustive explorer's time.
        before = await self.pre_reads.get(action_id)
        done = await call()
        contender = _current.get(None)
        if done and contender is not None and before is not None:
            self._note_lease_rules(contender, method, before, written)
        if done and contender is not None and before is not None and before.is_pending:
            contender.pending_writes.append((method, action_id))
            if method == "release":
                contender.releases.append((action_id, before.attempts))
            if (
                self.history is not None
                and contender.kind == "execute"
                and action_id not in contender.claims
            ):
                self.history.add(
                    f"contender {contender.name}",
                    f"ledger.{method} changes PENDING claim {action_id[:8]}, which it did not make",
                )
        return done

    def _note_lease_rules(
        self,
        contender: Contender,
        method: str,
        before: ActionReceipt,
        after: ActionReceipt | None,
    ) -> None:
        """What a committed write did to the claim's holder, judged by the machine's clock."""
        if after is None:
            return
        action_id = before.action_id
        if method == "take_over":
            now = None if self.clock is None else self.clock()
            expired = (
                before.is_pending
                and before.lease_expires_at is not None
                and now is not None
                and before.lease_expires_at <= now
            )
            if not expired:
                contender.lease_breaches.append(
                    f"took over claim {action_id[:8]} whose lease runs to "
                    f"{before.lease_expires_at} (ledger clock {now})"
                )
            if after.fencing_token != before.fencing_token + 1:
                contender.lease_breaches.append(
                    f"took over claim {action_id[:8]} with fencing token "
                    f"{before.fencing_token} -> {after.fencing_token}, not +1"
                )
            contender.claims.add(action_id)
            contender.took_over.add(action_id)
            contender.tokens[action_id] = after.fencing_token
            return
        if after.owner != before.owner or after.fencing_token != before.fencing_token:
            contender.lease_breaches.append(
                f"{method} changed claim {action_id[:8]}'s holder "
                f"({before.owner}, token {before.fencing_token}) -> "
                f"({after.owner}, token {after.fencing_token}) without a takeover"
            )
        mine = contender.tokens.get(action_id)
        if method == "start_attempt" and mine is not None and mine != before.fencing_token:
            contender.lease_breaches.append(
                f"started an attempt of claim {action_id[:8]} under fencing token {mine} "
                f"after it passed to token {before.fencing_token}"
            )
        if (
            method == "record"
            and mine is not None
            and mine != before.fencing_token
            and before.is_pending
            and not after.is_pending
            and contender.kind == "execute"
        ):
            contender.lease_breaches.append(
                f"completed claim {action_id[:8]} under fencing token {mine} after it passed "
                f"to token {before.fencing_token}"
            )

    async def start_attempt(self, receipt: ActionReceipt, *, lease: float | None = None) -> bool:
        return await self._write(
            "start_attempt",
            lambda: self._noting_pending_write(
                "start_attempt",
                receipt.action_id,
                lambda: self._granting(
                    "start_attempt",
                    receipt.action_id,
                    lambda: self.inner.start_attempt(receipt, lease=lease),
                ),
                receipt,
            ),
        )

    async def take_over(self, receipt: ActionReceipt, *, lease: float) -> bool:
        inner = cast(LeasingLedger, self.inner)

        def write() -> Awaitable[bool]:
            return self._noting_pending_write(
                "take_over",
                receipt.action_id,
                lambda: self._granting(
                    "take_over", receipt.action_id, lambda: inner.take_over(receipt, lease=lease)
                ),
                receipt,
            )

        # A takeover of a claim whose lease holds (by the machine's clock) is
        # refused by a correct ledger: it runs ungated, so it adds no schedule
        # point (one per duplicate doubled the exhaustive explorer's time);
        # a broken ledger that accepts it is still caught by the note above.
        current = await inner.get(receipt.action_id)
        now = None if self.clock is None else self.clock()
        expired = (
            current is not None
            and current.lease_expires_at is not None
            and now is not None
            and current.lease_expires_at <= now
        )
        if not expired:
            return await write()
        return await self._write("take_over", write)

    async def renew(self, action_id: str, fencing_token: int, lease: float) -> bool:
        # Ungated: a renewal is the heartbeat rule's single step (see VirtualClock).
        inner = cast(LeasingLedger, self.inner)
        before = await inner.get(action_id)
        done = await self._granting(
            "renew", action_id, lambda: inner.renew(action_id, fencing_token, lease)
        )
        contender = _current.get(None)
        if (
            done
            and contender is not None
            and before is not None
            and before.fencing_token != fencing_token
        ):
            contender.lease_breaches.append(
                f"renewed claim {action_id[:8]} under fencing token {fencing_token} after "
                f"it passed to token {before.fencing_token}"
            )
        return done

    async def record(self, receipt: ActionReceipt) -> bool:
        return await self._write(
            "record",
            lambda: self._noting_pending_write(
                "record", receipt.action_id, lambda: self.inner.record(receipt), receipt
            ),
        )

    async def release(self, action_id: str, version: int) -> bool:
        async def release_and_note() -> bool:
            done = await self._noting_pending_write(
                "release", action_id, lambda: self.inner.release(action_id, version)
            )
            if done:
                self.released.add(action_id)
            return done

        return await self._write("release", release_and_note)

    async def retire(self, receipt: ActionReceipt, **options: Any) -> bool:
        """Gated like any write; who freed which key is noted (acknowledged or not)."""

        async def retire_and_note() -> bool:
            inner = cast(Any, self.inner)
            # Read where every write's ungated reads go (``pre_reads``): on a
            # connection the shared-SQLite machine holds, whether the read came
            # back within its rule decided which group the retirement joined.
            before = await self.pre_reads.get(receipt.action_id)
            done = bool(await inner.retire(receipt, **options))
            contender = _current.get(None)
            if done and contender is not None:
                contender.retired.append(receipt.action_id)
                after = await self.pre_reads.get(receipt.action_id)
                # The write is conditional on the version it retired: the one read before.
                if before is not None and after is not None and before.version + 1 == after.version:
                    contender.retired_spans.append((before, after))
            return done

        return await self._write("retire", retire_and_note)

    async def prune(self, **arguments: Any) -> int:
        """Gated like any write; every receipt it deleted is noted as legitimately gone."""

        async def prune_and_note() -> int:
            seen: dict[str, ActionReceipt] = {}

            def note(batch: Any) -> None:
                seen.update((r.action_id, r) for r in batch)

            inner = cast(Any, self.inner)
            deleted = int(await inner.prune(**arguments, before_delete=note))
            contender = _current.get(None)
            for action_id, receipt in seen.items():
                if await self.inner.get(action_id) is None:
                    self.released.add(action_id)
                    if contender is not None:
                        contender.pruned.append(receipt)
            return deleted

        return await self._write("prune", prune_and_note)


class WorldProvider:
    """A provider backed by the abstract world, faulted at its gate.

    At each call it also notes, from an ungated observer of the ledger, how
    many attempts the claim had durably counted: the history, not the
    runner's private state, shows whether an invocation was counted first.
    """

    def __init__(
        self, world: World, scheduler: Scheduler, history: History, observer: Ledger
    ) -> None:
        self.world = world
        self.scheduler = scheduler
        self.history = history
        self.observer = observer
        #: Every invocation, in order: (reference, contender, allowed for the claim).
        self.calls_by_claim: list[tuple[str, Contender, bool]] = []
        #: References whose latest invocation was cleared for another one by
        #: definitive, retry-safe evidence (whoever observed it).
        self.cleared: dict[str, bool] = {}
        #: Whether each call notes if its caller held the claim (``invoked_unheld``).
        self.judges_holding = False

    async def _note_whether_held(self, contender: Contender) -> None:
        """Whether the operation was invoked while its caller held the claim.

        Read as the operation starts, before its gate: a holder parked at the
        provider after that (a zombie to be) was invoked in time. A lease
        that ran out by the ledger's clock with the claim still under the
        caller's token is not judged: ``lease_runs_out`` moves the ledger's
        clock alone, which the caller's own clock cannot see.
        """
        context = current_attempt()
        if context is None or not self.judges_holding:
            return
        stored = await self.observer.get(context.action_id)
        if stored is None:
            why = "the claim is not in the ledger"
        elif not stored.is_pending:
            why = f"the claim was already completed {stored.final_status}"
        elif stored.fencing_token != context.fencing_token:
            why = f"the claim had passed to fencing token {stored.fencing_token}"
        else:
            return
        contender.invoked_unheld.append(
            f"invoked attempt {context.attempt} of claim {context.action_id[:8]} under fencing "
            f"token {context.fencing_token} although {why}"
        )

    async def charge(self, action_name: str, key: str, reference: str) -> str:
        await self._note_whether_held(_current.get())
        decision = await self.scheduler.gate("provider.charge")
        fault = ProviderFault.NONE if decision is None else decision
        contender = _current.get()
        REACHED[("provider", fault.name)] += 1
        if contender.in_thread:
            REACHED[("provider from a worker thread", fault.name)] += 1
        stored = await self.observer.find(action_name, *reversed(split_key(key)))
        contender.durable_attempts_at_call.append(
            (0, None) if stored is None else (stored.attempts, stored.claim_state.value)
        )
        contender.ledger_calls_at_call.append(len(contender.ledger_faults))
        # The claim's attempt number, as the runner tells the operation: a
        # taker's first call is its claim's second attempt, not its own first.
        context = current_attempt()
        attempt = len(contender.provider_calls) + 1 if context is None else context.attempt
        # A request the provider refuses as fenced cannot mutate anything: it
        # needs no licence (a zombie's late request is exactly that).
        fenced = self.world.is_fenced(reference, attempt)
        contender.call_allowed.append(
            fenced or not contender.provider_calls or contender.cleared_since_last_call
        )
        # One claim per reference (a released claim never invoked anything), so
        # the reference names the claim across contenders.
        self.calls_by_claim.append(
            (reference, contender, fenced or self.cleared.get(reference, True))
        )
        contender.provider_calls.append(fault)
        if fenced:
            # Refused outright, so nothing happened: what cleared the claim for
            # another call still holds, and this call clears its caller too.
            contender.cleared_since_last_call = True
            # The provider refuses a fenced request outright: nothing commits.
            self.history.add(
                f"contender {contender.name}",
                f"provider charge {reference} (attempt {attempt}): refused, the attempt is "
                f"fenced [nothing; effects now {self.world.count(reference)}]",
                reference=reference,
                fault="FENCED",
                committed=False,
            )
            raise DefinitiveFailure("the provider refused a fenced request")
        self.cleared[reference] = fault is ProviderFault.REJECT_RETRYABLE
        contender.cleared_since_last_call = fault is ProviderFault.REJECT_RETRYABLE
        effect = None
        if fault in COMMITTING:
            effect = self.world.commit(reference, attempt)
        elif fault is ProviderFault.LATE_COMMIT:
            self.world.send_in_flight(reference, attempt)
        truth = (
            "committed"
            if effect
            else ("in flight" if fault is ProviderFault.LATE_COMMIT else "nothing")
        )
        self.history.add(
            f"contender {contender.name}",
            f"provider charge {reference} (attempt {attempt}): {fault.value} [{truth}; effects "
            f"now {self.world.count(reference)}]",
            reference=reference,
            fault=fault.name,
            committed=effect is not None,
        )
        if fault is ProviderFault.FAIL_BEFORE_SEND:
            raise ConnectionRefusedError("could not reach the provider")
        if fault is ProviderFault.DECLINE:
            raise DefinitiveFailure("declined")
        if fault is ProviderFault.REJECT_RETRYABLE:
            raise DefinitiveFailure("rejected before processing", retryable=True)
        if fault in (ProviderFault.COMMIT_THEN_TIMEOUT, ProviderFault.LATE_COMMIT):
            raise TimeoutError("provider timed out")
        if fault is ProviderFault.COMMIT_THEN_RESET:
            raise ConnectionResetError("connection reset")
        if fault is ProviderFault.COMMIT_THEN_GARBAGE:
            raise ValueError("unparseable provider response")
        assert effect is not None
        return effect


class WorldVerifier:
    """A read-only verifier over the world; its gate decides how it answers."""

    def __init__(
        self,
        world: World,
        scheduler: Scheduler,
        history: History,
        cleared: dict[str, bool] | None = None,
    ) -> None:
        self.world = world
        self.scheduler = scheduler
        self.history = history
        # Shared with WorldProvider: a retry-safe absence clears the claim for a retry.
        self.cleared = cleared if cleared is not None else {}

    def truthful(self, reference: str, attempts: int) -> tuple[VerificationResult, str]:
        """What the world shows, without fencing anything."""
        if self.world.holds(reference):
            first = self.world.effects[reference][0]
            return (
                VerificationResult.confirmed(
                    verified_provider_reference=reference, provider_request_id=first
                ),
                "confirmed",
            )
        if self.world.may_appear_later(reference) or not self.world.is_fenced(reference, attempts):
            return VerificationResult.absent(verified_provider_reference=reference), "absent"
        return (
            VerificationResult.absent(verified_provider_reference=reference, retry_safe=True),
            "absent retry-safe",
        )

    async def verify(self, receipt: ActionReceipt) -> VerificationResult:
        decision = await self.scheduler.gate("verifier.verify")
        answer = VerifierAnswer.TRUTHFUL if decision is None else decision
        reference = receipt.provider_reference or ""
        contender = _current.get(None)
        if answer is VerifierAnswer.TRUTHFUL and reference:
            # A careful verifier fences the attempts it judges before it reads,
            # so that "absent" can honestly mean "can never commit".
            self.world.fence(reference, receipt.attempts)
        truth, truth_label = self.truthful(reference, receipt.attempts)
        if answer is VerifierAnswer.TRUTHFUL:
            result, label = truth, truth_label
        elif answer is VerifierAnswer.STALE_ABSENT:
            result = VerificationResult.absent(verified_provider_reference=reference)
            label = "absent"
        elif answer is VerifierAnswer.UNKNOWN:
            result, label = VerificationResult.unknown(reason="read path down"), "unknown"
        elif answer is VerifierAnswer.RAISES:
            label = "raises"
            result = None
        elif answer is VerifierAnswer.NOT_A_RESULT:
            # A buggy adapter's answer: truthy, shaped like a confirmation, and
            # worthless as evidence.
            label = "not a result"
            result = {"status": "confirmed", "reference": reference}  # type: ignore[assignment]
        else:
            opposite = (
                VerificationResult.absent
                if self.world.holds(reference)
                else VerificationResult.confirmed
            )
            if answer is VerifierAnswer.WRONG_REFERENCE:
                other = f"{reference}-other"
                result = (
                    # mypy 1.16 (the lower bound) does not narrow ``opposite`` by the test below.
                    opposite(verified_provider_reference=other, retry_safe=True)  # type: ignore[call-arg, unused-ignore]
                    if opposite is VerificationResult.absent
                    else VerificationResult.confirmed(verified_provider_reference=other)
                )
                label = "wrong reference"
            else:
                result = (
                    VerificationResult.absent(
                        verified_provider_reference=reference,
                        retry_safe=True,
                        health=VerificationHealth.DEGRADED,
                    )
                    if self.world.holds(reference)
                    else VerificationResult(
                        outcome=VerificationResult.confirmed(
                            verified_provider_reference=reference
                        ).outcome,
                        health=VerificationHealth.DEGRADED,
                        verified_provider_reference=reference,
                    )
                )
                label = "unhealthy"
        REACHED[("verifier", label)] += 1
        if contender is not None:
            contender.verifier_answers.append((answer, label))
            if label == "absent retry-safe":
                contender.cleared_since_last_call = True
        if label == "absent retry-safe":
            self.cleared[reference] = True
        self.history.add(
            f"contender {contender.name}" if contender else "observer",
            f"verifier for {reference}: {label} (world: {truth_label})",
            reference=reference,
            answer=answer.name,
            label=label,
            truth=truth_label,
        )
        if result is None:
            raise RuntimeError("verifier crashed")
        return result


#: How many times the profile's examples the in-memory runner machine runs.
#: It hunts more bugs than any other machine (over sixty planted, a few of
#: which need a zombie, a lease's exact end or a freed key all in one run),
#: and at the profile's 200 a fresh seed missed one of eleven of them about
#: one time in ten; at 600 none was missed (stateful_tests/LOG.md). It costs
#: some 12 s of one CI worker.
IN_MEMORY_RUNNER_FACTOR = 3


def in_memory_runner_settings() -> settings:
    """The active profile with IN_MEMORY_RUNNER_FACTOR times its examples (the in-memory runner machine)."""
    profile = settings()
    return settings(profile, max_examples=profile.max_examples * IN_MEMORY_RUNNER_FACTOR)


def io_bound_settings() -> settings:
    """The active profile with a quarter of its examples, for machines whose every
    ledger call is a file write or a server round trip (at least 10 examples).

    The in-memory machines get the whole budget: they run the same rules some
    ten times faster, and the detection rates in LOG.md are measured on them.
    """
    profile = settings()
    return settings(profile, max_examples=max(10, profile.max_examples // 4))


def shared_connection_settings() -> settings:
    """The active profile's whole budget, for the runner machine on one SQLite connection.

    It alone fails a group's COMMIT under the real runner (``group_rules``);
    an I/O-bound quarter found its planted bug by too few seeds.
    """
    return settings()
