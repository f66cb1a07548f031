"""The ledger machine: differential testing of every backend against the model.

The same random sequence of conditional transitions (claims in two
namespaces, attempt starts, completions, settlements, releases, stale and
malformed writes, races of concurrent claims, retiring keys and pruning
while a writer changes a receipt) is applied to every ledger and to the
abstract ledger of ``models``. After every step all backends must hold
identical receipts, and agree with the model on every accepted or refused
transition; at most one receipt holds each key.
"""

from __future__ import annotations

import asyncio
import dataclasses
import shutil
import tempfile
import uuid
from collections.abc import Sequence
from datetime import timedelta
from pathlib import Path
from typing import Any, ClassVar, cast

from hypothesis import note
from hypothesis import strategies as st
from hypothesis.stateful import Bundle, RuleBasedStateMachine, initialize, invariant

from dataoad import (
    ActionReceipt,
    ActionStatus,
    AttemptRecord,
    ClaimState,
    InMemoryLedger,
    InvalidArgumentError,
    Ledger,
    SQLiteLedger,
)
from dataoad._ledger import InspectableLedger
from dataoad.testing import ManualClock, make_receipt
from dataoad.testing._contract_receipts import _T0, completed, started
from models.ledger import AbstractLedger, ModelReceipt
from stateful_tests.harness import History, MachineLoop, violation
from stateful_tests.reach import rule
from suite_support.services import PostgresTestTable

#: What every backend answers a write whose version or fencing token is below 1,
#: a value no receipt holds: InvalidArgumentError, and nothing written.
OUTSIDE_THE_DOMAIN = "InvalidArgumentError"


def counts_in_domain(*counts: int) -> bool:
    """Whether versions and fencing tokens are ones a receipt can hold (1 and up)."""
    return all(count >= 1 for count in counts)


#: Every claim's lease in the machine, in seconds of the ledger's clock.
LEASE = 30.0
#: Where every run's ledger clock starts (the model counts seconds from here).
START = ManualClock().now


def project(receipt: ActionReceipt) -> ModelReceipt:
    """The contract-relevant fields of a receipt, as the model keeps them."""
    expires = receipt.lease_expires_at
    return ModelReceipt(
        action_id=receipt.action_id,
        action_name=receipt.action_name,
        key=receipt.idempotency_key,
        request_hash=receipt.request_hash,
        pending=receipt.claim_state is ClaimState.PENDING,
        attempts=receipt.attempts,
        version=receipt.version,
        final=None if receipt.final_status is None else receipt.final_status.value,
        owner=receipt.owner,
        token=receipt.fencing_token,
        lease_until=None if expires is None else (expires - START).total_seconds(),
        namespace=receipt.namespace,
        retired=receipt.retired_at is not None,
        updated=(receipt.updated_at - _T0).total_seconds(),
    )


