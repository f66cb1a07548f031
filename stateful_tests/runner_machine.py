"""The runner machine: concurrent contenders, faults on both sides of the commit.

Contenders run real ``execute`` / ``reconcile`` / ``recover_pending`` /
``release_unstarted`` calls. Rules start contenders, advance one parked
contender past one gate (drawing the fault or verifier answer there), crash
contenders, and let in-flight provider requests commit or be fenced. After
every step the invariants of ``invariants.py`` are checked against the
recorded history, the abstract world and the ledger as an observer sees it.
"""

from __future__ import annotations

import asyncio
import functools
import shutil
import tempfile
import threading
import warnings
from datetime import timedelta
from pathlib import Path
from typing import Any, ClassVar, Final

import rfc8785
from hypothesis import event, note
from hypothesis import strategies as st
from hypothesis.stateful import (
    Bundle,
    RuleBasedStateMachine,
    initialize,
    invariant,
    multiple,
    precondition,
)

import dataoad._evidence as evidence_module
from dataoad import (
    ActionReceipt,
    ActionResult,
    ActionRunner,
    ActionStatus,
    InMemoryLedger,
    Ledger,
    PostgresLedger,
    RetryPolicy,
    SQLiteLedger,
    current_attempt,
)
from dataoad._bounds import DEFAULT_MAX_REQUEST_BYTES
from dataoad.testing import unstarted_claim
from models.world import World
from stateful_tests import (
    bound_invariants,  # noqa: F401  (registers the bound properties)
    lease_invariants,  # noqa: F401  (registers the lease properties)
    lifecycle_invariants,  # noqa: F401  (registers the lifecycle properties)
)
from stateful_tests import invariants as inv
from stateful_tests.bound_rules import BoundRules
from stateful_tests.group_rules import GroupCommitRules
from stateful_tests.harness import (
    REACHED,
    WRITE_FAULTS,
    Contender,
    Crashed,
    GatedLedger,
    History,
    LeaseGrant,
    LedgerFault,
    MachineLoop,
    ProviderFault,
    Scheduler,
    VerifierAnswer,
    WorldProvider,
    WorldVerifier,
    contender_name,
    current_contender,
    split_key,
)
from stateful_tests.lease_rules import LEASE, Heartbeats, LeaseRules, LedgerClock
from stateful_tests.lifecycle_rules import EARLY_SKEW, LifecycleRules, SkewedClock
from stateful_tests.postgres_tables import (
    PostgresStorageReads,
    Snapshot,
    empty_table,
    give_back,
)
from stateful_tests.reach import rule
from stateful_tests.sqlite_files import SQLiteStorageReads, new_ledger_file
from stateful_tests.violations import InvariantViolation, violation_type
from suite_support.services import PostgresTestTable

ACTION = "charge"
#: At most this many contenders are in flight at once.
MAX_ACTIVE = 3
KEYS = ("order-1", "order-2")
#: Keys a run may reach: each claim invokes the provider for its first
#: claimer only, so a run that settled its keys needs new orders to go on
#: finding bugs in a claim's lifecycle.
MAX_KEYS = 6


with warnings.catch_warnings():
    warnings.simplefilter("ignore", RuntimeWarning)
    ESCAPE_HATCH = RetryPolicy(max_attempts=2, retry_on_unknown=True)
POLICIES = {
    "default": RetryPolicy(),
    "retry-failed": RetryPolicy(max_attempts=3, retry_on_failed=True),
    "retry-unknown (escape hatch)": ESCAPE_HATCH,
}

#: How long a duplicate waits for the claim holder (virtual seconds; see VirtualClock).
#: "wait 3 s" gives the holder about 17 looks at the claim to settle in, so
#: the duplicate's wait often ends in a replay rather than running out.
WAITS = {
    "no wait": None,
    "wait 0 s": 0.0,
    "wait 0.02 s": 0.02,
    "wait 1 s": 1.0,
    "wait 3 s": 3.0,
}


class VirtualClock:
    """Time for ``wait_in_progress`` that passes only when a waiter sleeps.

    Real time would make a shrunk trace depend on the machine's speed; here a
    waiter's deadline is reached after a fixed number of looks at the claim.
    A lease renewal's sleep passes no time: it waits for a ``heartbeat`` step.
    """

    def __init__(self, heartbeats: Heartbeats) -> None:
        self.now = 0.0
        self.heartbeats = heartbeats

    def monotonic(self) -> float:
        contender = current_contender()
        if contender is not None:
            contender.clock_readings.append(self.now)
        return self.now

    async def sleep(self, seconds: float) -> None:
        contender = current_contender()
        if self.heartbeats.is_renewal():
            await self.heartbeats.wait(contender.name if contender is not None else "?")
            return
        if contender is not None:
            contender.waited = True
            contender.pauses.append((self.now, seconds))
        self.now += seconds
        await asyncio.sleep(0)


