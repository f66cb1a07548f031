"""The ledger contract: what every Ledger backend must do, as runnable checks.

Backend authors subclass :class:`LedgerContract` in a pytest module and
provide ``make_ledger()``; pytest then runs every check against the backend::

    class TestMyLedger(LedgerContract):
        def make_ledger(self) -> Ledger:
            return MyLedger(...)

Durable backends subclass :class:`DurableLedgerContract` and also provide
``reopen(ledger)``, a new instance on the same storage. ``peer(ledger)`` may
return a second instance sharing the storage (another connection), so the
concurrency checks race separate clients, not just separate tasks.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

from dataoad._ledger import Ledger
from dataoad._status import ActionStatus, ClaimState
from dataoad.testing._argument_contract import ArgumentContract
from dataoad.testing._contract_receipts import completed, make_receipt, rich_receipt, started

__all__ = ["DurableLedgerContract", "LedgerContract", "make_receipt"]


class LedgerContract(ArgumentContract):
    """Every check a Ledger backend must pass. Subclass and define make_ledger()."""

    #: Concurrent contenders in the race checks.
    contenders = 16

    def make_ledger(self) -> Ledger:
        """A new ledger on fresh, empty storage."""
        raise NotImplementedError

    def peer(self, ledger: Ledger) -> Ledger:
        """Another client of the same storage (default: the same instance)."""
        return ledger

    def _run(self, check: Callable[[Ledger, list[Ledger]], Awaitable[None]]) -> None:
        async def main() -> None:
            ledger = self.make_ledger()
            extra: list[Ledger] = []
            try:
                await check(ledger, extra)
            finally:
                for other in extra:
                    if other is not ledger:
                        await other.close()
                await ledger.close()

        asyncio.run(main())

    def _peers(self, ledger: Ledger, extra: list[Ledger], count: int) -> list[Ledger]:
        peers = [self.peer(ledger) for _ in range(count)]
        extra.extend(peers)
        return peers

    # -- claims ----------------------------------------------------------------

    def test_claim_creates_exactly_once(self) -> None:
        """A second claim for the same name and key returns the first, unchanged."""

        async def check(ledger: Ledger, extra: list[Ledger]) -> None:
            first = make_receipt()
            assert await ledger.claim(first) == (first, True)
            second = make_receipt()
            stored, created = await ledger.claim(second)
            assert created is False
            assert stored == first
            assert await ledger.get(second.action_id) is None
            assert await ledger.find("charge", "order-1") == first

        self._run(check)

    def test_a_claim_that_does_not_hold_its_key_is_refused_before_any_write(self) -> None:
        """A new claim already retired would hold no key: refused, held key or not."""

        async def check(ledger: Ledger, extra: list[Ledger]) -> None:
            retired = make_receipt(retired_at=make_receipt().created_at)

            async def nothing_stored() -> None:
                assert await ledger.get(retired.action_id) is None
                assert await ledger.find("charge", "order-1") is None

            await self._refused(ledger.claim(retired), nothing_stored, "a new claim must hold")
            held = make_receipt()
            assert await ledger.claim(held) == (held, True)

            async def still_held() -> None:
                assert await ledger.find("charge", "order-1") == held

            again = make_receipt(retired_at=held.created_at)
            await self._refused(ledger.claim(again), still_held, "a new claim must hold")

        self._run(check)

    def test_one_winner_among_concurrent_claims(self) -> None:
        """Of N concurrent claims for one key, exactly one is created."""

        async def check(ledger: Ledger, extra: list[Ledger]) -> None:
            clients = self._peers(ledger, extra, self.contenders)
            for round_ in range(5):
                key = f"hot-{round_}"
                candidates = [make_receipt(idempotency_key=key) for _ in clients]
                outcomes = await asyncio.gather(
                    *(c.claim(r) for c, r in zip(clients, candidates, strict=True))
                )
                winners = [stored for stored, created in outcomes if created]
                assert len(winners) == 1, f"{len(winners)} claims created for one key"
                assert all(stored == winners[0] for stored, _ in outcomes)

        self._run(check)

    def test_claims_are_scoped_by_action_name_and_key(self) -> None:
        """The same key under another action name, or another key, is another claim."""

        async def check(ledger: Ledger, extra: list[Ledger]) -> None:
            a = make_receipt()
            b = make_receipt(action_name="refund")
            c = make_receipt(idempotency_key="order-2")
            for receipt in (a, b, c):
                assert (await ledger.claim(receipt))[1] is True
            assert await ledger.find("refund", "order-1") == b
            assert await ledger.find("charge", "order-2") == c
            assert await ledger.find("charge", "order-3") is None

        self._run(check)

    # -- attempt start ---------------------------------------------------------

    def test_start_attempt_is_conditional(self) -> None:
        """An attempt starts only from the exact PENDING version, one attempt at a time."""

        async def check(ledger: Ledger, extra: list[Ledger]) -> None:
            claim = make_receipt()
            await ledger.claim(claim)
            proposed = started(claim)
            assert await ledger.start_attempt(proposed.evolve(version=3)) is False
            skipped = started(proposed).evolve(version=2)
            assert await ledger.start_attempt(skipped) is False
            assert await ledger.start_attempt(proposed.evolve(request_hash="1" * 64)) is False
            assert await ledger.start_attempt(proposed.evolve(provider_reference="x")) is False
            assert await ledger.get(claim.action_id) == claim, "a refused start wrote something"
            assert await ledger.start_attempt(proposed) is True
            assert await ledger.get(claim.action_id) == proposed
            assert await ledger.start_attempt(proposed) is False, "the same start applied twice"
            done = completed(proposed)
            assert await ledger.record(done) is True
            assert await ledger.start_attempt(started(done)) is False, (
                "attempt on a completed claim"
            )
            assert await ledger.start_attempt(started(make_receipt())) is False, "unknown claim"

        self._run(check)

    def test_start_attempt_stores_only_a_consistent_pending_proposal(self) -> None:
        """The proposed receipt itself must be PENDING, with one record per attempt."""

        async def check(ledger: Ledger, extra: list[Ledger]) -> None:
            claim = make_receipt()
            await ledger.claim(claim)
            proposed = started(claim)
            closing = proposed.evolve(claim_state=ClaimState.COMPLETED)
            assert await ledger.start_attempt(closing) is False, "a COMPLETED proposal started"
            missing_record = proposed.evolve(attempt_records=())
            assert await ledger.start_attempt(missing_record) is False, "attempts without records"
            assert await ledger.get(claim.action_id) == claim, "a refused start wrote something"
            assert await ledger.start_attempt(proposed) is True

        self._run(check)

    def test_one_winner_among_concurrent_attempt_starts(self) -> None:
        """Racing starts from the same version: exactly one succeeds."""

        async def check(ledger: Ledger, extra: list[Ledger]) -> None:
            clients = self._peers(ledger, extra, self.contenders)
            claim = make_receipt()
            await ledger.claim(claim)
            proposals = [started(claim, seconds=i + 1) for i in range(len(clients))]
            results = await asyncio.gather(
                *(c.start_attempt(p) for c, p in zip(clients, proposals, strict=True))
            )
            assert results.count(True) == 1
            stored = await ledger.get(claim.action_id)
            assert stored == proposals[results.index(True)]

        self._run(check)

    # -- other transitions -----------------------------------------------------

    def test_record_is_conditional(self) -> None:
        """A write lands only on its exact version, keeps attempts, never reopens."""

        async def check(ledger: Ledger, extra: list[Ledger]) -> None:
            claim = make_receipt()
            await ledger.claim(claim)
            one = started(claim)
            await ledger.start_attempt(one)
            done = completed(one)
            assert await ledger.record(done.evolve(version=done.version + 1)) is False
            assert await ledger.record(done.evolve(attempts=2)) is False
            assert await ledger.record(done.evolve(idempotency_key="other")) is False
            assert await ledger.get(claim.action_id) == one, "a refused write wrote something"
            assert await ledger.record(done) is True
            assert await ledger.get(claim.action_id) == done
            reopened = done.evolve(claim_state=ClaimState.PENDING, version=done.version + 1)
            assert await ledger.record(reopened) is False, "a completed claim was reopened"
            settled = done.evolve(
                verification_status=ActionStatus.CONFIRMED, version=done.version + 1
            )
            assert await ledger.record(settled) is True
            assert await ledger.get(claim.action_id) == settled

        self._run(check)

    def test_release_only_unstarted_claims_at_exact_version(self) -> None:
        """Release deletes a PENDING claim with no attempts, and frees its key."""

        async def check(ledger: Ledger, extra: list[Ledger]) -> None:
            claim = make_receipt()
            await ledger.claim(claim)
            assert await ledger.release(claim.action_id, 2) is False
            assert await ledger.release(claim.action_id, 1) is True
            assert await ledger.get(claim.action_id) is None
            assert await ledger.find("charge", "order-1") is None
            assert await ledger.release(claim.action_id, 1) is False
            again = make_receipt()
            assert (await ledger.claim(again))[1] is True, "released key not reclaimable"
            one = started(again)
            await ledger.start_attempt(one)
            assert await ledger.release(again.action_id, one.version) is False
            assert await ledger.get(again.action_id) == one

        self._run(check)

    def test_release_races_atomically_with_attempt_start(self) -> None:
        """Release and attempt start from the same version: exactly one wins."""

        async def check(ledger: Ledger, extra: list[Ledger]) -> None:
            other = self._peers(ledger, extra, 1)[0]
            for n in range(20):
                claim = make_receipt(idempotency_key=f"race-{n}")
                await ledger.claim(claim)
                first, second = (ledger, other) if n % 2 else (other, ledger)
                released, began = await asyncio.gather(
                    first.release(claim.action_id, claim.version),
                    second.start_attempt(started(claim)),
                )
                assert released != began, f"release={released}, start={began}"
                stored = await ledger.get(claim.action_id)
                assert (stored is None) == released

        self._run(check)

    # -- reads -----------------------------------------------------------------

    def test_receipts_round_trip_exactly(self) -> None:
        """What is written is what is read back, field for field."""

        async def check(ledger: Ledger, extra: list[Ledger]) -> None:
            rich = rich_receipt()
            claim = make_receipt(
                action_id=rich.action_id,
                action_name=rich.action_name,
                idempotency_key=rich.idempotency_key,
                provider_reference=None,
                risk=None,
                metadata=rich.metadata,
            )
            await ledger.claim(claim)
            assert await ledger.get(claim.action_id) == claim
            one = started(claim)
            assert await ledger.start_attempt(one)
            final = rich.evolve(version=one.version + 1, attempt_records=rich.attempt_records)
            assert await ledger.record(final)
            for read in (
                await ledger.get(final.action_id),
                await ledger.find(final.action_name, final.idempotency_key),
            ):
                assert read == final
                assert read is not None
                assert read.metadata["deep"]["x"][1] is True
                assert read.attempt_records[0].finished_at == final.attempt_records[0].finished_at

        self._run(check)

    def test_reads_are_idempotent_and_change_nothing(self) -> None:
        """Reading twice gives the same receipt, and reads never bump a version."""

        async def check(ledger: Ledger, extra: list[Ledger]) -> None:
            claim = make_receipt()
            await ledger.claim(claim)
            first = await ledger.get(claim.action_id)
            second = await ledger.get(claim.action_id)
            assert first == second == claim
            assert await ledger.get("no-such-action") is None
            assert await ledger.start_attempt(started(claim)) is True, "a read changed the version"

        self._run(check)

    def test_read_back_proves_exactly_the_written_transition(self) -> None:
        """After a write, a read shows exactly that write; after a refusal, the old state."""

        async def check(ledger: Ledger, extra: list[Ledger]) -> None:
            reader = self._peers(ledger, extra, 1)[0]
            claim = make_receipt()
            await ledger.claim(claim)
            mine = started(claim, seconds=1)
            theirs = started(claim, seconds=2)
            assert await ledger.start_attempt(theirs) is True
            assert await ledger.start_attempt(mine) is False
            assert await reader.get(claim.action_id) == theirs
            assert await reader.get(claim.action_id) != mine

        self._run(check)

    def test_close_is_idempotent(self) -> None:
        """close() may be called more than once."""

        async def check(ledger: Ledger, extra: list[Ledger]) -> None:
            await ledger.claim(make_receipt())
            await ledger.close()
            await ledger.close()

        self._run(check)


class DurableLedgerContract(LedgerContract):
    """The contract plus persistence across instances. Define reopen() too."""

    refuses_unencodable_json = True

    def reopen(self, ledger: Ledger) -> Ledger:
        """A new ledger instance on the same storage as ``ledger``."""
        raise NotImplementedError

    def test_receipts_survive_reopen(self) -> None:
        """Closed and reopened, the ledger returns every receipt exactly."""

        async def check(ledger: Ledger, extra: list[Ledger]) -> None:
            pending = make_receipt(idempotency_key="pending")
            await ledger.claim(pending)
            rich = rich_receipt()
            await ledger.claim(
                rich.evolve(
                    claim_state=ClaimState.PENDING,
                    attempts=0,
                    attempt_records=(),
                    execution_status=None,
                    verification_status=None,
                    final_status=None,
                    provider_request_id=None,
                    error=None,
                    version=1,
                    updated_at=rich.created_at,
                )
            )
            stored = await ledger.get(rich.action_id)
            assert stored is not None
            one = started(stored)
            await ledger.start_attempt(one)
            final = rich.evolve(version=one.version + 1)
            assert await ledger.record(final)
            await ledger.close()
            again = self.reopen(ledger)
            extra.append(again)
            assert await again.get(pending.action_id) == pending
            assert await again.get(rich.action_id) == final
            assert (await again.claim(make_receipt(idempotency_key="pending")))[1] is False

        self._run(check)