class LedgerMachineBase(RuleBasedStateMachine):
    """Backends under test are built by ``make_backends``; the model is the oracle."""

    memory_class: ClassVar[type[Any]] = InMemoryLedger
    sqlite_class: ClassVar[type[Any]] = SQLiteLedger
    #: The backends compared with the in-memory ledger and the model.
    durable_backends: ClassVar[tuple[str, ...]] = ("sqlite",)

    claims = Bundle("claims")

    def __init__(self) -> None:
        super().__init__()
        self.loop = MachineLoop()
        self.folder = Path(tempfile.mkdtemp(prefix="dataoad-ledger-machine-"))
        self.ledgers: dict[str, InspectableLedger] = {}
        self.peers: dict[str, list[Ledger]] = {}
        self.model = AbstractLedger()
        self.clock = ManualClock(START)
        self.known: set[str] = set()
        self.touched: set[str] = set()  # action ids written or released since the last check
        self.history = History(type(self).__name__)
        self.postgres: PostgresTestTable | None = None
        if "postgres" in self.durable_backends:
            self.postgres = PostgresTestTable()
            self.loop.run(self.postgres.create())

    def client(self, backend: str) -> InspectableLedger:
        """A new client (connection) of one durable backend's storage."""
        if backend == "sqlite":
            ledger: InspectableLedger = self.sqlite_class(
                self.folder / "l.sqlite3", clock=self.clock
            )
            return ledger
        if backend != "postgres" or self.postgres is None:
            raise ValueError(f"no such backend: {backend}")
        return cast(InspectableLedger, self.postgres.client(clock=self.clock))

    @initialize()
    def open_backends(self) -> None:
        memory = self.memory_class(clock=self.clock)
        self.ledgers = {"memory": memory}
        for backend in self.durable_backends:
            self.ledgers[backend] = self.client(backend)

    def _peers(self) -> dict[str, list[Ledger]]:
        """Four clients of each backend's storage, opened on first use.

        Only ``concurrent_claims`` uses them: opening four connections per
        run for every run was about a fifth of the machine's time.
        """
        if not self.peers:
            memory = self.ledgers["memory"]
            self.peers = {"memory": [memory] * 4}
            for backend in self.durable_backends:
                self.peers[backend] = [self.client(backend) for _ in range(4)]
        return self.peers

    def teardown(self) -> None:
        try:
            for name, ledger in self.ledgers.items():
                self.loop.run(ledger.close())
                for peer in self.peers.get(name, []):
                    if peer is not ledger:
                        self.loop.run(peer.close())
            if self.postgres is not None:
                self.loop.run(self.postgres.drop())
        finally:
            self.loop.close()
            shutil.rmtree(self.folder, ignore_errors=True)

    def _all(self, method: str, *args: Any, **kwargs: Any) -> dict[str, Any]:
        touched = args[0] if args else None
        if isinstance(touched, ActionReceipt):
            touched = touched.action_id
        if isinstance(touched, str):
            self.touched.add(touched)

        async def answer(ledger: Ledger) -> Any:
            try:
                return await getattr(ledger, method)(*args, **kwargs)
            except InvalidArgumentError:
                return OUTSIDE_THE_DOMAIN

        async def run_all() -> dict[str, Any]:
            return {name: await answer(ledger) for name, ledger in self.ledgers.items()}

        answers: dict[str, Any] = self.loop.run(run_all())
        return answers

    def _agree(self, what: str, results: dict[str, Any], expected: Any) -> None:
        self.history.add("all ledgers", f"{what} -> model says {expected!r}")
        for name, result in results.items():
            if result != expected:
                raise violation(
                    self.history,
                    "backends-agree-with-the-model",
                    f"{what}: {name} answered {result!r}, the model {expected!r}",
                )

    def _current(self, action_id: str) -> ActionReceipt | None:
        current: ActionReceipt | None = self.loop.run(self.ledgers["memory"].get(action_id))
        return current

    # -- rules ---------------------------------------------------------------------

    @rule(
        target=claims,
        key=st.sampled_from(["k1", "k2", "k3"]),
        name=st.sampled_from(["a", "b"]),
        namespace=st.sampled_from(["", "", "t"]),
        # The runner's claim counts attempt 1 (fused); a v0.1 runner's counted none.
        fused=st.booleans(),
    )
    def claim(self, key: str, name: str, namespace: str, fused: bool) -> str:
        receipt = make_receipt(
            action_id=uuid.uuid4().hex,
            action_name=name,
            idempotency_key=key,
            owner="first",
            namespace=namespace,
        )
        if fused:
            receipt = receipt.evolve(
                attempts=1, attempt_records=(AttemptRecord(number=1, started_at=_T0),)
            )
        stored, created = self.model.claim(project(receipt), LEASE)
        results = self._all("claim", receipt, lease=LEASE)
        self._agree(f"claim {name}/{key}", {n: r[1] for n, r in results.items()}, created)
        for n, (got, _) in results.items():
            if project(got) != stored:
                raise violation(
                    self.history,
                    "backends-agree-with-the-model",
                    f"claim {name}/{key}: {n} returned {got}",
                )
        note(
            f"claim {namespace}/{name}/{key} -> {'created' if created else 'existing'} "
            f"{stored.action_id[:8]}"
        )
        self.known.add(stored.action_id)
        return stored.action_id

    # The racers are v0.1-shaped claims: the statement is the same for a fused
    # claim (only the values differ), and a race's losers are released to
    # make the backends agree, which a fused claim (attempt 1 counted) never
    # allows. Fused claims are drawn by ``claim``.
    @rule(key=st.sampled_from(["k1", "k2", "k3"]), racers=st.integers(2, 4))
    def concurrent_claims(self, key: str, racers: int) -> None:
        """Several clients race to claim one key: exactly one may win on every backend."""
        candidates = [make_receipt(action_name="a", idempotency_key=key) for _ in range(racers)]
        existed = self.model.find("a", key) is not None

        async def race(clients: list[Ledger]) -> list[tuple[ActionReceipt, bool]]:
            return await asyncio.gather(
                *(c.claim(r) for c, r in zip(clients, candidates, strict=False))
            )

        winners_by_backend = {}
        for name, clients in self._peers().items():
            outcomes = self.loop.run(race(clients[:racers]))
            winners = [stored for stored, created in outcomes if created]
            winners_by_backend[name] = winners
            self.history.add(name, f"{racers} concurrent claims of {key}: {len(winners)} created")
            if len(winners) != (0 if existed else 1):
                raise violation(
                    self.history,
                    "one-winner-per-key",
                    f"{racers} concurrent claims of {key} on {name}: {len(winners)} created",
                )
        # Backends may pick different winners; make them agree again.
        if not existed:
            memory_winner = winners_by_backend["memory"][0]
            for backend in self.durable_backends:
                winner = winners_by_backend[backend][0]
                if memory_winner.action_id != winner.action_id:
                    self.loop.run(self.ledgers[backend].release(winner.action_id, 1))
                    self.loop.run(self.ledgers[backend].claim(memory_winner))
                    self.touched.add(winner.action_id)  # read back: gone everywhere
            self.model.claim(project(memory_winner))
            self.known.add(memory_winner.action_id)
            # These writes bypass _all: name the winner for the get read-back.
            self.touched.add(memory_winner.action_id)

    @rule(
        claim=claims,
        variant=st.sampled_from(["exact", "stale", "skip", "other-hash", "old-holder"]),
    )
    def start_attempt(self, claim: str, variant: str) -> None:
        current = self._current(claim)
        if current is None:
            return
        proposed = started(current)
        if variant == "old-holder":  # a worker whose claim was taken over, at the right version
            proposed = proposed.evolve(owner="zombie", fencing_token=current.fencing_token - 1)
        elif variant == "stale":
            proposed = proposed.evolve(version=current.version)
        elif variant == "skip":
            proposed = started(proposed).evolve(version=current.version + 1)
        elif variant == "other-hash":
            proposed = proposed.evolve(request_hash="f" * 64)
        expected = (
            self.model.start_attempt(project(proposed), LEASE)
            if counts_in_domain(proposed.version, proposed.fencing_token)
            else OUTSIDE_THE_DOMAIN
        )
        self._agree(
            f"start_attempt({variant}) {claim[:8]}",
            self._all("start_attempt", proposed, lease=LEASE),
            expected,
        )

    @rule(
        claim=claims,
        variant=st.sampled_from(["complete", "settle", "reopen", "stale", "add-attempt"]),
        status=st.sampled_from(list(ActionStatus)),
    )
    def record(self, claim: str, variant: str, status: ActionStatus) -> None:
        current = self._current(claim)
        if current is None or not current.attempt_records:
            return
        if variant == "complete" and current.is_pending:
            proposed = completed(current, status)
        elif variant == "reopen":
            proposed = current.evolve(claim_state=ClaimState.PENDING, version=current.version + 1)
        elif variant == "stale":
            proposed = current.evolve(final_status=status)
        elif variant == "add-attempt":
            proposed = started(current).evolve(claim_state=current.claim_state)
        else:
            proposed = current.evolve(
                verification_status=status, final_status=status, version=current.version + 1
            )
        expected = self.model.record(project(proposed))
        self._agree(f"record({variant}) {claim[:8]}", self._all("record", proposed), expected)

    # The runner's usual path in one step: without it, a claim that is
    # completed and then written to again (where the completed-claim guards
    # matter) needs three particular rules in a row on the same claim.
    @rule(claim=claims, status=st.sampled_from(list(ActionStatus)))
    def start_and_complete_an_attempt(self, claim: str, status: ActionStatus) -> None:
        current = self._current(claim)
        if current is None or not current.is_pending:
            return
        proposed = started(current)
        expected = self.model.start_attempt(project(proposed), LEASE)
        self._agree(
            f"start_attempt {claim[:8]}",
            self._all("start_attempt", proposed, lease=LEASE),
            expected,
        )
        if expected:
            done = completed(proposed, status)
            expected = self.model.record(project(done))
            self._agree(f"record(complete) {claim[:8]}", self._all("record", done), expected)

    @rule(seconds=st.sampled_from([1.0, LEASE - 1, LEASE, LEASE + 1]))
    def clock_passes(self, seconds: float) -> None:
        """The ledger's clock moves on (the only way leases run out)."""
        self.clock.advance(seconds)
        self.model.now += seconds
        self.history.add("ledger clock", f"{seconds:g} s pass (now +{self.model.now:g} s)")

    @rule(claim=claims, variant=st.sampled_from(["exact", "same-token", "skip-token", "stale"]))
    def take_over(self, claim: str, variant: str) -> None:
        current = self._current(claim)
        if current is None:
            return
        token = current.fencing_token + {"same-token": 0, "skip-token": 2}.get(variant, 1)
        proposed = current.evolve(
            owner=f"taker-{token}",
            fencing_token=token,
            version=current.version + (0 if variant == "stale" else 1),
            updated_at=current.updated_at,
        )
        expected = self.model.take_over(project(proposed), LEASE)
        self._agree(
            f"take_over({variant}) {claim[:8]}",
            self._all("take_over", proposed, lease=LEASE),
            expected,
        )

    @rule(claim=claims, variant=st.sampled_from(["holder", "holder", "older-token"]))
    def renew(self, claim: str, variant: str) -> None:
        current = self._current(claim)
        if current is None:
            return
        token = current.fencing_token - (1 if variant == "older-token" else 0)
        expected = (
            self.model.renew(claim, token, LEASE) if counts_in_domain(token) else OUTSIDE_THE_DOMAIN
        )
        self._agree(
            f"renew({variant}) {claim[:8]} token {token}",
            self._all("renew", claim, token, LEASE),
            expected,
        )

    @rule(claim=claims, off_by=st.sampled_from([0, 0, 1, -1]))
    def release(self, claim: str, off_by: int) -> None:
        current = self._current(claim)
        if current is None:
            return
        version = current.version + off_by
        expected = (
            self.model.release(claim, version) if counts_in_domain(version) else OUTSIDE_THE_DOMAIN
        )
        self._agree(
            f"release {claim[:8]} at v{version}", self._all("release", claim, version), expected
        )

    @rule(
        claim=claims,
        variant=st.sampled_from(["exact", "exact", "stale", "stale", "changed", "unset"]),
    )
    def retire(self, claim: str, variant: str) -> None:
        """Free a key (expiry, reopen): only a definitive receipt, at its exact version."""
        current = self._current(claim)
        if current is None:
            return
        at = current.updated_at + timedelta(seconds=1)
        proposed = current.evolve(retired_at=at, version=current.version + 1, updated_at=at)
        if variant == "stale":
            proposed = proposed.evolve(version=current.version)
        elif variant == "changed":
            proposed = proposed.evolve(final_status=ActionStatus.CONFIRMED, attempts=0)
        elif variant == "unset":
            proposed = proposed.evolve(retired_at=None)
        expected = self.model.retire(project(proposed))
        self._agree(f"retire({variant}) {claim[:8]}", self._all("retire", proposed), expected)

    @rule(
        # Whole seconds are times the ledger stored receipts at (the clock moves
        # by whole seconds): "before" is strict there. Half seconds fall between.
        cut=st.sampled_from([1.0, 1.5, 2.0, 2.5, LEASE, LEASE + 1, 4.5, 86_400.0]),
        by_age=st.booleans(),
        statuses=st.sets(st.sampled_from(list(ActionStatus)), min_size=1),
        namespace=st.sampled_from([None, "", "t"]),
        batch_size=st.sampled_from([1, 2, 500]),
        change_first=st.sampled_from([True, True, False]),
    )
    def prune(
        self,
        cut: float,
        statuses: set[ActionStatus],
        namespace: str | None,
        batch_size: int,
        change_first: bool,
        by_age: bool,
    ) -> None:
        """Retention, with a writer changing the first receipt of the first batch meanwhile.

        The cut-off is given as a time (``completed_before``) or, ``by_age``,
        as the age it is by the ledger's clock (``older_than``).
        """
        age = self.model.now - cut
        cutoff: dict[str, Any] = (
            {"older_than": age}
            if by_age and age >= 0
            else {"completed_before": START + timedelta(seconds=cut)}
        )
        chosen = sorted(statuses, key=lambda s: s.value)
        changed: list[str] = []
        counts = {}
        for name, ledger in self.ledgers.items():
            merged: dict[str, ActionReceipt] = {}

            async def meanwhile(
                batch: Sequence[ActionReceipt], ledger: Any = ledger, merged: Any = merged
            ) -> None:
                if change_first and not merged:
                    first = batch[0]
                    late = first.evolve(metadata={"late": "evidence"}, version=first.version + 1)
                    assert await ledger.record(late)
                    merged[first.action_id] = late

            counts[name] = self.loop.run(
                ledger.prune(
                    **cutoff,
                    statuses=chosen,
                    namespace=namespace,
                    batch_size=batch_size,
                    before_delete=meanwhile,
                )
            )
            changed.append(",".join(merged))
            for late in merged.values():
                self.touched.add(late.action_id)
        if len(set(changed)) != 1:
            raise violation(
                self.history,
                "backends-agree-with-the-model",
                f"prune read its batches in different orders: {changed}",
            )
        late_ids = frozenset(i for i in changed[0].split(",") if i)
        for action_id in late_ids:
            current = self.model.by_id[action_id]
            self.model.by_id[action_id] = dataclasses.replace(
                current, version=current.version + 1, stored=self.model.now
            )
        before = set(self.model.by_id)
        expected = self.model.prune(
            cut, frozenset(s.value for s in chosen), namespace, changed=late_ids
        )
        self.touched |= before - set(self.model.by_id)
        self._agree(
            f"prune({f'older_than={age:g} s, i.e. ' if 'older_than' in cutoff else ''}"
            f"before +{cut:g} s, {[s.value for s in chosen]}, namespace {namespace!r}, "
            f"batches of {batch_size}, {'a receipt changed meanwhile' if late_ids else 'no change'})",
            counts,
            expected,
        )

    # -- invariants --------------------------------------------------------------

    @invariant()
    def one_receipt_holds_each_key(self) -> None:
        """At most one receipt per (namespace, action, key) was never retired, everywhere."""
        for name, receipts in self.loop.run(self._listings()).items():
            holders: dict[tuple[str, str, str], str] = {}
            for r in receipts:
                if r.retired_at is not None:
                    continue
                key = (r.namespace, r.action_name, r.idempotency_key)
                if key in holders:
                    raise violation(
                        self.history,
                        "one-winner-per-key",
                        f"{name}: {holders[key][:8]} and {r.action_id[:8]} both hold {key}",
                    )
                holders[key] = r.action_id

    @invariant()
    def every_backend_holds_identical_receipts(self) -> None:
        """All backends hold the same receipts, field for field, and the model agrees.

        Every receipt is compared through each backend's listing (one read per
        backend, so a write that changed or removed any row, not only the one
        it named, is caught); the receipts this step wrote are also read back
        one by one with ``get``.
        """
        # Equality ignores the lease (a renewal moves it without a version) and
        # the time of storing: compare them explicitly, as the ledger's clock
        # stamped them.
        listings = {
            name: {r.action_id: (r, r.lease_expires_at, r.stored_at) for r in receipts}
            for name, receipts in self.loop.run(self._listings()).items()
        }
        memory = listings["memory"]
        for name, held in listings.items():
            if held != memory:
                action_id = min(
                    i for i in held.keys() | memory.keys() if held.get(i) != memory.get(i)
                )
                raise violation(
                    self.history,
                    "backends-hold-identical-receipts",
                    f"{action_id[:8]}: {name} holds {held.get(action_id)}, "
                    f"memory holds {memory.get(action_id)}",
                )
        for action_id in sorted(self.touched):
            results = self._all("get", action_id)
            for name, receipt in results.items():
                got = (
                    None
                    if receipt is None
                    else (receipt, receipt.lease_expires_at, receipt.stored_at)
                )
                if got != memory.get(action_id):
                    raise violation(
                        self.history,
                        "backends-hold-identical-receipts",
                        f"{action_id[:8]}: {name}.get returns {receipt}, "
                        f"its listing holds {memory.get(action_id)}",
                    )
        self.touched.clear()
        for action_id in sorted(self.known | set(memory)):
            model = self.model.by_id.get(action_id)
            entry = memory.get(action_id)
            stored = None if entry is None else entry[0]
            if (
                stored is not None
                and model is not None
                and stored.stored_at != START + timedelta(seconds=model.stored)
            ):
                raise violation(
                    self.history,
                    "backends-agree-with-the-model",
                    f"{action_id[:8]} was stored at {stored.stored_at} by the ledger's "
                    f"clock; the model stored it at +{model.stored:g} s",
                )
            if (None if stored is None else project(stored)) != model:
                raise violation(
                    self.history,
                    "backends-agree-with-the-model",
                    f"{action_id[:8]}: backends hold {stored}, the model {model}",
                )

    async def _listings(self) -> dict[str, list[ActionReceipt]]:
        return {name: await ledger.receipts() for name, ledger in self.ledgers.items()}


LedgerMachine: type[LedgerMachineBase] = type("LedgerMachine", (LedgerMachineBase,), {})

LedgerMachinePostgres: type[LedgerMachineBase] = type(
    "LedgerMachinePostgres", (LedgerMachineBase,), {"durable_backends": ("postgres",)}
)
