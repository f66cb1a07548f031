"""The lifecycle part of the ledger contract: namespaces, retiring keys, pruning.

Mix :class:`LifecycleContract` into a contract test class that already
provides ``make_leasing_ledger(clock)`` (and optionally ``peer(ledger)``)
for a ledger with ``retire``, ``prune`` and the ``receipts`` listing: ages
are judged by the ledger's own clock, so the checks drive that clock. The rules checked
are ``dataoad._lifecycle``'s: a key is held by at most one receipt per
namespace; only a completed CONFIRMED or FAILED receipt may give it up, at
its exact version, and stays readable; retention deletes only completed
receipts in the named statuses, never one that changed under it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

from dataoad._errors import InvalidArgumentError
from dataoad._receipt import ActionReceipt
from dataoad._status import ActionStatus
from dataoad.testing._contract_receipts import _T0, completed, make_receipt, started
from dataoad.testing._lease_contract import ManualClock

__all__ = ["LifecycleContract"]

_CUT = datetime(2026, 3, 1, tzinfo=UTC)


def retired(receipt: ActionReceipt, *, seconds: int = 1) -> ActionReceipt:
    """The retiring transition of ``receipt``: the key freed, nothing else changed."""
    at = receipt.updated_at + timedelta(seconds=seconds)
    return receipt.evolve(retired_at=at, version=receipt.version + 1, updated_at=at)


class LifecycleContract:
    """Every lifecycle check a ledger with ``retire`` and ``prune`` must pass."""

    #: Concurrent contenders in the races.
    racers = 8

    #: The ledger's clock during a check; ``_aged`` moves it.
    clock: ManualClock

    def make_leasing_ledger(self, clock: ManualClock) -> Any:
        """A new ledger on fresh storage whose own clock is ``clock``."""
        raise NotImplementedError

    def peer(self, ledger: Any) -> Any:
        """Another client of the same storage (default: the same instance)."""
        return ledger

    def _life(self, check: Callable[[Any], Awaitable[None]]) -> None:
        async def main() -> None:
            self.clock = ManualClock(_CUT - timedelta(days=100))
            ledger = self.make_leasing_ledger(self.clock)
            try:
                await check(ledger)
            finally:
                await ledger.close()

        asyncio.run(main())

    async def _done(
        self, ledger: Any, status: ActionStatus = ActionStatus.CONFIRMED, **changes: Any
    ) -> ActionReceipt:
        """A claim stored, started and completed with ``status``."""
        claim, created = await ledger.claim(make_receipt(**changes))
        assert created
        one = started(claim)
        assert await ledger.start_attempt(one)
        final = completed(one, status)
        assert await ledger.record(final)
        return final

    # -- namespaces ----------------------------------------------------------------

    def test_a_key_in_one_namespace_never_meets_the_same_key_in_another(self) -> None:
        async def check(ledger: Any) -> None:
            claims = {}
            for namespace in ("", "tenant-a", "tenant-b"):
                claim, created = await ledger.claim(make_receipt(namespace=namespace))
                assert created, namespace
                claims[namespace] = claim
            for namespace, claim in claims.items():
                assert await ledger.find("charge", "order-1", namespace) == claim
            assert await ledger.find("charge", "order-1") == claims[""]
            assert await ledger.find("charge", "order-1", "tenant-c") is None
            assert await ledger.release(claims["tenant-a"].action_id, 1)
            assert await ledger.find("charge", "order-1", "tenant-a") is None
            assert await ledger.find("charge", "order-1", "tenant-b") == claims["tenant-b"]
            listed = await ledger.receipts(namespace="tenant-b")
            assert [r.action_id for r in listed] == [claims["tenant-b"].action_id]
            assert {r.namespace for r in await ledger.receipts()} == {"", "tenant-b"}

        self._life(check)

    def test_a_listing_newest_first_is_the_exact_reverse_and_its_limit_keeps_the_newest(
        self,
    ) -> None:
        async def check(ledger: Any) -> None:
            # Two share a creation time: the action id breaks the tie, both ways.
            second = _T0 + timedelta(seconds=1)
            times = [_T0, second, second, _T0 + timedelta(seconds=2)]
            for n, at in enumerate(times):
                await ledger.claim(
                    make_receipt(idempotency_key=f"k{n}", created_at=at, updated_at=at)
                )
            oldest = [r.action_id for r in await ledger.receipts()]
            newest = [r.action_id for r in await ledger.receipts(newest_first=True)]
            assert newest == oldest[::-1]
            newest_two = await ledger.receipts(newest_first=True, limit=2)
            assert [r.action_id for r in newest_two] == oldest[:-3:-1]
            assert [r.action_id for r in await ledger.receipts(limit=2)] == oldest[:2]
            filtered = await ledger.receipts(newest_first=True, since=times[1], limit=1)
            assert [r.action_id for r in filtered] == oldest[-1:]

        self._life(check)

    def test_a_transition_cannot_move_a_receipt_to_another_namespace(self) -> None:
        async def check(ledger: Any) -> None:
            claim, _ = await ledger.claim(make_receipt(namespace="tenant-a"))
            assert not await ledger.start_attempt(started(claim).evolve(namespace="tenant-b"))
            assert not await ledger.record(claim.evolve(version=2, namespace="tenant-b"))
            assert await ledger.get(claim.action_id) == claim

        self._life(check)

    # -- retiring a key ----------------------------------------------------------------

    def test_retiring_frees_the_key_and_keeps_the_receipt(self) -> None:
        async def check(ledger: Any) -> None:
            for status in (ActionStatus.CONFIRMED, ActionStatus.FAILED):
                final = await self._done(ledger, status, idempotency_key=f"k-{status.value}")
                old = retired(final)
                assert await ledger.retire(old)
                assert await ledger.get(final.action_id) == old
                assert await ledger.find("charge", final.idempotency_key) is None
                fresh, created = await ledger.claim(
                    make_receipt(idempotency_key=final.idempotency_key)
                )
                assert created
                assert await ledger.find("charge", final.idempotency_key) == fresh
                assert await ledger.get(final.action_id) == old  # still readable

        self._life(check)

    def test_only_a_definitive_receipt_at_its_version_can_be_retired(self) -> None:
        async def check(ledger: Any) -> None:
            unknown = await self._done(ledger, ActionStatus.UNKNOWN, idempotency_key="u")
            pending, _ = await ledger.claim(make_receipt(idempotency_key="p"))
            running = started(pending)
            assert await ledger.start_attempt(running)
            confirmed = await self._done(ledger, idempotency_key="c")
            refused = [
                retired(unknown),
                retired(running),
                retired(confirmed).evolve(version=confirmed.version + 2),
                retired(confirmed).evolve(retired_at=None),
                retired(confirmed).evolve(final_status=ActionStatus.FAILED),
                retired(confirmed).evolve(metadata={"changed": True}),
                retired(confirmed).evolve(owner="someone-else"),
            ]
            for proposal in refused:
                assert not await ledger.retire(proposal), proposal
            assert await ledger.get(unknown.action_id) == unknown
            assert await ledger.get(running.action_id) == running
            assert await ledger.get(confirmed.action_id) == confirmed
            assert await ledger.find("charge", "u") == unknown
            once = retired(confirmed)
            assert await ledger.retire(once)
            assert not await ledger.retire(retired(once))  # never twice

        self._life(check)

    def test_no_write_restores_a_retired_key(self) -> None:
        async def check(ledger: Any) -> None:
            final = await self._done(ledger, ActionStatus.FAILED)
            old = retired(final)
            assert await ledger.retire(old)
            restore = old.evolve(retired_at=None, version=old.version + 1)
            assert not await ledger.record(restore)
            # Evidence may still be merged into the retired receipt; it stays retired.
            merged = old.evolve(metadata={"note": "late evidence"}, version=old.version + 1)
            assert await ledger.record(merged)
            assert await ledger.get(final.action_id) == merged
            assert await ledger.find("charge", final.idempotency_key) is None

        self._life(check)

    def test_exactly_one_of_racing_retirements_and_fresh_claims_wins(self) -> None:
        async def check(ledger: Any) -> None:
            final = await self._done(ledger)
            peers = [self.peer(ledger) for _ in range(self.racers)]
            try:
                wins = await asyncio.gather(
                    *(p.retire(retired(final, seconds=i + 1)) for i, p in enumerate(peers))
                )
                assert sum(wins) == 1
                claims = await asyncio.gather(*(p.claim(make_receipt()) for p in peers))
                assert sum(created for _, created in claims) == 1
                holder = await ledger.find("charge", "order-1")
                assert holder is not None
                assert holder.holds_key
                assert all(stored.action_id == holder.action_id for stored, _ in claims)
            finally:
                for p in peers:
                    if p is not ledger:
                        await p.close()

        self._life(check)

    # -- retention ---------------------------------------------------------------------

    async def _aged(
        self, ledger: Any, status: ActionStatus | None, key: str, *, days: int, namespace: str = ""
    ) -> ActionReceipt:
        """A receipt stored ``days`` before the cut by the ledger's clock (PENDING: status None)."""
        at = _CUT - timedelta(days=days)
        self.clock.now = at
        base = make_receipt(idempotency_key=key, namespace=namespace, created_at=at, updated_at=at)
        try:
            if status is None:
                claim, _ = await ledger.claim(base)
                return claim  # type: ignore[no-any-return]
            return await self._done(ledger, status, **_fields(base))
        finally:
            self.clock.now = _CUT + timedelta(days=2)  # the prunes come later

    def test_prune_deletes_only_old_completed_receipts_in_the_named_statuses(self) -> None:
        async def check(ledger: Any) -> None:
            old_ok = await self._aged(ledger, ActionStatus.CONFIRMED, "a", days=40)
            old_failed = await self._aged(ledger, ActionStatus.FAILED, "b", days=40)
            old_unknown = await self._aged(ledger, ActionStatus.UNKNOWN, "c", days=40)
            old_pending = await self._aged(ledger, None, "d", days=40)
            young = await self._aged(ledger, ActionStatus.CONFIRMED, "e", days=-1)
            other = await self._aged(ledger, ActionStatus.CONFIRMED, "f", days=40, namespace="t")
            assert await ledger.prune(completed_before=_CUT, namespace="") == 2
            ids = {r.action_id for r in await ledger.receipts()}
            assert ids == {
                old_unknown.action_id,
                old_pending.action_id,
                young.action_id,
                other.action_id,
            }
            assert await ledger.get(old_ok.action_id) is None
            assert await ledger.get(old_failed.action_id) is None
            assert await ledger.prune(completed_before=_CUT) == 1  # namespace t
            assert await ledger.prune(completed_before=_CUT, statuses=[ActionStatus.UNKNOWN]) == 1
            # PENDING is never pruned, whatever is named.
            assert await ledger.prune(completed_before=_CUT, statuses=list(ActionStatus)) == 0
            remaining = {r.action_id for r in await ledger.receipts()}
            assert remaining == {old_pending.action_id, young.action_id}
            # The freed keys can be claimed again; the kept ones are still held.
            assert (await ledger.claim(make_receipt(idempotency_key="a")))[1]
            assert not (await ledger.claim(make_receipt(idempotency_key="d")))[1]

        self._life(check)

    def test_prune_works_in_batches_and_shows_each_batch_before_deleting_it(self) -> None:
        async def check(ledger: Any) -> None:
            made = [
                await self._aged(ledger, ActionStatus.CONFIRMED, f"k{i}", days=10 + i)
                for i in range(5)
            ]
            assert await ledger.prune(completed_before=_CUT, dry_run=True) == 5
            assert len(await ledger.receipts()) == 5  # a dry run deletes nothing
            batches: list[list[str]] = []

            async def before_delete(batch: Sequence[ActionReceipt]) -> None:
                for receipt in batch:  # nothing of the batch is deleted yet
                    assert await ledger.get(receipt.action_id) == receipt
                batches.append([r.action_id for r in batch])

            assert (
                await ledger.prune(completed_before=_CUT, batch_size=2, before_delete=before_delete)
                == 5
            )
            assert [len(b) for b in batches] == [2, 2, 1]
            # Oldest first by the ledger's time of storing: k4 was stored first.
            oldest_first = [r.action_id for r in reversed(made)]
            assert [i for b in batches for i in b] == oldest_first
            assert await ledger.receipts() == []

        self._life(check)

    def test_prune_reads_each_receipt_once_when_many_share_a_whole_second(self) -> None:
        async def check(ledger: Any) -> None:
            # Stored at whole seconds (no microseconds), four at one and the
            # same moment: every batch edge falls on a shared time somewhere.
            made = [
                await self._aged(ledger, ActionStatus.CONFIRMED, f"s{i}", days=9) for i in range(4)
            ]
            made += [
                await self._aged(ledger, ActionStatus.FAILED, f"t{i}", days=8 + i) for i in range(2)
            ]
            assert all(r.stored_at is None or r.stored_at.microsecond == 0 for r in made)
            for size in (1, 2, 3, 500):
                counted = await asyncio.wait_for(
                    ledger.prune(completed_before=_CUT, dry_run=True, batch_size=size), 30
                )
                assert counted == 6, f"batch_size={size} counted {counted} of 6"
            seen: list[str] = []
            deleted = await asyncio.wait_for(
                ledger.prune(
                    completed_before=_CUT,
                    batch_size=1,
                    before_delete=lambda batch: seen.extend(r.action_id for r in batch),
                ),
                30,
            )
            assert deleted == 6
            assert sorted(seen) == sorted(r.action_id for r in made)
            assert await ledger.receipts() == []

        self._life(check)

    def test_prune_keeps_a_receipt_that_changed_while_being_pruned(self) -> None:
        async def check(ledger: Any) -> None:
            one = await self._aged(ledger, ActionStatus.UNKNOWN, "x", days=40)
            two = await self._aged(ledger, ActionStatus.UNKNOWN, "y", days=41)
            # The oldest changes: it comes first in the batch, and the rest of
            # the batch is still pruned after it.
            merged = two.evolve(metadata={"reconciled": "late"}, version=two.version + 1)

            async def reconcile_meanwhile(batch: Sequence[ActionReceipt]) -> None:
                other = self.peer(ledger)
                try:
                    assert await other.record(merged)
                finally:
                    if other is not ledger:
                        await other.close()

            deleted = await ledger.prune(
                completed_before=_CUT,
                statuses=[ActionStatus.UNKNOWN],
                before_delete=reconcile_meanwhile,
            )
            assert deleted == 1
            assert await ledger.get(two.action_id) == merged
            assert await ledger.get(one.action_id) is None

        self._life(check)

    # -- ages by the ledger's clock -------------------------------------------------

    def test_every_write_stamps_the_time_of_storing_from_the_ledger_clock(self) -> None:
        async def check(ledger: Any) -> None:
            # A writer whose clock is a year behind: its updated_at says nothing.
            behind = self.clock.now - timedelta(days=365)
            claim, _ = await ledger.claim(make_receipt(created_at=behind, updated_at=behind))
            assert claim.stored_at == self.clock.now
            stored = await ledger.get(claim.action_id)
            assert stored.stored_at == self.clock.now
            self.clock.advance(7)
            one = started(claim)
            assert await ledger.start_attempt(one)
            assert (await ledger.get(claim.action_id)).stored_at == self.clock.now
            self.clock.advance(5)
            assert await ledger.record(completed(one))
            assert (await ledger.get(claim.action_id)).stored_at == self.clock.now

        self._life(check)

    def test_an_expiry_is_judged_by_the_ledger_clock_at_the_exact_boundary(self) -> None:
        async def check(ledger: Any) -> None:
            # updated_at a year old (a slow writer's clock): the ledger stored it now.
            behind = self.clock.now - timedelta(days=365)
            final = await self._done(ledger, created_at=behind, updated_at=behind)
            stored_at = (await ledger.get(final.action_id)).stored_at
            assert stored_at == self.clock.now
            self.clock.advance(599.999999)
            assert not await ledger.retire(retired(final), older_than=600)
            assert await ledger.get(final.action_id) == final  # nothing changed
            self.clock.advance(0.000001)  # exactly 600 s after it was stored
            assert await ledger.retire(retired(final), older_than=600)
            assert await ledger.find("charge", final.idempotency_key) is None

        self._life(check)

    def test_a_later_transition_restarts_the_age(self) -> None:
        async def check(ledger: Any) -> None:
            final = await self._done(ledger, ActionStatus.FAILED)
            self.clock.advance(1000)
            merged = final.evolve(metadata={"note": "late evidence"}, version=final.version + 1)
            assert await ledger.record(merged)
            self.clock.advance(500)
            assert not await ledger.retire(retired(merged), older_than=600)
            self.clock.advance(100)
            assert await ledger.retire(retired(merged), older_than=600)

        self._life(check)

    def test_prune_older_than_is_judged_by_the_ledger_clock(self) -> None:
        async def check(ledger: Any) -> None:
            # Stored 40 and 1 days before the cut; the writer's clock claims both
            # are ancient, which must not matter.
            ancient = _CUT - timedelta(days=3000)
            old = await self._aged(ledger, ActionStatus.CONFIRMED, "old", days=40)
            self.clock.now = _CUT - timedelta(days=1)
            young = await self._done(
                ledger, idempotency_key="young", created_at=ancient, updated_at=ancient
            )
            self.clock.now = _CUT
            assert await ledger.prune(older_than=2 * 86_400, dry_run=True) == 1
            assert await ledger.prune(older_than=86_400 + 1) == 1
            assert await ledger.get(old.action_id) is None
            assert await ledger.get(young.action_id) == young
            # Stored exactly a day before the ledger's now: not older than a day.
            assert await ledger.prune(older_than=86_400) == 0
            self.clock.advance(0.000001)
            assert await ledger.prune(older_than=86_400) == 1
            assert await ledger.get(young.action_id) is None

        self._life(check)

    def test_prune_refuses_bad_arguments_and_deletes_nothing(self) -> None:
        async def check(ledger: Any) -> None:
            kept = await self._aged(ledger, ActionStatus.CONFIRMED, "a", days=40)
            bad: list[dict[str, Any]] = [
                {"completed_before": _CUT.replace(tzinfo=None)},
                {"completed_before": "2026-01-01"},
                {"completed_before": _CUT, "statuses": []},
                {"completed_before": _CUT, "statuses": "CONFIRMED"},
                {"completed_before": _CUT, "statuses": ["PENDING"]},
                {"completed_before": _CUT, "namespace": "x\x00"},
                {"completed_before": _CUT, "batch_size": 0},
                {"completed_before": _CUT, "dry_run": "yes"},
                {"completed_before": _CUT, "before_delete": 3},
                {},
                {"completed_before": _CUT, "older_than": 60},
                {"older_than": -1},
                {"older_than": float("nan")},
                {"older_than": "30d"},
                {"older_than": True},
            ]
            for arguments in bad:
                try:
                    await ledger.prune(**arguments)
                except InvalidArgumentError:
                    continue
                raise AssertionError(f"prune accepted {arguments!r}")
            assert await ledger.get(kept.action_id) == kept

        self._life(check)


def _fields(receipt: ActionReceipt) -> dict[str, Any]:
    return {
        "action_id": receipt.action_id,
        "idempotency_key": receipt.idempotency_key,
        "namespace": receipt.namespace,
        "created_at": receipt.created_at,
        "updated_at": receipt.updated_at,
    }
