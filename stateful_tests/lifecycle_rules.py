"""The receipt lifecycle in the runner machine: keys freed by expiry and by reopen.

``free_a_settled_key`` takes a key whose receipt is completed (CONFIRMED,
FAILED or UNKNOWN) and whose callers are all done, and starts one or two
callers that free it: ``execute(expires_after=...)`` asking for exactly the
age its receipt has reached by the ledger's clock (``expiry_age``; each
with the provider reference of a new mutation, one generation on), an
operator's ``reopen``, or both at once; or a caller that asks too early
with a clock running fast, which must free nothing. They race each other and whatever operators and provider
events the run adds; the properties in ``lifecycle_invariants`` judge who
freed what, and the world-truth properties judge every invocation.

While a key is being freed no plain ``execute`` of it starts: its caller
would still pass the provider reference of the old mutation, which a real
caller asking for a new one would not.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any, ClassVar, Final

from hypothesis import strategies as st
from hypothesis.stateful import precondition

from dataoad import ActionReceipt, ActionStatus
from stateful_tests.harness import Contender, contender_name, split_key
from stateful_tests.reach import rule

__all__ = ["EARLY_SKEW", "LifecycleRules", "SkewedClock"]

#: The least age a caller freeing a key by expiry asks for, in seconds: a
#: hundred thousand of the ledger clock's one-microsecond ticks, more than
#: any run makes, so a receipt written after the one asked about never
#: reaches it.
MIN_EXPIRY_AGE: Final = 0.1
#: How far ahead the clock of a caller asking too early runs (the skew of V2).
EARLY_SKEW: Final = timedelta(hours=2)
#: What a caller asking too early adds to the receipt's age by the ledger's
#: clock: mostly the least step the ledgers store (one microsecond: the
#: boundary's other side), else an hour.
TOO_EARLY_BY: Final = (0.000001, 0.000001, 3600.0)


class SkewedClock:
    """The machine's clock for one caller, its wall time ``skew`` off the host's.

    Nothing in the runner may decide by it: ages are the ledger's to judge,
    by the ledger's clock. Only a planted bug that compares a caller's wall
    time with a writer's ``updated_at`` reads it.
    """

    def __init__(self, base: Any, skew: timedelta) -> None:
        self.base = base
        self.skew = skew

    def monotonic(self) -> float:
        return float(self.base.monotonic())

    async def sleep(self, seconds: float) -> None:
        await self.base.sleep(seconds)

    def wall_time(self) -> datetime:
        return datetime.now(UTC) + self.skew


class LifecycleRules:
    """Rules and bookkeeping for freeing keys; mixed into the runner machine."""

    contenders_list: list[Contender]
    history: Any
    observed: dict[str, ActionReceipt]
    order_keys: list[str]
    max_active: ClassVar[int]

    def generation(self, key: str) -> int:
        """How often the key was freed (retired, or pruned): its next claim's reference suffix.

        A pruned receipt leaves ``observed``, so it is counted from the prunes.
        """
        wanted = split_key(key)
        retired = sum(
            1
            for r in self.observed.values()
            if r.retired_at is not None and (r.namespace, r.idempotency_key) == wanted
        )
        pruned = sum(
            1
            for c in self.contenders_list
            for r in c.pruned
            # Retired before or freed by the prune: either way one mutation ago.
            if (r.namespace, r.idempotency_key) == wanted
        )
        return retired + pruned

    def expiry_age(self, key: str, *, early: float = 0.0) -> float:
        """What a caller freeing ``key`` by expiry asks for, judged by the ledger's clock.

        Exactly the age of the receipt holding the key now (at least
        MIN_EXPIRY_AGE, moving the ledger's clock that far when needed):
        that receipt has expired for this caller, and a receipt written
        after it (another caller's new claim) has not: the clock moves a
        microsecond per ledger read, and a run makes far fewer reads than
        MIN_EXPIRY_AGE takes. A caller asking ``early`` asks
        for that many seconds more: it must replay (the clock stands still
        while it runs, ``asking_too_early``).
        """
        held = self.holder(key)
        clock = getattr(self, "ledger_clock")  # noqa: B009  (the runner machine's)
        if held is None or held.stored_at is None:
            return early or MIN_EXPIRY_AGE
        age: float = (clock.now - held.stored_at).total_seconds()
        if age < MIN_EXPIRY_AGE:
            clock.advance(MIN_EXPIRY_AGE - age)
            self.history.add("ledger clock", f"{MIN_EXPIRY_AGE - age:g} s pass")
            age = MIN_EXPIRY_AGE
        return age + early

    def _definitive(self, key: str) -> bool:
        held = self.holder(key)
        return held is not None and held.final_status in (
            ActionStatus.CONFIRMED,
            ActionStatus.FAILED,
        )

    def asking_too_early(self) -> bool:
        """Whether a caller asking for an expiry too early is still running.

        The ledger's clock then stands still (``LedgerClock.frozen``): the
        age it asked for stays just out of reach. Callers asking for an age
        reached need no such care: the age they asked for only grows.
        """
        return any(not c.finished and c.too_early_by for c in self.contenders_list)

    def expiring(self) -> bool:
        """Whether a caller freeing a key by expiry is still running (the ledger clock waits)."""
        return any(not c.finished and c.expires_after is not None for c in self.contenders_list)

    def keys_being_freed(self) -> set[str]:
        """Keys an unfinished caller is freeing (expiring or reopening)."""
        return {
            c.key
            for c in self.contenders_list
            if not c.finished and (c.kind == "reopen" or c.expires_after is not None)
        }

    def namespaces_being_pruned(self) -> set[str]:
        """Namespaces a running prune is deleting from."""
        return {c.namespace for c in self.contenders_list if not c.finished and c.kind == "prune"}

    def holder(self, key: str) -> ActionReceipt | None:
        """The observed receipt holding ``key``, if any."""
        wanted = split_key(key)
        for r in self.observed.values():
            if r.retired_at is None and (r.namespace, r.idempotency_key) == wanted:
                return r
        return None

    def _settled_keys(self) -> list[str]:
        busy = {c.key for c in self.contenders_list if c.alive}
        return [
            key
            for key in self.order_keys
            if key not in busy and (held := self.holder(key)) is not None and not held.is_pending
        ]

    # One key's expiry at a time: its age was asked for on the ledger's clock
    # as it stood, and the next expiry may move that clock (expiry_age).
    @precondition(
        lambda self: (
            bool(self._settled_keys()) and self._active() < self.max_active and not self.expiring()
        )
    )
    @rule(
        data=st.data(),
        how=st.sampled_from(
            [
                "expire",
                "expire twice",
                "reopen",
                "reopen",
                "reopen and expire",
                "expire too early",
                # Both sides of the boundary at once: the key's receipt must
                # stay for the first caller and be freed for the second.
                "too early, then exactly",
            ]
        ),
        policy=st.sampled_from(["default", "retry-failed"]),
        with_verifier=st.booleans(),
    )
    def free_a_settled_key(
        self, data: st.DataObject, how: str, policy: str, with_verifier: bool
    ) -> None:
        """Callers free a settled key: by expiry, by reopen, or both racing; or ask too early.

        A caller asking too early asks for an age its key's receipt has not
        reached by the ledger's clock, while its own clock runs EARLY_SKEW
        fast: it must replay (or be refused), never free the key.
        """
        settled = self._settled_keys()
        if how.startswith("reopen") or "early" in how:
            # A definitive receipt is the one a reopen frees or must refuse,
            # and the one whose age a caller asking too early must not reach:
            # drawn three times as often for those (operators reopen UNKNOWN
            # receipts often already, and "expire" still draws every key).
            settled += 2 * [k for k in settled if self._definitive(k)]
        key = data.draw(st.sampled_from(settled), label="settled key")
        early = 0.0
        if how in ("expire too early", "too early, then exactly"):
            early = data.draw(st.sampled_from(TOO_EARLY_BY), label="too early by (s)")
        if how.startswith("reopen"):
            self.operate(key, "reopen")
        expirers = {
            "expire": 1,
            "expire twice": 2,
            "reopen": 0,
            "reopen and expire": 1,
            "expire too early": 1,
            "too early, then exactly": 2,
        }[how]
        for n in range(expirers):
            if self._active() >= self.max_active:
                break
            self.start_execute(
                key,
                amount=100,
                alternate_reference=False,
                policy=policy,
                with_verifier=with_verifier,
                wait="wait 1 s",
                expires=True,
                early=early if n == 0 else 0.0,
            )

    def _quiet_namespaces(self) -> list[str]:
        """Namespaces with a completed receipt and no caller of ``execute`` still running."""
        busy = {
            c.namespace
            for c in self.contenders_list
            if c.alive and (c.kind == "execute" or c.kind == "reopen")
        }
        return sorted({r.namespace for r in self.observed.values() if not r.is_pending} - busy)

    # Retention beside live callers of another namespace, and beside operators
    # (a reconcile merging into a receipt being pruned) of its own. Not beside
    # callers of its own namespace: a caller still running would claim a pruned
    # key again with the old mutation's reference (see the module docstring).
    @precondition(lambda self: bool(self._quiet_namespaces()) and self._active() < self.max_active)
    @rule(
        data=st.data(),
        statuses=st.sampled_from(
            [
                (ActionStatus.CONFIRMED, ActionStatus.FAILED),
                (ActionStatus.CONFIRMED, ActionStatus.FAILED),
                (ActionStatus.UNKNOWN,),
                (ActionStatus.FAILED, ActionStatus.UNKNOWN),
            ]
        ),
    )
    def retention_runs(self, data: st.DataObject, statuses: tuple[ActionStatus, ...]) -> None:
        """``prune`` of one namespace's completed receipts in the named statuses, in batches of 1."""
        namespace = data.draw(st.sampled_from(self._quiet_namespaces()), label="namespace")
        name = contender_name(len(self.contenders_list))
        c = Contender(name, "prune", "*", "", namespace=namespace, prune_statuses=statuses)
        named = ",".join(s.value for s in statuses)
        self.history.add(f"contender {name}", f"prune namespace {namespace!r}: every {named}")
        ledger = self.gated(self.new_client())

        async def body() -> Any:
            return await ledger.prune(
                completed_before=datetime.now(UTC) + timedelta(days=1),
                statuses=statuses,
                namespace=namespace,
                batch_size=1,
            )

        self._start(c, body)

    # Provided by the runner machine.
    def _active(self) -> int:
        raise NotImplementedError

    def operate(self, key: str, how: str) -> None:
        raise NotImplementedError

    def start_execute(self, key: str, **arguments: Any) -> None:
        raise NotImplementedError

    def gated(self, client: Any) -> Any:
        raise NotImplementedError

    def new_client(self) -> Any:
        raise NotImplementedError

    def _start(self, contender: Any, body: Any) -> None:
        raise NotImplementedError