# Unfaulted calls are weighted up so that runs make progress between faults.
LEDGER_DECISIONS = st.sampled_from([LedgerFault.NONE] * 10 + list(WRITE_FAULTS)[1:])
# On SQLite a write may also meet another process stuck holding the writer lock.
# It costs real time (the client's busy_timeout), so it is drawn half as
# often as the other write faults.
SQLITE_WRITE_DECISIONS = st.sampled_from(
    [LedgerFault.NONE] * 20 + list(WRITE_FAULTS)[1:] * 2 + [LedgerFault.LOCK_HELD]
)
READ_DECISIONS = st.sampled_from([LedgerFault.NONE] * 12 + [LedgerFault.FAIL_BEFORE_WRITE])
# A waiting duplicate looks at the claim many times; faulting each look as
# often as a single read would end nearly every long wait in a read error.
WAITING_READ_DECISIONS = st.sampled_from([LedgerFault.NONE] * 40 + [LedgerFault.FAIL_BEFORE_WRITE])
# Releases are rare operator actions; when one happens, fault it often.
RELEASE_DECISIONS = st.sampled_from([LedgerFault.NONE] * 2 + list(WRITE_FAULTS)[1:])
# Definitive failures are listed more than once: only they exercise the retry
# policy's FAILED branch, which needs a retrying policy as well, and a decline
# after an ambiguous attempt is where UNKNOWN evidence must survive. So is the
# error raised before sending: it is the one ambiguous error after which
# nothing committed, against three after which something did, and only it
# tests that a verifier's word is checked rather than borne out by the world.
PROVIDER_DECISIONS = st.sampled_from(
    [
        *ProviderFault,
        ProviderFault.REJECT_RETRYABLE,
        ProviderFault.DECLINE,
        ProviderFault.DECLINE,
        ProviderFault.FAIL_BEFORE_SEND,
    ]
)
# With a verifier, a normal return is drawn more often: it is the one outcome
# the runner must not take as proof, so the verifier's answer then decides.
PROVIDER_WITH_VERIFIER_DECISIONS = st.sampled_from(
    [ProviderFault.NONE] * 5 + list(PROVIDER_DECISIONS.elements)  # type: ignore[attr-defined, unused-ignore]
)
# The escape hatch's retry after an ambiguous attempt: a definitive answer
# this time is what must not erase the earlier ambiguity (it may have
# committed), so a decline is drawn there more often.
AMBIGUOUS = {
    ProviderFault.COMMIT_THEN_TIMEOUT,
    ProviderFault.COMMIT_THEN_RESET,
    ProviderFault.COMMIT_THEN_GARBAGE,
    ProviderFault.LATE_COMMIT,
    ProviderFault.FAIL_BEFORE_SEND,
}
PROVIDER_AFTER_AMBIGUITY_DECISIONS = st.sampled_from(
    [ProviderFault.DECLINE] * 3
    + [ProviderFault.REJECT_RETRYABLE]
    + list(PROVIDER_DECISIONS.elements)  # type: ignore[attr-defined, unused-ignore]
)
VERIFIER_DECISIONS = st.sampled_from([VerifierAnswer.TRUTHFUL] * 3 + list(VerifierAnswer)[1:])
# After a normal return the verifier is the only evidence: whether a broken
# verifier is then read as proof (it must not be) needs it broken often.
VERIFIER_AFTER_RETURN_DECISIONS = st.sampled_from(
    [VerifierAnswer.TRUTHFUL] * 2
    + [VerifierAnswer.RAISES, VerifierAnswer.NOT_A_RESULT] * 2
    + list(VerifierAnswer)[1:]
)
#: The SQLite clients' busy_timeout: a write that meets a stuck lock holder
#: must give up within it (property lock-waits-are-bounded).
SQLITE_BUSY_TIMEOUT = 0.02

#: Observations a receipt keeps, lowered from the library's default so that
#: runs reach the bound (see dataoad._evidence.keep_observations).
OBSERVATION_LIMIT = 2

#: Crashes per run: enough to reach every protocol point, few enough to make progress.
MAX_CRASHES = 2
#: Where an async operation that hands its work to a thread of its own runs it.
HANDED_OFF: Final = "a thread its async operation handed it to"


# A zombie's calls, in a run that arranged one: they still meet every fault,
# but its evidence reaches the ledger in most runs (see holder_outlives_its_lease).
CALM = st.just(LedgerFault.NONE)
TRUTHFUL = st.just(VerifierAnswer.TRUTHFUL)

# A retry's attempt start, after the operation already ran, is where a write
# failure is most telling (the error must say the operation was invoked):
# fault it more often than a first start.
RETRY_START_DECISIONS = st.sampled_from([LedgerFault.NONE] * 3 + list(WRITE_FAULTS)[1:])


def _decisions_for(gate: str, contender: Contender, backend: str) -> st.SearchStrategy[Any]:
    if gate in ("ledger.get", "ledger.find") and contender.waited:
        return WAITING_READ_DECISIONS
    if gate == "provider.charge":
        if (
            contender.escape_hatch
            and contender.provider_calls[-1:]
            and (contender.provider_calls[-1] in AMBIGUOUS)
        ):
            return PROVIDER_AFTER_AMBIGUITY_DECISIONS
        return PROVIDER_WITH_VERIFIER_DECISIONS if contender.with_verifier else PROVIDER_DECISIONS
    if gate == "verifier.verify":
        if contender.provider_calls and contender.provider_calls[-1] is ProviderFault.NONE:
            return VERIFIER_AFTER_RETURN_DECISIONS
        return VERIFIER_DECISIONS
    if gate in ("ledger.get", "ledger.find", "ledger.receipts"):
        return READ_DECISIONS
    if gate == "ledger.release":
        return RELEASE_DECISIONS
    if gate == "ledger.start_attempt" and contender.provider_calls and backend != "sqlite":
        return RETRY_START_DECISIONS
    if backend == "sqlite":
        return SQLITE_WRITE_DECISIONS
    return LEDGER_DECISIONS


#: How an execute call is drawn (the key aside).
EXECUTE_ARGUMENTS: dict[str, st.SearchStrategy[Any]] = {
    # Mostly the key's usual order. A duplicate asking for another amount
    # or reference is a conflict and ends at once; drawn at even odds, three
    # duplicates in four were conflicts, and they crowded out the replays.
    "amount": st.sampled_from([100] * 9 + [250]),
    "alternate_reference": st.sampled_from([False] * 9 + [True]),
    # The retrying policies listed twice: the default stops after one attempt.
    "policy": st.sampled_from([*sorted(POLICIES), *sorted(POLICIES)[1:]]),
    "with_verifier": st.booleans(),
    # A wait that runs out at once is listed twice: it is where a waiter
    # decides what to do about a claim it does not hold.
    "wait": st.sampled_from(["no wait", "wait 0 s", *list(WAITS)[1:]]),
    "form": st.sampled_from(["as built", "as built", "keys reversed", "amount as float"]),
    # An async operation may hand its work to a thread of its own (how an
    # engine's async step calls a sync SDK): cancelling it does not stop that thread.
    "runs_in": st.sampled_from(["the event loop", "a worker thread", HANDED_OFF]),
}


