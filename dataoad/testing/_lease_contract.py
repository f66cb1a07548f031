"""The lease part of the ledger contract: takeover, renewal and fencing on every backend.

Backend authors mix :class:`LeaseContract` into their contract test class and
provide ``make_leasing_ledger(clock)``: a ledger on fresh storage that reads
the time from ``clock`` (a :class:`ManualClock`), so the checks can let a
lease run out without waiting. ``leasing_peer(ledger, clock)`` may return a
second client of the same storage.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime, timedelta
from typing import Any

from dataoad._ledger import LeasingLedger
from dataoad._receipt import ActionReceipt
from dataoad._status import ActionStatus
from dataoad.testing._contract_receipts import completed, make_receipt, started

__all__ = ["LeaseContract", "ManualClock"]

LEASE = 30.0
#: The smallest step of a stored time: the checks stand on both sides of each boundary.
MICROSECOND = 1e-6


class ManualClock:
    """A ledger clock that moves only when told to."""

    def __init__(self, start: datetime | None = None) -> None:
        self.now = start or datetime(2026, 6, 1, 12, 0, 0, 250000, tzinfo=UTC)

    def __call__(self) -> datetime:
        return self.now

    def advance(self, seconds: float) -> None:
        """Let ``seconds`` pass on this clock."""
        self.now += timedelta(seconds=seconds)


def _taken(receipt: ActionReceipt, owner: str = "B") -> ActionReceipt:
    return receipt.evolve(
        owner=owner,
        fencing_token=receipt.fencing_token + 1,
        version=receipt.version + 1,
        updated_at=receipt.updated_at + timedelta(seconds=1),
    )


class LeaseContract:
    """Every lease check a LeasingLedger must pass."""

    #: Concurrent contenders in the takeover race.
    takers = 8

    def make_leasing_ledger(self, clock: ManualClock) -> LeasingLedger:
        """A new ledger on fresh storage that judges leases by ``clock``."""
        raise NotImplementedError

    def leasing_peer(self, ledger: LeasingLedger, clock: ManualClock) -> LeasingLedger:
        """Another client of the same storage, on the same clock (default: the same one)."""
        return ledger

    def _lease_run(
        self, check: Callable[[LeasingLedger, ManualClock, list[Any]], Awaitable[None]]
    ) -> None:
        async def main() -> None:
            clock = ManualClock()
            ledger = self.make_leasing_ledger(clock)
            extra: list[Any] = []
            try:
                await check(ledger, clock, extra)
            finally:
                for other in extra:
                    if other is not ledger:
                        await other.close()
                await ledger.close()

        asyncio.run(main())

    async def _claimed(self, ledger: LeasingLedger, **changes: Any) -> ActionReceipt:
        receipt = make_receipt(owner="A", **changes)
        stored, created = await ledger.claim(receipt, lease=LEASE)
        assert created
        return stored

    def test_a_claim_carries_its_lease_from_the_ledger_clock(self) -> None:
        """The lease runs out exactly ``lease`` seconds after the claim, by the ledger's clock."""

        async def check(ledger: LeasingLedger, clock: ManualClock, extra: list[Any]) -> None:
            stored = await self._claimed(ledger)
            again = await ledger.get(stored.action_id)
            assert again is not None
            assert again.owner == "A"
            assert again.fencing_token == 1
            assert again.lease_expires_at == clock.now + timedelta(seconds=LEASE)
            assert stored.lease_expires_at == again.lease_expires_at
            unleased = make_receipt(idempotency_key="no-lease")
            await ledger.claim(unleased)
            plain = await ledger.get(unleased.action_id)
            assert plain is not None
            assert plain.lease_expires_at is None

        self._lease_run(check)

    def test_takeover_waits_for_expiry_and_fences(self) -> None:
        """A live lease cannot be taken; an expired one passes once, under token + 1."""

        async def check(ledger: LeasingLedger, clock: ManualClock, extra: list[Any]) -> None:
            stored = await self._claimed(ledger)
            clock.advance(LEASE - MICROSECOND)
            assert not await ledger.take_over(_taken(stored), lease=LEASE)
            clock.advance(MICROSECOND)  # exactly its end: expired
            assert await ledger.take_over(_taken(stored), lease=LEASE)
            now = await ledger.get(stored.action_id)
            assert now is not None
            assert (now.owner, now.fencing_token, now.version) == ("B", 2, 2)
            assert now.lease_expires_at == clock.now + timedelta(seconds=LEASE)
            # The same takeover again, or one skipping a token, changes nothing.
            clock.advance(LEASE + 1)
            assert not await ledger.take_over(_taken(stored, "C"), lease=LEASE)
            assert not await ledger.take_over(
                _taken(now, "C").evolve(fencing_token=now.fencing_token + 2), lease=LEASE
            )
            assert await ledger.get(stored.action_id) == now

        self._lease_run(check)

    def test_takeover_changes_only_the_holder(self) -> None:
        """A takeover that also tries to change the claim's facts writes nothing of them."""

        async def check(ledger: LeasingLedger, clock: ManualClock, extra: list[Any]) -> None:
            stored = await self._claimed(ledger)
            one = started(stored)
            assert await ledger.start_attempt(one, lease=LEASE)
            clock.advance(LEASE + 1)
            sneaky = _taken(one).evolve(error="changed", attempts=0, attempt_records=())
            assert not await ledger.take_over(sneaky, lease=LEASE)
            assert await ledger.get(one.action_id) == one
            assert await ledger.take_over(_taken(one), lease=LEASE)
            after = await ledger.get(one.action_id)
            assert after == _taken(one)

        self._lease_run(check)

    def test_completed_and_unleased_claims_are_never_taken_over(self) -> None:
        """Only a PENDING claim with a lease that ran out can change owner."""

        async def check(ledger: LeasingLedger, clock: ManualClock, extra: list[Any]) -> None:
            stored = await self._claimed(ledger)
            one = started(stored)
            assert await ledger.start_attempt(one, lease=LEASE)
            done = completed(one, ActionStatus.UNKNOWN)
            assert await ledger.record(done)
            stored_done = await ledger.get(done.action_id)
            assert stored_done is not None
            assert stored_done.lease_expires_at is None
            unleased = make_receipt(idempotency_key="no-lease")
            await ledger.claim(unleased)
            clock.advance(10 * LEASE)
            assert not await ledger.take_over(_taken(done), lease=LEASE)
            assert not await ledger.take_over(_taken(unleased), lease=LEASE)

        self._lease_run(check)

    def test_one_of_many_concurrent_takeovers_wins(self) -> None:
        """Racing takers of one expired claim: exactly one becomes its owner."""

        async def check(ledger: LeasingLedger, clock: ManualClock, extra: list[Any]) -> None:
            stored = await self._claimed(ledger)
            clock.advance(LEASE + 1)
            peers = [self.leasing_peer(ledger, clock) for _ in range(self.takers)]
            extra.extend(peers)
            wins = await asyncio.gather(
                *(
                    peer.take_over(_taken(stored, f"T{i}"), lease=LEASE)
                    for i, peer in enumerate(peers)
                )
            )
            assert sum(wins) == 1
            now = await ledger.get(stored.action_id)
            assert now is not None
            assert now.owner == f"T{wins.index(True)}"
            assert now.fencing_token == 2

        self._lease_run(check)

    async def _started_then_taken(
        self, ledger: LeasingLedger, clock: ManualClock
    ) -> tuple[ActionReceipt, ActionReceipt]:
        """A's claim with attempt 1 started, then taken over by B: (A's last write, stored)."""
        one = started(await self._claimed(ledger))
        assert await ledger.start_attempt(one, lease=LEASE)
        clock.advance(LEASE + 1)
        assert await ledger.take_over(_taken(one), lease=LEASE)
        after = await ledger.get(one.action_id)
        assert after is not None
        return one, after

    def test_a_fenced_owner_can_no_longer_write_or_renew(self) -> None:
        """After a takeover, the old owner's attempt start, record and renewal are refused."""

        async def check(ledger: LeasingLedger, clock: ManualClock, extra: list[Any]) -> None:
            one, after = await self._started_then_taken(ledger, clock)
            assert not await ledger.renew(one.action_id, 1, LEASE)
            assert not await ledger.record(completed(one))
            # Even written at the current version, the old fence is refused.
            stale = completed(after).evolve(owner="A", fencing_token=1)
            assert not await ledger.record(stale)
            assert not await ledger.start_attempt(started(after).evolve(owner="A", fencing_token=1))
            assert await ledger.get(one.action_id) == after
            assert await ledger.renew(one.action_id, 2, LEASE)

        self._lease_run(check)

    def test_renewal_restarts_the_lease_and_beats_a_later_takeover(self) -> None:
        """A renewal moves the expiry without a new version, so a takeover must wait again."""

        async def check(ledger: LeasingLedger, clock: ManualClock, extra: list[Any]) -> None:
            stored = await self._claimed(ledger)
            clock.advance(LEASE - 1)
            assert await ledger.renew(stored.action_id, 1, LEASE)
            renewed = await ledger.get(stored.action_id)
            assert renewed is not None
            assert renewed.version == stored.version
            assert renewed.lease_expires_at == clock.now + timedelta(seconds=LEASE)
            # From the renewal, not from the claim or the old end.
            clock.advance(LEASE - MICROSECOND)
            assert not await ledger.take_over(_taken(stored), lease=LEASE)
            # Expired (exactly at its end) but not yet taken over: the owner may still renew.
            clock.advance(MICROSECOND)
            assert await ledger.renew(stored.action_id, 1, LEASE)
            assert not await ledger.take_over(_taken(stored), lease=LEASE)

        self._lease_run(check)

    def test_a_pending_record_keeps_the_lease_and_completion_clears_it(self) -> None:
        """The lease is the ledger's: kept by PENDING writes, gone once COMPLETED."""

        async def check(ledger: LeasingLedger, clock: ManualClock, extra: list[Any]) -> None:
            stored = await self._claimed(ledger)
            expires = stored.lease_expires_at
            clock.advance(5)
            # The writer's idea of the lease is ignored: the ledger keeps its own.
            noted = stored.evolve(metadata={"note": 1}, version=2).evolve(
                lease_expires_at=clock.now + timedelta(days=1)
            )
            assert await ledger.record(noted)
            kept = await ledger.get(stored.action_id)
            assert kept is not None
            assert kept.lease_expires_at == expires
            one = started(kept)
            assert await ledger.start_attempt(one, lease=LEASE)
            moved = await ledger.get(one.action_id)
            assert moved is not None
            assert moved.lease_expires_at == clock.now + timedelta(seconds=LEASE)
            assert await ledger.record(completed(moved))
            done = await ledger.get(one.action_id)
            assert done is not None
            assert done.lease_expires_at is None

        self._lease_run(check)

    def test_a_write_needs_both_the_owner_and_the_fence_that_hold_the_claim(self) -> None:
        """Holding the token without the name, or the name without the token, is not holding it."""

        async def check(ledger: LeasingLedger, clock: ManualClock, extra: list[Any]) -> None:
            _, after = await self._started_then_taken(ledger, clock)
            assert (after.owner, after.fencing_token) == ("B", 2)
            for owner, token in (("A", 2), ("B", 1), ("C", 2)):
                impostor = after.evolve(owner=owner, fencing_token=token)
                assert not await ledger.start_attempt(started(impostor), lease=LEASE)
                assert not await ledger.record(completed(impostor))
            assert await ledger.get(after.action_id) == after
            assert await ledger.record(completed(after))

        self._lease_run(check)

    def test_the_stale_listing_uses_the_ledger_clock(self) -> None:
        """receipts(stale=True) lists exactly the PENDING claims whose lease ran out."""

        async def check(ledger: LeasingLedger, clock: ManualClock, extra: list[Any]) -> None:
            listing = getattr(ledger, "receipts", None)
            assert callable(listing), "a leasing ledger must offer the inspection listing"
            early = await self._claimed(ledger, idempotency_key="early")
            clock.advance(20)
            late = await self._claimed(ledger, idempotency_key="late")
            await ledger.claim(make_receipt(idempotency_key="unleased"))
            clock.advance(LEASE - 20 - MICROSECOND)
            assert await listing(stale=True) == []  # a microsecond before its end
            clock.advance(MICROSECOND)  # exactly at it
            stale = await listing(stale=True)
            assert [r.action_id for r in stale] == [early.action_id]
            fresh = {r.action_id for r in await listing(stale=False)}
            assert late.action_id in fresh
            assert early.action_id not in fresh
            assert len(fresh) == 2

        self._lease_run(check)
