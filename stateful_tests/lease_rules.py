"""Leases in the runner machine: the ledger's clock, heartbeats, and running out.

Time on the ledger's clock passes only by the ``lease_runs_out`` rule, and a
holder's lease is renewed only by the ``heartbeat`` rule, so a shrunk trace
says exactly when a contender became a zombie: it was parked (at the
provider, say) while its lease ran out, another contender took its claim
over, and then it was released to finish what it had started.
``holder_outlives_its_lease`` arranges that sequence in one step, and
``sweep`` runs ``recover_stale`` beside live contenders.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any, ClassVar, Final

from hypothesis import event
from hypothesis import strategies as st
from hypothesis.stateful import precondition

from dataoad._leases import RENEWAL_TASK_NAME, RENEWALS_PER_LEASE
from stateful_tests.harness import (
    STALLED,
    Contender,
    LeaseGrant,
    LedgerFault,
    ProviderFault,
    contender_name,
)
from stateful_tests.reach import rule

#: Every runner's lease, in seconds of the ledger's clock.
LEASE: Final = 30.0
_START: Final = datetime(2026, 1, 1, tzinfo=UTC)
#: What a zombie's late request meets at the provider: mostly success, the
#: case whose evidence the new owner must not lose (a fenced request is
#: refused by the provider whatever is drawn).
ZOMBIE_REQUEST: Final = st.sampled_from([ProviderFault.NONE] * 8 + list(ProviderFault))
#: Execute arguments that make up the request (the rest say how it is called).
_REQUEST: Final = ("amount", "alternate_reference")
#: Enough gates for any one call to finish (claim, takeover, start, provider,
#: verifier, record, completion, and the retries a policy allows).
_GATES_TO_FINISH: Final = 24
_MICROSECOND: Final = timedelta(microseconds=1)
#: How long a contender stalls right after the write that counted its attempt:
#: either side of a renewal interval, a whole lease and past it.
STALLS: Final = st.sampled_from(
    [LEASE / RENEWALS_PER_LEASE - 1, LEASE / RENEWALS_PER_LEASE, LEASE, LEASE + 1]
)
#: The writes after which a runner invokes with no other gate between.
_COUNTING_WRITES: Final = ("ledger.claim", "ledger.start_attempt")


class LedgerClock:
    """The ledger's wall clock, shared by every client; it moves when a rule says so.

    The ledgers read it through ``ticking``, which moves it on by one
    microsecond per read unless ``frozen`` (a caller asking for an expiry
    just too early is running: the age it asked for must stay out of reach).
    A receipt's claim and its completion are so stored at different moments,
    as on a real clock, and a rule that ages a receipt from the wrong write
    is measurably wrong.
    """

    def __init__(self) -> None:
        self.now = _START
        self.frozen: Callable[[], bool] = lambda: False

    def __call__(self) -> datetime:
        return self.now

    def ticking(self) -> datetime:
        """What a ledger reads: the time, then one microsecond on (unless frozen)."""
        now = self.now
        if not self.frozen():
            self.now += timedelta(microseconds=1)
        return now

    def advance(self, seconds: float) -> None:
        self.now += timedelta(seconds=seconds)


def _weight(holder: Any) -> int:
    if holder.parked_at != "provider.charge":
        return 1
    return 3 if holder.with_verifier else 5


class Heartbeats:
    """Parks the runners' own renewal tasks for good: the ``heartbeat`` rule renews instead.

    A renewal task reaches its sleep at a moment that depends on thread
    hops (SQLite, PostgreSQL), which would make the rules a run may draw
    depend on timing. So the rule renews on a holder's behalf, with the
    holder's own fencing token, exactly as its renewal task would.
    """

    @staticmethod
    def is_renewal() -> bool:
        task = asyncio.current_task()
        return task is not None and task.get_name().startswith(RENEWAL_TASK_NAME)

    def __init__(self) -> None:
        # Held here, so a parked renewal task is never collected mid-run.
        self.parked: list[asyncio.Future[None]] = []

    async def wait(self, owner: str) -> None:
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.parked.append(future)
        await future  # cancelled with its attempt


class LeaseRules:
    """Rules mixed into the runner machine (which provides the attributes used here)."""

    ledger_clock: LedgerClock
    heartbeats: Heartbeats
    history: Any
    scheduler: Any
    loop: Any
    observer: Any
    observed: dict[str, Any]
    contenders_list: list[Any]
    runner_class: ClassVar[Any]
    virtual_time: Any
    verifier: Any
    execute_arguments: ClassVar[dict[str, Any]]
    max_active: ClassVar[int]
    lease_grants: dict[str, LeaseGrant]
    #: Whether ``holder_stalls_after_its_write`` may run (not where a write
    #: waits for a group's commit: whether it returned within the rule would
    #: be timing, and runs of the same choices would differ).
    stalls_after_writes: ClassVar[bool] = True

    # Not while a caller frees a key by expiry: its age was asked for on the
    # ledger's clock as it stood (see LifecycleRules.expiry_age).
    @precondition(lambda self: not self.expiring())
    @rule()
    def lease_runs_out(self) -> None:
        """The ledger's clock passes one lease: every claim not renewed since may be taken over."""
        self.ledger_clock.advance(LEASE + 1)
        event("lease runs out")
        self.history.step += 1
        self.history.add(
            "ledger clock", f"{LEASE + 1:g} s pass: every lease held until now ran out"
        )
        self._after_lease_step()

    def _renewable(self) -> list[tuple[str, str, int]]:
        """(contender, action id, token) of every running caller that holds a PENDING claim."""
        held = []
        for c in self.contenders_list:
            if c.kind != "execute" or c.finished:
                continue
            for action_id, token in sorted(c.tokens.items()):
                stored = self.observed.get(action_id)
                if stored is not None and stored.is_pending:
                    held.append((c.name, action_id, token))
        return held

    @precondition(lambda self: bool(self._renewable()))
    @rule(data=st.data())
    def heartbeat(self, data: st.DataObject) -> None:
        """A running holder renews its lease with its fencing token (refused once taken over)."""
        name, action_id, token = data.draw(st.sampled_from(self._renewable()), label="renewal")
        self._renew(name, action_id, token)

    def _renew(self, name: str, action_id: str, token: int) -> None:
        before = self.loop.run(self.observer.get(action_id))
        since = self.ledger_clock.now
        renewed = self.loop.run(self.observer.renew(action_id, token, LEASE))
        if renewed:
            self.lease_grants[action_id] = LeaseGrant("renew", since, self.ledger_clock.now)
        event(f"heartbeat: {'renewed' if renewed else 'refused'}")
        self.history.step += 1
        self.history.add(
            f"contender {name}",
            f"renews its lease on {action_id[:8]} (token {token}): "
            + ("renewed" if renewed else "refused"),
        )
        if renewed and before is not None and before.fencing_token != token:
            holder = next(c for c in self.contenders_list if c.name == name)
            holder.lease_breaches.append(
                f"renewed claim {action_id[:8]} under fencing token {token} after it passed "
                f"to token {before.fencing_token}"
            )
        self._after_lease_step()

    def _holders(self) -> list[Any]:
        """Running callers parked while they hold a live PENDING claim under their own token."""
        holders = []
        for c in self.contenders_list:
            if c.kind != "execute" or c.finished or c.parked_at is None:
                continue
            for action_id, token in c.tokens.items():
                stored = self.observed.get(action_id)
                if stored is not None and stored.is_pending and stored.fencing_token == token:
                    holders.append(c)
                    break
        return holders

    # A zombie needs four things in order: a holder parked mid-protocol, its
    # lease running out, a duplicate taking the claim over and settling it,
    # and the holder coming back. Drawn one rule at a time they rarely met (a
    # bug that only a zombie's late success shows took 87 s to find); this
    # rule arranges them, drawing every fault on the way.
    @precondition(
        lambda self: (
            bool(self._holders()) and self._active() < self.max_active and not self.expiring()
        )
    )
    @rule(data=st.data())
    def holder_outlives_its_lease(self, data: st.DataObject) -> None:
        """A parked holder's lease runs out; a duplicate takes over and finishes; the holder resumes."""
        first = data.draw(st.sampled_from(["the taker", "the holder"]), label="finishes first")
        self._outlive(data, first)

    # The same, with the zombie's evidence landing while the taker's own
    # attempt runs: the taker's outcome must be recorded over it (V1 of
    # v0.2). A rule of its own, so that it is drawn as often as the rest:
    # as a third of the rule above, a planted bug there was found by one
    # seed in ten.
    @precondition(
        lambda self: (
            bool(self._holders()) and self._active() < self.max_active and not self.expiring()
        )
    )
    @rule(data=st.data())
    def zombie_lands_during_the_takers_attempt(self, data: st.DataObject) -> None:
        """A parked holder's lease runs out; the taker retries; the holder resumes mid-attempt."""
        self._outlive(data, "the holder, during the taker's attempt")

    def _outlive(self, data: st.DataObject, first: str) -> None:
        holders = {c.name: c for c in self._holders()}
        # A holder parked at its provider is the one whose late request may
        # still succeed, so it is drawn more often; more often still without
        # a verifier, when only its own success says the effect happened.
        if first == "the holder, during the taker's attempt":
            # Only a holder that has not sent its request leaves the taker an
            # absence to retry on: one parked at its provider, if there is one.
            at_provider = {n: c for n, c in holders.items() if c.parked_at == "provider.charge"}
            holders = at_provider or holders
        names = [n for n in sorted(holders) for _ in range(_weight(holders[n]))]
        holder = holders[data.draw(st.sampled_from(names), label="holder")]
        self.lease_runs_out()
        # The holder's own request: a conflicting one could never take over.
        drawn = {k: v for k, v in self.execute_arguments.items() if k not in _REQUEST}
        if first == "the holder, during the taker's attempt":
            # A taker that may run an attempt of its own: read-only evidence of
            # a retry-safe absence lets it retry (V1 of v0.2 lived there).
            drawn["policy"] = st.just("retry-failed")
            drawn["with_verifier"] = st.just(True)
        arguments = data.draw(st.fixed_dictionaries(drawn), label="duplicate")
        alternate = holder.reference.endswith("-alt")
        self.start_execute(
            holder.key, amount=holder.amount, alternate_reference=alternate, **arguments
        )
        taker = self.contenders_list[-1]
        # A taker whose own outcome must survive the zombie's merge: a fault
        # at any of its ledger gates would excuse its failure (and most runs
        # drew one), so its ledger calls meet faults a quarter as often.
        calm = first == "the holder, during the taker's attempt"
        for _ in range(_GATES_TO_FINISH):
            if taker.finished or taker.took_over:
                break
            self.advance_contender(taker, data, 1, calm_ledger=calm, truthful_verifier=calm)
        later = data.draw(st.integers(0, 3), label="taker's gates before the holder wakes")
        self.advance_contender(taker, data, later, calm_ledger=calm, truthful_verifier=calm)
        # The holder's renewal task wakes first: refused, the claim is taken.
        # (A renewal that beats the takeover is the heartbeat rule's business.)
        for action_id, token in sorted(holder.tokens.items()):
            stored = self.observed.get(action_id)
            if stored is not None and stored.is_pending:
                self._renew(holder.name, action_id, token)
        if first == "the holder, during the taker's attempt":
            # The taker runs on to its own attempt (a retry its evidence allows)
            # and waits at the provider while the zombie's evidence lands under it.
            for _ in range(_GATES_TO_FINISH):
                if taker.finished or taker.parked_at == "provider.charge":
                    break
                self.advance_contender(taker, data, 1, calm_ledger=True, truthful_verifier=True)
        order = (taker, holder) if first == "the taker" else (holder, taker)
        for c in order:
            zombie = c is holder
            self.advance_contender(
                c,
                data,
                _GATES_TO_FINISH,
                provider=ZOMBIE_REQUEST if zombie else None,
                calm_ledger=zombie or calm,
            )

    def _duplicate_of(
        self, holder: Any, data: st.DataObject, **forced: st.SearchStrategy[Any]
    ) -> Any | None:
        """Start a duplicate of ``holder``'s request (how it calls drawn, unless ``forced``).

        None if the machine refused to start it (its key is being freed).
        """
        drawn = {k: v for k, v in self.execute_arguments.items() if k not in _REQUEST}
        drawn.update(forced)
        arguments = data.draw(st.fixed_dictionaries(drawn), label="duplicate")
        started = len(self.contenders_list)
        self.start_execute(
            holder.key,
            amount=holder.amount,
            alternate_reference=holder.reference.endswith("-alt"),
            **arguments,
        )
        return self.contenders_list[-1] if len(self.contenders_list) > started else None

    def _about_to_count(self) -> list[Any]:
        """Running callers parked at a write that may count an attempt they then invoke."""
        return [
            c
            for c in self.contenders_list
            if c.kind == "execute" and not c.finished and c.parked_at in _COUNTING_WRITES
        ]

    # The stall sits where no gate is: between the write that counts an
    # attempt and the operation's call (an observer blocking the loop, a
    # paused process). Both clocks move together, as they would, and a
    # duplicate may take the claim over meanwhile. The stalled caller must
    # then renew before it invokes, or invoke nothing.
    @precondition(
        lambda self: (
            self.stalls_after_writes
            and bool(self._about_to_count())
            and self._active() < self.max_active
            and not self.expiring()
            and not self.lease_edge_pending()
        )
    )
    @rule(data=st.data(), seconds=STALLS)
    def holder_stalls_after_its_write(self, data: st.DataObject, seconds: float) -> None:
        """A caller's write counts its attempt; it stalls before the call while time passes (and a duplicate may take over)."""
        callers = {c.name: c for c in self._about_to_count()}
        c = callers[data.draw(st.sampled_from(sorted(callers)), label="stalled caller")]
        gate = c.parked_at
        c.stall_after_write = True
        self.history.step += 1
        self.scheduler.release(c, LedgerFault.NONE)
        self._after(c)
        if c.parked_at != STALLED:
            c.stall_after_write = False  # its write is still queued (a group's)
            return
        event(f"stall after {gate}: {seconds:g} s")
        self.virtual_time.now += seconds
        self.ledger_clock.advance(seconds)
        self.history.add(
            f"contender {c.name}",
            f"{gate} returned; it stalls {seconds:g} s before its next step (a blocking "
            "observer, a paused process): its clock and the ledger's move on together",
        )
        # A lease ends at exactly its expiry by the ledger's clock: a stall of
        # one lease is enough for a takeover.
        if seconds >= LEASE and data.draw(st.booleans(), label="a duplicate takes over meanwhile"):
            # One that may charge: retry-safe absence lets a taker retry.
            taker = self._duplicate_of(
                c, data, policy=st.just("retry-failed"), with_verifier=st.just(True)
            )
            for _ in range(_GATES_TO_FINISH if taker is not None else 0):
                assert taker is not None
                if taker.finished:
                    break
                self.advance_contender(taker, data, 1, calm_ledger=True, truthful_verifier=True)
        self.history.step += 1
        self.history.add(f"contender {c.name}", "wakes from its stall")
        self.scheduler.release(c, None)
        self._after(c)
        self._after_lease_step()

    def _leases_running(self) -> list[tuple[str, str]]:
        """(holder, action_id) of every parked holder's claim whose lease has not run out."""
        now = self.ledger_clock.now
        running = []
        for c in self._holders():
            for action_id, token in sorted(c.tokens.items()):
                stored = self.observed.get(action_id)
                if (
                    stored is not None
                    and stored.is_pending
                    and stored.fencing_token == token
                    and stored.lease_expires_at is not None
                    and stored.lease_expires_at - _MICROSECOND > now
                ):
                    running.append((c.name, action_id))
        return running

    def lease_edge_pending(self) -> bool:
        """Whether a duplicate sent at a lease's end has yet to take the claim or give up.

        The ledger's clock stands still meanwhile: a microsecond before the
        end must stay before it, and the end must not be passed.
        """
        return any(
            c.lease_edge is not None and not c.finished and not c.took_over
            for c in self.contenders_list
        )

    # Leases end at exactly ``lease_expires_at`` by the ledger's clock: a
    # takeover then succeeds, a microsecond before it is refused. The other
    # lease rules move the clock a whole lease past the end, where "<" and
    # "<=" agree.
    @precondition(
        lambda self: (
            bool(self._leases_running())
            and self._active() < self.max_active
            and not self.expiring()
        )
    )
    @rule(data=st.data())
    def a_lease_reaches_its_end(self, data: st.DataObject) -> None:
        """The ledger's clock reaches a parked holder's lease end (or a microsecond before); a duplicate arrives."""
        name, action_id = data.draw(st.sampled_from(self._leases_running()), label="lease")
        side = data.draw(st.sampled_from(["exactly", "early"]), label="the clock stands")
        holder = next(c for c in self.contenders_list if c.name == name)
        ends = self.observed[action_id].lease_expires_at
        assert ends is not None
        self.ledger_clock.now = ends - (_MICROSECOND if side == "early" else timedelta(0))
        self.history.step += 1
        self.history.add(
            "ledger clock",
            f"stands at {'a microsecond before ' if side == 'early' else ''}the end of "
            f"{holder.name}'s lease on {action_id[:8]} ({ends.isoformat()})",
        )
        event(f"lease edge: {side}")
        # A waiter would sleep on the clock that stands still: it gives up at once.
        taker = self._duplicate_of(holder, data, wait=st.just("no wait"))
        if taker is None:
            return  # the machine refused it (its key is being freed)
        taker.lease_edge = (side, action_id)
        taker.calm_ledger = True
        for _ in range(_GATES_TO_FINISH):
            if taker.finished or taker.took_over:
                break
            self.advance_contender(taker, data, 1, calm_ledger=True)
        self._after_lease_step()

    def _stale_claims(self) -> dict[str, tuple[int, Any]]:
        """action_id -> (token, lease end) of every PENDING claim whose lease has run out."""
        now = self.ledger_clock.now
        return {
            action_id: (r.fencing_token, r.lease_expires_at)
            for action_id, r in sorted(self.observed.items())
            if r.is_pending and r.lease_expires_at is not None and r.lease_expires_at <= now
        }

    @precondition(lambda self: bool(self._stale_claims()) and self._active() < self.max_active)
    @rule(with_verifier=st.booleans(), calm=st.booleans())
    def sweep(self, with_verifier: bool, calm: bool) -> None:
        """A sweeper (cron, or any worker) settles every claim whose lease ran out, invoking nothing.

        It runs in the first namespace (by name) with a stale claim, and sweeps
        only that namespace: a runner never touches another tenant's claims.
        """
        name = contender_name(len(self.contenders_list))
        stale = self._stale_claims()
        # Chosen by name, never by action id: ids are random, runs must repeat.
        namespace = min(self.observed[a].namespace for a in stale)
        # Half the sweeps meet ledger faults a quarter as often: whether a sweep
        # settles every stale claim is judged only for one that met none.
        c = Contender(
            name,
            "sweep",
            "*",
            "",
            with_verifier=with_verifier,
            namespace=namespace,
            calm_ledger=calm,
        )
        c.stale_at_start = {
            a: held for a, held in stale.items() if self.observed[a].namespace == namespace
        }
        keys = sorted({self.observed[a].idempotency_key for a in c.stale_at_start})
        self.history.add(
            f"contender {name}",
            f"recover_stale ({'with' if with_verifier else 'no'} verifier); stale now: "
            + ", ".join(keys),
        )
        runner = self.runner_class(
            self.gated(self.new_client()),
            clock=self.virtual_time,
            lease=LEASE,
            owner=name,
            namespace=namespace,
        )

        async def body() -> Any:
            return await runner.recover_stale(self.verifier if with_verifier else None)

        self._start(c, body)

    def _active(self) -> int:
        raise NotImplementedError

    def _after(self, c: Any) -> None:
        raise NotImplementedError

    def start_execute(self, key: str, **arguments: Any) -> None:
        raise NotImplementedError

    def _start(self, contender: Any, body: Any) -> None:
        raise NotImplementedError

    def new_client(self) -> Any:
        raise NotImplementedError

    def gated(self, client: Any) -> Any:
        raise NotImplementedError

    def advance_contender(
        self,
        c: Any,
        data: st.DataObject,
        gates: int,
        provider: st.SearchStrategy[ProviderFault] | None = None,
        calm_ledger: bool = False,
        truthful_verifier: bool = False,
    ) -> None:
        raise NotImplementedError

    def _after_lease_step(self) -> None:
        raise NotImplementedError