#: A duplicate of a running holder: mostly one that waits for it. What a
#: waiter does when its wait runs out (take the claim, settle it, invoke)
#: is where the holder-protecting bugs live; "no wait" is still drawn.
DUPLICATE_ARGUMENTS: dict[str, st.SearchStrategy[Any]] = {
    **EXECUTE_ARGUMENTS,
    "wait": st.sampled_from(["no wait", *list(WAITS)[1:], "wait 0 s", "wait 0.02 s"]),
}


class RunnerMachineBase(LifecycleRules, LeaseRules, BoundRules, RuleBasedStateMachine):
    """Backend-independent rules; subclasses choose the ledger and the runner."""

    backend: ClassVar[str] = "memory"
    execute_arguments: ClassVar[dict[str, st.SearchStrategy[Any]]] = EXECUTE_ARGUMENTS
    max_active: ClassVar[int] = MAX_ACTIVE
    runner_class: ClassVar[type[ActionRunner]] = ActionRunner
    ledger_class: ClassVar[type[Any] | None] = None  # overrides the backend's ledger class

    keys = Bundle("keys")

    def __init__(self) -> None:
        super().__init__()
        self.loop = MachineLoop()
        self.history = History(type(self).__name__)
        self.world = World()
        self.scheduler = Scheduler(self.loop)
        self.contenders_list: list[Contender] = []
        self.observed: dict[str, ActionReceipt] = {}
        self.transitions: dict[str, tuple[ActionReceipt, ActionReceipt | None]] = {}
        self.released_ids: set[str] = set()
        self.crashes = 0
        self.order_keys: list[str] = []
        #: Every provider reference a key's calls used (one per generation of the key).
        self.references: dict[str, set[str]] = {}
        self.heartbeats = Heartbeats()
        self.virtual_time = VirtualClock(self.heartbeats)
        self.ledger_clock = LedgerClock()
        self.ledger_clock.frozen = self.clock_stands_still
        #: action_id -> the last committed write that granted its claim a lease.
        self.lease_grants: dict[str, LeaseGrant] = {}
        # The escape-hatch policy warns on every retry of UNKNOWN. One filter for
        # the whole run: catch_warnings inside concurrent tasks would save and
        # restore the process-wide filters out of order (and a task cancelled
        # at teardown would never restore them), so the next run would differ.
        self.saved_warning_filters = list(warnings.filters)
        warnings.simplefilter("ignore", RuntimeWarning)
        self.saved_observation_limit = evidence_module.MAX_KEPT_OBSERVATIONS
        evidence_module.MAX_KEPT_OBSERVATIONS = OBSERVATION_LIMIT
        #: The bounds the bound properties judge by (None: not met on this backend).
        self.observation_bound: int | None = OBSERVATION_LIMIT
        self.busy_timeout: float | None = SQLITE_BUSY_TIMEOUT if self.backend == "sqlite" else None
        self.folder: Path | None = None
        self.clients: list[Ledger] = []
        self.postgres: PostgresTestTable | None = None
        if self.backend == "sqlite":
            self.folder = Path(tempfile.mkdtemp(prefix="dataoad-machine-"))
            new_ledger_file(self.folder / "ledger.sqlite3")
        elif self.backend == "postgres":
            self.postgres = self.loop.run(empty_table())
        self.observer = self.new_client()
        self.storage_reads: SQLiteStorageReads | None = None
        if self.folder is not None and SQLiteStorageReads.reads_like_the_ledger(self.observer):
            self.storage_reads = SQLiteStorageReads(self.folder / "ledger.sqlite3")
        self.table_reads: PostgresStorageReads | None = None
        if self.postgres is not None and PostgresStorageReads.reads_like_the_ledger(self.observer):
            assert isinstance(self.observer, PostgresLedger)
            self.table_reads = PostgresStorageReads.of(self.observer, self.postgres.dsn)
        self.provider = WorldProvider(self.world, self.scheduler, self.history, self.observer)
        self.provider.judges_holding = True
        self.verifier = WorldVerifier(
            self.world, self.scheduler, self.history, cleared=self.provider.cleared
        )

    def new_client(self) -> Ledger:
        """A ledger client on the machine's storage: shared in memory, a new connection otherwise."""
        if self.backend == "sqlite":
            assert self.folder is not None
            cls = self.ledger_class or SQLiteLedger
            client: Ledger = cls(
                self.folder / "ledger.sqlite3",
                busy_timeout=SQLITE_BUSY_TIMEOUT,
                clock=self.ledger_clock.ticking,
            )
            self.clients.append(client)
            return client
        if self.backend == "postgres":
            assert self.postgres is not None
            # The test server is no transaction pooler: the probe that asks
            # (a connection of its own per client) is not what the machine tests.
            client = self.postgres.client(
                clock=self.ledger_clock.ticking, transaction_pooling=False
            )
            self.clients.append(client)
            return client
        if not self.clients:
            cls = self.ledger_class or InMemoryLedger
            self.clients.append(cls(clock=self.ledger_clock.ticking))
        return self.clients[0]

    def clock_stands_still(self) -> bool:
        """Whether the ledger's clock must not tick (see ``LedgerClock``)."""
        return self.asking_too_early() or self.lease_edge_pending()

    def gated(self, client: Ledger) -> GatedLedger:
        """A contender's view of ``client``: every call parks at its gate."""
        return GatedLedger(
            client,
            self.scheduler,
            self.released_ids,
            self.history,
            clock=self.ledger_clock,
            lease_grants=self.lease_grants,
        )

    def _after_lease_step(self) -> None:
        self._observe()

    def teardown(self) -> None:
        try:
            self.scheduler.stop_all(self.contenders_list)
            evidence_module.MAX_KEPT_OBSERVATIONS = self.saved_observation_limit
            warnings.filters[:] = self.saved_warning_filters  # type: ignore[index, unused-ignore]  # a list at runtime
            if self.storage_reads is not None:
                self.storage_reads.close()
            if self.table_reads is not None:
                self.loop.run(self.table_reads.close())

            # Closed together: each SQLite client ends a thread of its own.
            async def close_all() -> list[BaseException | None]:
                return await asyncio.gather(
                    *(c.close() for c in self.clients), return_exceptions=True
                )

            closed = self.loop.run(close_all())
            for outcome in closed:
                if isinstance(outcome, BaseException):
                    raise outcome
            if self.postgres is not None:
                give_back(self.postgres)  # every client closed: the next example empties it
        finally:
            self.loop.close()
            if self.folder is not None:
                shutil.rmtree(self.folder, ignore_errors=True)

    # -- rules ---------------------------------------------------------------------

    # One run in four the provider ignores fencing tokens: a zombie's late
    # request may then land whatever the verifier saw, so no truthful absence
    # of a started attempt is retry-safe, and the runner must stay safe
    # without ever relying on a fence (README: what leases cannot promise).
    @initialize(target=keys, honours_fencing=st.sampled_from([True, True, True, False]))
    def the_keys(self, honours_fencing: bool = True) -> Any:
        self.order_keys = list(KEYS)
        self.world.honours_fencing = honours_fencing
        if not honours_fencing:
            self.history.add("provider", "ignores fencing tokens: no request is ever refused")
        return multiple(*KEYS)

    def _unclaimed_keys(self) -> list[str]:
        called = {c.key for c in self.contenders_list}
        return [key for key in self.order_keys if key not in called]

    # Most bugs in a claim's lifecycle need its first caller (only it invokes
    # the provider) with a particular policy and faults. With only duplicates
    # drawn from the bundle of keys, three executes in four were duplicates and
    # a run made about 1.8 provider calls; this rule gives a fresh order its
    # first caller.
    @precondition(
        lambda self: (
            self._active() < MAX_ACTIVE
            and (len(self.order_keys) < MAX_KEYS or bool(self._unclaimed_keys()))
        )
    )
    @rule(target=keys, **EXECUTE_ARGUMENTS)  # type: ignore[call-overload, untyped-decorator, misc, unused-ignore]
    def first_call_for_a_new_order(self, **arguments: Any) -> Any:
        """A key nobody has called yet (a new order, if need be) gets its first execute."""
        unclaimed = self._unclaimed_keys()
        if unclaimed:
            self.start_execute(unclaimed[0], **arguments)
            return multiple()
        number = len(self.order_keys) + 1
        # Every third new order is another tenant's, with the same idempotency
        # key as an order of the default namespace: the two must never meet.
        key = f"t/order-{number - 2}" if number % 3 == 0 else f"order-{number}"
        self.order_keys.append(key)
        self.start_execute(key, **arguments)
        return key

    def _start(self, contender: Contender, body: Any) -> None:
        self.contenders_list.append(contender)
        self.history.step += 1
        self.scheduler.start(contender, body)
        self._after(contender)

    def _active(self) -> int:
        return sum(1 for c in self.contenders_list if not c.finished)

    @precondition(lambda self: self._active() < MAX_ACTIVE)
    @rule(key=keys, **EXECUTE_ARGUMENTS)  # type: ignore[call-overload, untyped-decorator, misc, unused-ignore]
    def start_execute(
        self,
        key: str,
        amount: int,
        alternate_reference: bool,
        policy: str,
        with_verifier: bool,
        wait: str,
        form: str = "as built",
        runs_in: str = "the event loop",
        expires: bool = False,
        early: float = 0.0,
        request_bound: str | None = None,
    ) -> None:
        if split_key(key)[0] in self.namespaces_being_pruned() or (
            not expires and key in self.keys_being_freed()
        ):
            # Its caller would still use the reference of the key's last claim.
            self.history.add("machine", f"no plain execute of {key} while its key is freed")
            return
        name = contender_name(len(self.contenders_list))
        namespace, idempotency_key = split_key(key)
        # A key freed (expired, reopened) is claimed afresh for a new mutation,
        # with the provider reference of that new mutation.
        generation = self.generation(key) + (1 if expires else 0)
        reference = (
            f"{namespace + '/' if namespace else ''}ref-{idempotency_key}"
            + (f"~{generation}" if generation else "")
            + ("-alt" if alternate_reference else "")
        )
        self.references.setdefault(key, set()).add(reference)
        expires_after = self.expiry_age(key, early=early) if expires else None
        c = Contender(
            name,
            "execute",
            key,
            reference,
            policy=POLICIES[policy],
            with_verifier=with_verifier,
            escape_hatch=POLICIES[policy].retry_on_unknown,
            amount=amount,
            namespace=namespace,
            expires_after=expires_after,
        )
        c.too_early_by = early
        c.wait = WAITS[wait]
        c.request_bound = request_bound
        held = self.holder(key)
        if expires and not early and held is not None and self._definitive(key):
            c.expires_exactly = (held.action_id, held.version)
        self.history.add(
            f"contender {name}",
            f"execute {key} (amount {amount}, reference {reference}, policy {policy}, "
            f"{'with' if with_verifier else 'no'} verifier, {wait} for a claim holder, "
            f"request {form}, operation runs on {runs_in}"
            + (
                f", expires_after={expires_after:g} s, which the key's receipt has "
                + (
                    f"not reached by the ledger's clock (by {early:g} s), its own clock "
                    f"{EARLY_SKEW} fast"
                    if early
                    else "reached by the ledger's clock"
                )
                if expires_after is not None
                else ""
            )
            + ")",
        )
        # The same request written differently must hash the same (RFC 8785).
        request: dict[str, Any] = {"key": key, "amount": amount}
        if form == "keys reversed":
            request = {"amount": amount, "key": key}
        elif form == "amount as float":
            request = {"key": key, "amount": float(amount)}
        size = len(rfc8785.dumps(request))
        bound = {None: DEFAULT_MAX_REQUEST_BYTES, "exactly": size, "a byte short": size - 1}
        if request_bound is not None:
            self.history.add(
                f"contender {name}",
                f"its runner's max_request_bytes={bound[request_bound]}; the request is "
                f"{size} bytes in canonical form",
            )
        client = self.new_client()
        runner = self.runner_class(
            self.gated(client),
            max_request_bytes=bound[request_bound],
            policy=POLICIES[policy],
            clock=SkewedClock(self.virtual_time, EARLY_SKEW if early else timedelta())
            if expires
            else self.virtual_time,
            lease=LEASE,
            owner=name,
            namespace=namespace,
        )

        c.in_thread = runs_in != "the event loop"

        async def acting() -> str:
            # The thread's provider call, run on the loop: while it is under
            # way, what the thread does may still reach the provider under
            # the claim and token it was given (no-settling-while-its-operation-acts).
            context = current_attempt()
            assert context is not None
            mine = c.acting_under = (context.action_id, context.fencing_token)
            answered = c.answered = asyncio.get_running_loop().create_future()
            try:
                return await self.provider.charge(ACTION, key, reference)
            finally:
                if c.acting_under == mine:
                    c.acting_under = None
                answered.set_result(None)

        async def body() -> Any:
            operation: Any = functools.partial(self.provider.charge, ACTION, key, reference)
            if c.in_thread:
                loop = asyncio.get_running_loop()
                loop_thread = threading.get_ident()

                def blocking_charge() -> str:
                    # A sync operation: the runner must call it on a worker
                    # thread, where it blocks on the (gated) provider call.
                    if loop_thread == threading.get_ident():
                        # On the loop it would block the loop for ever: note it
                        # (property sync-operations-run-off-the-loop) and refuse.
                        c.ran_on_loop = True
                        raise RuntimeError("a sync operation was called on the event loop")
                    return asyncio.run_coroutine_threadsafe(acting(), loop).result()

                operation = blocking_charge
                if runs_in == HANDED_OFF:

                    async def handed_off() -> str:
                        return await asyncio.to_thread(blocking_charge)

                    operation = handed_off
            return await runner.execute(
                ACTION,
                operation,
                request=request,
                idempotency_key=idempotency_key,
                provider_reference=reference,
                verifier=self.verifier if with_verifier else None,
                wait_in_progress=WAITS[wait],
                expires_after=c.expires_after,
            )

        self._start(c, body)

    # Claims made before the fused claim (v0.1: a claim, then a separate
    # attempt start) may still be in a ledger: a worker that died between the
    # two left its key held with no attempt counted. Only such a claim can be
    # released, or be invoked by its taker; the runner never makes one now.
    @precondition(lambda self: self._active() < MAX_ACTIVE and bool(self._unclaimed_keys()))
    @rule(amount=EXECUTE_ARGUMENTS["amount"])
    def a_v01_worker_died_between_claim_and_start(self, amount: int) -> None:
        """A v0.1 worker claims a fresh key (attempt not counted) and dies before starting it."""
        key = self._unclaimed_keys()[0]
        namespace, idempotency_key = split_key(key)
        reference = f"{namespace + '/' if namespace else ''}ref-{idempotency_key}"
        self.references.setdefault(key, set()).add(reference)
        name = contender_name(len(self.contenders_list))
        c = Contender(name, "execute", key, reference, amount=amount, namespace=namespace)
        self.history.add(
            f"contender {name}",
            f"a v0.1 worker: claims {key} (amount {amount}, reference {reference}) without "
            "counting an attempt, then dies before its attempt start",
        )
        legacy = unstarted_claim(
            ACTION,
            idempotency_key,
            {"key": key, "amount": amount},
            provider_reference=reference,
            owner=name,
            namespace=namespace,
        )
        gated = self.gated(self.new_client())

        async def body() -> Any:
            await gated.claim(legacy, lease=LEASE)
            c.crashed = True  # it dies here: nothing else of it ever runs
            raise Crashed(f"contender {name} (v0.1) died before its attempt start")

        self._start(c, body)

    def _keys_in_flight(self) -> list[str]:
        return sorted(
            {
                c.key
                for c in self.contenders_list
                if c.kind == "execute" and c.claims and not c.finished
            }
        )

    # A duplicate drawn from the bundle of keys often came after its key's
    # holder had finished; the bugs of waiting, in-progress answers and
    # takeover all need the two to meet, so this rule arranges it (a race for
    # the claim itself is left to start_execute).
    @precondition(lambda self: self._active() < MAX_ACTIVE and bool(self._keys_in_flight()))
    @rule(data=st.data(), **DUPLICATE_ARGUMENTS)  # type: ignore[call-overload, untyped-decorator, misc, unused-ignore]
    def duplicate_while_the_holder_runs(self, data: st.DataObject, **arguments: Any) -> None:
        """A duplicate call for a key whose claim holder has not finished."""
        key = data.draw(st.sampled_from(self._keys_in_flight()), label="key in flight")
        self.start_execute(key, **arguments)

    def _claimed_keys(self) -> list[str]:
        return sorted({r.idempotency_key for r in self.observed.values()})

    def _unsettled_keys(self) -> list[str]:
        return sorted(
            {
                r.idempotency_key
                for r in self.observed.values()
                if r.is_pending or r.final_status is ActionStatus.UNKNOWN
            }
        )

    # Operators act only on keys that hold a claim: on a key without one there
    # is nothing to call, and such no-op steps once made up over half of all
    # contenders, starving the runs of provider calls. They come while some
    # claim is unsettled (PENDING or UNKNOWN), which is what operators are
    # for; a settled claim's key is still drawn, a quarter as often as an
    # unsettled one's, to check that they leave it alone.
    @precondition(lambda self: bool(self._unsettled_keys()) and self._active() < MAX_ACTIVE)
    @rule(data=st.data(), how=st.sampled_from(["reconcile", "recover", "release", "reopen"]))
    def start_operator(self, data: st.DataObject, how: str) -> None:
        """An operator (or a new process) acts on whatever claim a key has now."""
        keys = self._unsettled_keys() * 3 + self._claimed_keys()
        key = data.draw(st.sampled_from(keys), label="claimed key")
        self.operate(key, how)

    def operate(self, key: str, how: str) -> None:
        """An operator's ``how`` on whatever claim ``key`` has now (none: nothing to do)."""
        name = contender_name(len(self.contenders_list))
        namespace, idempotency_key = split_key(key)
        stored = self.loop.run(self.observer.find(ACTION, idempotency_key, namespace))
        c = Contender(
            name,
            how,
            key,
            stored.provider_reference or "" if stored else "",
            namespace=namespace,
        )
        self.history.add(f"contender {name}", f"{how} the claim of {key}")
        live_worker = any(
            o.kind == "execute" and o.key == key and o.alive for o in self.contenders_list
        )
        if stored is None or (how in ("recover", "reopen") and live_worker):
            # recover_pending's contract: first make sure the original worker
            # can no longer mutate. An operator who cannot, waits. A reopen
            # waits too: a caller still running would claim the freed key with
            # the old mutation's reference (see lifecycle_rules).
            c.outcome, c.finished = "no claim" if stored is None else "worker still alive", True
            self.contenders_list.append(c)
            return
        c.action_id = stored.action_id
        c.retired_before = stored.retired_at is not None
        runner = self.runner_class(
            self.gated(self.new_client()),
            clock=self.virtual_time,
            lease=LEASE,
            owner=name,
            namespace=namespace,
        )

        async def body() -> Any:
            if how == "reconcile":
                return await runner.reconcile(stored.action_id, self.verifier)
            if how == "recover":
                return await runner.recover_pending(stored.action_id, self.verifier)
            if how == "reopen":
                return await runner.reopen(stored.action_id)
            return await runner.release_unstarted(stored.action_id)

        self._start(c, body)

    def _stranded_unstarted(self) -> list[str]:
        return sorted(
            r.idempotency_key
            for r in self.observed.values()
            if r.is_pending
            and r.attempts == 0
            and not any(
                c.kind == "execute" and c.key == r.idempotency_key and not c.finished
                for c in self.contenders_list
            )
        )

    @precondition(lambda self: bool(self._stranded_unstarted()) and self._active() < MAX_ACTIVE)
    @rule(data=st.data())
    def release_stranded_claim(self, data: st.DataObject) -> None:
        """An operator releases a claim whose worker died before its attempt started."""
        key = data.draw(st.sampled_from(self._stranded_unstarted()), label="stranded key")
        self.operate(key, "release")

    def _parked(self) -> list[Contender]:
        # A caller that gave up may leave its worker thread parked in the provider.
        return [
            c
            for c in self.contenders_list
            if (c.parked_at is not None and not c.finished) or c.lingering is not None
        ]

    @precondition(lambda self: bool(self._parked()))
    @rule(data=st.data(), gates=st.integers(1, 4))
    def advance(self, data: st.DataObject, gates: int) -> None:
        """Release one parked contender past up to ``gates`` gates, deciding what happens at each."""
        parked = {c.name: c for c in self._parked()}
        c = parked[data.draw(st.sampled_from(sorted(parked)), label="contender")]
        self.advance_contender(c, data, gates)

    def advance_contender(
        self,
        c: Contender,
        data: st.DataObject,
        gates: int,
        provider: st.SearchStrategy[ProviderFault] | None = None,
        calm_ledger: bool = False,
        truthful_verifier: bool = False,
    ) -> None:
        """Release ``c`` past up to ``gates`` gates, drawing the decision at each.

        ``provider`` overrides what its provider calls meet; ``calm_ledger``
        makes its ledger calls meet no fault three times in four more, and
        ``truthful_verifier`` its verifier answer truthfully so much more.
        """
        if c.lingering is not None and (
            c.finished or data.draw(st.booleans(), label=f"{c.name}'s thread, not its caller")
        ):
            self.let_the_thread_go(c, data, provider)
            return
        for _ in range(gates):
            gate = c.parked_at
            if gate is None or c.finished:
                break
            decisions = _decisions_for(gate, c, self.backend)
            if provider is not None and gate == "provider.charge":
                decisions = provider
            elif (calm_ledger or c.calm_ledger) and gate.startswith("ledger."):
                decisions = st.one_of(CALM, CALM, CALM, decisions)
            elif truthful_verifier and gate == "verifier.verify":
                decisions = st.one_of(TRUTHFUL, TRUTHFUL, TRUTHFUL, decisions)
            decision = data.draw(decisions, label=f"{c.name} at {gate}")
            event(f"{gate}: {decision.value}")
            if gate.startswith("ledger."):
                REACHED[(gate, decision.name)] += 1
                if decision is not LedgerFault.NONE:
                    self.history.add(f"contender {c.name}", f"{gate}: {decision.value}")
            self.history.step += 1
            self.scheduler.release(c, decision)
            self._after(c)

    # Hypothesis chooses among enabled rules uniformly; a second way to
    # advance keeps runs moving forward rather than piling up new contenders.
    @precondition(lambda self: bool(self._parked()))
    @rule(data=st.data(), gates=st.integers(1, 4))
    def advance_another(self, data: st.DataObject, gates: int) -> None:
        """Release one parked contender past some gates (same as advance)."""
        self.advance(data, gates)

    @precondition(lambda self: bool(self._parked()) and self.crashes < MAX_CRASHES)
    @rule(data=st.data())
    def crash(self, data: st.DataObject) -> None:
        """A contender's process dies mid-protocol: its task is cancelled, its client dropped."""
        parked = {c.name: c for c in self._parked()}
        c = parked[data.draw(st.sampled_from(sorted(parked)), label="contender")]
        self.history.add(
            f"contender {c.name}",
            f"crashes while parked at {c.parked_at}"
            if not c.finished
            else "its process dies, and with it the worker thread its caller gave up on",
        )
        event("crash")
        if c.in_thread and c.parked_at == "provider.charge":
            # Its operation's thread is blocked in the provider call: the
            # cancellation cannot stop it; its gate fails as the process dies.
            REACHED[("crash", "operation on a worker thread, at provider.charge")] += 1
        self.crashes += 1
        self.history.step += 1
        self.scheduler.crash(c)
        self._after(c)

    def _in_provider_calls(self) -> list[Contender]:
        return [
            c
            for c in self.contenders_list
            if c.kind == "execute" and not c.finished and c.parked_at == "provider.charge"
        ]

    # Enabled only while a call is in its provider call, so it takes no share
    # of the steps elsewhere (a crash, which a give-up resembles, reaches
    # every gate).
    @precondition(lambda self: bool(self._in_provider_calls()) and self.crashes < MAX_CRASHES)
    @rule(data=st.data())
    def its_caller_gives_up(self, data: st.DataObject) -> None:
        """A call in its provider call is cancelled (a tool's time limit); its process lives on."""
        calls = {c.name: c for c in self._in_provider_calls()}
        self.give_up(calls[data.draw(st.sampled_from(sorted(calls)), label="contender")])

    def give_up(self, c: Contender) -> None:
        """``c``'s call is cancelled in its provider call; its process (and thread) live on."""
        where = "its worker thread" if c.in_thread else "the event loop"
        self.history.add(
            f"contender {c.name}",
            f"its caller gives up (cancels the call) while its operation, on {where}, is in "
            "its provider call; its process lives on",
        )
        event("give up")
        REACHED[("give up", f"operation on {where}, at provider.charge")] += 1
        self.crashes += 1
        self.history.step += 1
        self.scheduler.give_up(c)
        self._after(c)

    def let_the_thread_go(
        self, c: Contender, data: st.DataObject, provider: st.SearchStrategy[ProviderFault] | None
    ) -> None:
        """The worker thread of a caller that gave up gets its provider's answer."""
        decisions = (
            provider if provider is not None else _decisions_for("provider.charge", c, self.backend)
        )
        decision = data.draw(decisions, label=f"{c.name}'s thread at provider.charge")
        event(f"provider.charge after its caller gave up: {decision.value}")
        REACHED[("provider after its caller gave up", decision.name)] += 1
        REACHED[("a given-up caller's thread", "answered")] += 1
        if c.acting_under is not None:
            action_id, token = c.acting_under
            held = self.observed.get(action_id)
            if held is not None and held.fencing_token > token:
                REACHED[
                    ("a given-up caller's thread", "answered after its claim was taken over")
                ] += 1
        self.history.step += 1
        self.scheduler.let_go(c, decision)
        self._after(c)

    def _in_flight_keys(self) -> list[str]:
        return [
            key
            for key in self.order_keys
            if any(self.world.may_appear_later(ref) for ref in self.references.get(key, ()))
        ]

    # Only while a request is in flight: otherwise the rule does nothing, and
    # in runs where Hypothesis's rule swarm disabled the start rules it once
    # filled every remaining step with no-ops.
    @precondition(lambda self: bool(self._in_flight_keys()))
    @rule(data=st.data(), what=st.sampled_from(["late commit", "give up"]))
    def provider_side_event(self, data: st.DataObject, what: str) -> None:
        """The provider acts on its own: in-flight requests commit late, or are given up."""
        self.provider_acts(data.draw(st.sampled_from(self._in_flight_keys()), label="key"), what)

    def provider_acts(self, key: str, what: str) -> None:
        """In-flight requests of ``key`` commit late, or are given up."""
        for ref in sorted(self.references.get(key, ())):
            if not self.world.may_appear_later(ref):
                continue
            if what == "late commit":
                committed = self.world.commit_in_flight(ref)
                self.history.add(
                    "provider", f"{committed} in-flight request(s) for {ref} commit late"
                )
            else:
                dropped = self.world.drop_in_flight(ref)
                self.history.add("provider", f"gives up {dropped} in-flight request(s) for {ref}")
            event(what)

    # -- bookkeeping -----------------------------------------------------------

    def _after(self, c: Contender) -> None:
        if c.finished and not c.reported:
            c.reported = True
            outcome = c.outcome
            if isinstance(outcome, ActionResult):
                c.action_id = outcome.receipt.action_id
                text = (
                    f"{outcome.status.value}{' (replayed)' if outcome.replayed else ''}, "
                    f"execution={_v(outcome.receipt.execution_status)}, "
                    f"verification={_v(outcome.receipt.verification_status)}, "
                    f"attempts={outcome.receipt.attempts}"
                )
            elif c.kind == "prune" and isinstance(outcome, int):
                text = f"deleted {outcome} receipt(s)"
            elif outcome is None and c.kind == "reopen":
                text = "reopened: the key is free"
            elif outcome is None and c.kind == "release":
                text = "released"
                assert c.action_id is not None
                previous = self.observed.get(c.action_id)
                c.released_attempts = previous.attempts if previous else 0
            else:
                text = f"raised {type(outcome).__name__}: {outcome}"
                receipt = getattr(outcome, "receipt", None)
                if c.kind == "execute" and isinstance(receipt, ActionReceipt):
                    c.action_id = receipt.action_id
            _note_lifecycle(c)
            if c.waited:
                text += " after waiting for the claim holder"
                REACHED[("wait", _wait_outcome(outcome))] += 1
            self.history.add(f"contender {c.name}", f"{c.kind} {c.key} -> {text}")
            note(f"contender {c.name}: {c.kind} {c.key} -> {text}")
        self._observe()

    def _observe(self) -> None:
        # The reads are sent together: on SQLite each is a hop to the
        # observer's connection thread, and awaited one by one they made a
        # SQLite run about 15 % slower. Every contender is parked at a gate
        # meanwhile, so together or in turn they read the same ledger.
        async def read() -> dict[str, ActionReceipt | None]:
            seen: dict[str, ActionReceipt | None] = {}
            found = await asyncio.gather(
                *(
                    self.observer.find(ACTION, key, namespace)
                    for namespace, key in map(split_key, self.order_keys)
                )
            )
            for stored in found:
                if stored is not None:
                    seen[stored.action_id] = stored
            missing = [action_id for action_id in self.observed if action_id not in seen]
            by_id = await asyncio.gather(*(self.observer.get(a) for a in missing))
            seen.update(zip(missing, by_id, strict=True))
            return seen

        reads: SQLiteStorageReads | Snapshot | None = None
        if self.table_reads is not None:
            # One round trip: the table's committed rows, all at one moment.
            reads = self.loop.run(self.table_reads.snapshot())
        elif self.storage_reads is not None and self.storage_reads.ready():
            reads = self.storage_reads
        if reads is not None:
            # No hop per read: the committed rows, read by the machine itself.
            seen: dict[str, ActionReceipt | None] = {}
            for namespace, key in map(split_key, self.order_keys):
                stored = reads.find(ACTION, key, namespace)
                if stored is not None:
                    seen[stored.action_id] = stored
            for action_id in [a for a in self.observed if a not in seen]:
                seen[action_id] = reads.get(action_id)
        else:
            seen = self.loop.run(read())
        self.transitions = {}
        for action_id, receipt in seen.items():
            before = self.observed.get(action_id)
            if before is not None:
                self.transitions[action_id] = (before, receipt)
            if receipt is not None:
                self.observed[action_id] = receipt
            elif action_id in self.observed and action_id in self.released_ids:
                del self.observed[action_id]

    def _check(self, checks: list[Any]) -> None:
        for check in checks:
            try:
                check(self)
            except InvariantViolation as violation:
                path = self.history.write(str(violation))
                raise violation_type(violation.name)(
                    violation.name,
                    f"{violation.detail}\n\nWhat happened:\n{self.history.narrative()}\n\n"
                    f"Trace written to {path}",
                ) from None

    @invariant()
    def safety_properties_hold(self) -> None:
        self._check(inv.SAFETY)

    @invariant()
    def progress_properties_hold(self) -> None:
        self._check(inv.PROGRESS)

    @invariant()
    def receipt_of_each_finished_contender_was_observed(self) -> None:
        for c in self.contenders_list:
            if c.finished and isinstance(c.outcome, ActionResult):
                assert c.outcome.receipt.action_id in self.observed or (
                    c.outcome.receipt.action_id in self.released_ids
                ), f"contender {c.name}'s receipt is missing from the ledger"


def _note_lifecycle(c: Contender) -> None:
    """Which lifecycle outcome a finished contender reached (see stateful_tests.reach)."""
    outcome = c.outcome
    if c.kind == "reopen":
        REACHED[("lifecycle", "reopened" if outcome is None else type(outcome).__name__)] += 1
    elif c.kind == "prune" and c.pruned:
        REACHED[("lifecycle", "pruned")] += 1
    elif c.expires_after is not None:
        receipt = getattr(outcome, "receipt", None)
        if isinstance(outcome, ActionResult) and not outcome.replayed:
            REACHED[("lifecycle", "a freed key claimed afresh")] += 1
        elif isinstance(receipt, ActionReceipt) and receipt.final_status is ActionStatus.UNKNOWN:
            # Replayed, or refused as a conflict (the caller's new reference): never freed.
            REACHED[("lifecycle", "expiry asked, UNKNOWN kept its key")] += 1
    if c.namespace and c.kind == "execute" and isinstance(outcome, ActionResult):
        REACHED[("namespace", "another tenant's call of a shared key finished")] += 1


def _wait_outcome(outcome: Any) -> str:
    if isinstance(outcome, ActionResult):
        return "replayed" if outcome.replayed else "claimed after a release"
    return type(outcome).__name__


def _v(status: Any) -> str:
    return "None" if status is None else status.value


def machine_for(backend: str, **overrides: Any) -> type[RunnerMachineBase]:
    """The runner machine on one backend; ``overrides`` plant bugs for the bug tests."""
    name = f"RunnerMachine_{backend}" + ("_" + "_".join(sorted(overrides)) if overrides else "")
    return type(name, (RunnerMachineBase,), {"backend": backend, **overrides})


#: SQLite contenders sharing one connection (one process, many tasks), whose
#: writes a rule commits as one group (``group_rules``).
RunnerMachineSQLiteShared: type[RunnerMachineBase] = type(
    "RunnerMachine_sqlite_shared",
    (GroupCommitRules, RunnerMachineBase),
    {"backend": "sqlite", "stalls_after_writes": False},
)
RunnerMachineMemory = machine_for("memory")
RunnerMachineSQLite = machine_for("sqlite")
RunnerMachinePostgres = machine_for("postgres")
