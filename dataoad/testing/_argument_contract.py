"""The ledger contract's argument checks: what a ledger must refuse before it writes.

A ledger called directly (not through a runner, which checks its own
arguments first) must refuse a value it could not store, or would store
with another meaning, with InvalidArgumentError, and change nothing. Each
bound is tried on both sides: the last value accepted and the first refused.
"""

from __future__ import annotations

import asyncio
import dataclasses
import math
from collections.abc import Awaitable, Callable
from datetime import datetime, timedelta
from typing import Any

from dataoad._errors import InvalidArgumentError
from dataoad._ledger import Ledger
from dataoad._ledger_arguments import MAX_COUNT, MAX_LEASE
from dataoad._lifecycle import MAX_EXPIRES_AFTER
from dataoad._proven import keeps_leases
from dataoad._receipt import ActionReceipt
from dataoad.testing._contract_receipts import completed, make_receipt, started

__all__ = ["ArgumentContract"]

#: Leases no ledger may grant: none left, negative, not a number, unbounded, past the bound.
BAD_LEASES: tuple[object, ...] = (0, 0.0, -1.0, math.nan, math.inf, "30", True, MAX_LEASE * 2)
#: Text no ledger can store as given.
BAD_TEXT: tuple[object, ...] = ("a\x00b", "a\ud800b", 5)


class ArgumentContract:
    """Checks that a ledger refuses bad arguments alike and writes nothing for them."""

    #: Whether metadata and attempt records are refused when no JSON can hold
    #: them (a ledger that stores them as text must; one that keeps the
    #: objects themselves, like InMemoryLedger, may keep them).
    refuses_unencodable_json = False

    def make_ledger(self) -> Ledger:
        """A new ledger on fresh, empty storage."""
        raise NotImplementedError

    def _run_arguments(
        self,
        check: Callable[[Ledger, ActionReceipt, Callable[[], Awaitable[None]]], Awaitable[None]],
    ) -> None:
        async def main() -> None:

            ledger = self.make_ledger()
            try:
                stored, created = await ledger.claim(
                    make_receipt(idempotency_key="held", owner="A"),
                    lease=30.0 if keeps_leases(ledger) else None,
                )
                assert created
                held = await ledger.get(stored.action_id)
                assert held is not None
                one = started(held)
                assert await ledger.start_attempt(one)
                kept = await ledger.get(one.action_id)
                assert kept is not None

                async def unchanged() -> None:
                    assert await ledger.get(kept.action_id) == kept
                    assert await ledger.find("charge", "held") == kept

                await check(ledger, kept, unchanged)
            finally:
                await ledger.close()

        asyncio.run(main())

    @staticmethod
    async def _refused(
        call: Awaitable[Any],
        unchanged: Callable[[], Awaitable[None]],
        naming: str,
        *also: str,
        first: bool = True,
    ) -> None:
        """``call`` raises InvalidArgumentError, and nothing changed.

        Its message names ``naming`` (``first``: it begins with it, as a
        message about one argument does) and each of ``also`` (what was
        given instead, say).
        """
        try:
            answer = await call
        except InvalidArgumentError as exc:
            refused = str(exc)
        else:
            raise AssertionError(f"accepted, answering {answer!r}; InvalidArgumentError expected")
        named = refused.startswith(naming) if first else naming in refused
        assert named, f"{refused!r} does not name {naming!r}"
        for word in also:
            assert word in refused, f"{refused!r} does not say {word!r}"
        await unchanged()

    def test_claims_a_ledger_cannot_store_are_refused(self) -> None:
        """A claim with a count out of range, unstorable text or a wrong type writes nothing."""

        bad: list[dict[str, Any]] = [
            {"version": 0},
            {"version": MAX_COUNT + 1},
            {"version": True},
            {"attempts": -1},
            {"attempts": MAX_COUNT + 1},
            {"fencing_token": 0},
            {"fencing_token": 1.0},
            {"action_id": ""},
            {"final_status": "CONFIRMED"},
            {"claim_state": "PENDING"},
            {"created_at": datetime(2026, 1, 2, 3, 4, 5)},  # naive
            *(
                {field: text}
                for field in (
                    "action_name",
                    "idempotency_key",
                    "request_hash",
                    "namespace",
                    "provider_reference",
                    "risk",
                    "owner",
                    "error",
                    "provider_request_id",
                )
                for text in BAD_TEXT
            ),
        ]

        async def check(
            ledger: Ledger, current: ActionReceipt, unchanged: Callable[[], Awaitable[None]]
        ) -> None:
            for changes in bad:
                receipt = make_receipt(idempotency_key="fresh")
                for name, value in changes.items():
                    object.__setattr__(receipt, name, value)  # past the dataclass on purpose
                (name,) = changes
                # A status of the wrong kind is told by its type.
                given = ("str",) if name.endswith(("_status", "_state")) else ()
                await self._refused(ledger.claim(receipt), unchanged, name, *given)
                assert await ledger.find("charge", "fresh") is None, changes
            await self._refused(
                ledger.claim("not a receipt"),  # type: ignore[arg-type]
                unchanged,
                "ActionReceipt",
                "str",
                first=False,
            )
            # The last count accepted.
            top = make_receipt(idempotency_key="top", version=MAX_COUNT, fencing_token=MAX_COUNT)
            assert (await ledger.claim(top))[1]

        self._run_arguments(check)

    def test_transitions_a_ledger_cannot_store_are_refused(self) -> None:
        """A write of unstorable text or counts out of range changes nothing stored."""

        async def check(
            ledger: Ledger, current: ActionReceipt, unchanged: Callable[[], Awaitable[None]]
        ) -> None:
            finished = completed(current)
            for text in BAD_TEXT:
                wrong = finished.evolve(provider_request_id=text)
                await self._refused(ledger.record(wrong), unchanged, "provider_request_id")
                await self._refused(
                    ledger.start_attempt(started(current).evolve(error=text)), unchanged, "error"
                )
            too_far = finished.evolve(version=MAX_COUNT + 1)
            await self._refused(ledger.record(too_far), unchanged, "version")
            await self._refused(ledger.release(current.action_id, 0), unchanged, "version")
            await self._refused(ledger.release(current.action_id, True), unchanged, "version")
            for action_id in (*BAD_TEXT, "", None):
                bad: Any = action_id
                await self._refused(ledger.get(bad), unchanged, "action_id")
                await self._refused(ledger.release(bad, 1), unchanged, "action_id")
            for text in (*BAD_TEXT, None):
                wrong_text: Any = text
                await self._refused(ledger.find("charge", wrong_text), unchanged, "idempotency_key")
                await self._refused(ledger.find(wrong_text, "held"), unchanged, "action_name")
                await self._refused(
                    ledger.find("charge", "held", wrong_text), unchanged, "namespace"
                )
            assert await ledger.record(finished)  # the same write, storable: stored

        self._run_arguments(check)

    def test_leases_a_ledger_cannot_grant_are_refused(self) -> None:
        """A lease of no time, negative, not finite, not a number or past the bound is refused."""

        async def check(
            ledger: Ledger, current: ActionReceipt, unchanged: Callable[[], Awaitable[None]]
        ) -> None:
            if not keeps_leases(ledger):
                return
            leasing: Any = ledger
            token = current.fencing_token
            for lease in BAD_LEASES:
                fresh = make_receipt(idempotency_key="fresh")
                await self._refused(leasing.claim(fresh, lease=lease), unchanged, "lease")
                await self._refused(
                    leasing.start_attempt(started(current), lease=lease), unchanged, "lease"
                )
                await self._refused(
                    leasing.renew(current.action_id, token, lease), unchanged, "lease"
                )
                taken = current.evolve(owner="B", fencing_token=token + 1)
                await self._refused(leasing.take_over(taken, lease=lease), unchanged, "lease")
            await self._refused(leasing.take_over(current, lease=None), unchanged, "lease")
            await self._refused(leasing.renew(current.action_id, token, None), unchanged, "lease")
            await self._refused(
                leasing.renew(current.action_id, 0, 30.0), unchanged, "fencing_token"
            )
            assert await ledger.find("charge", "fresh") is None
            # The bound itself is granted, and so is the least lease there is.
            assert await leasing.renew(current.action_id, current.fencing_token, MAX_LEASE)
            assert await leasing.renew(current.action_id, current.fencing_token, math.ulp(0.0))
            small = make_receipt(idempotency_key="small")
            assert (await ledger.claim(small, lease=MAX_LEASE))[1]

        self._run_arguments(check)

    def test_ages_a_ledger_cannot_judge_are_refused(self) -> None:
        """An expiry's ``older_than`` that is negative, not finite or past its bound is refused."""

        async def check(
            ledger: Ledger, current: ActionReceipt, unchanged: Callable[[], Awaitable[None]]
        ) -> None:
            retire = getattr(ledger, "retire", None)
            if retire is None:
                return
            final = completed(current)
            assert await ledger.record(final)
            stored = await ledger.get(final.action_id)
            assert stored is not None
            at = stored.updated_at + timedelta(seconds=1)
            retiring = stored.evolve(retired_at=at, version=stored.version + 1, updated_at=at)

            async def still() -> None:
                assert await ledger.get(stored.action_id) == stored

            for age in (-1.0, math.nan, math.inf, "1", MAX_EXPIRES_AFTER * 2):
                await self._refused(retire(retiring, older_than=age), still, "older_than")
            # Both ends of the range are ages a ledger judges (0: any age will do).
            assert await retire(retiring, older_than=0.0) is True

        self._run_arguments(check)

    def test_listings_with_bad_filters_are_refused(self) -> None:
        """``receipts()`` refuses a filter of the wrong kind, or a limit below 0 or past the bound."""

        async def check(
            ledger: Ledger, current: ActionReceipt, unchanged: Callable[[], Awaitable[None]]
        ) -> None:
            receipts = getattr(ledger, "receipts", None)
            if receipts is None:
                return
            bad: list[dict[str, Any]] = [
                {"limit": -1},
                {"limit": MAX_COUNT + 1},
                {"limit": True},
                {"limit": 1.0},
                {"final_status": "CONFIRMED"},
                {"pending": "yes"},
                {"stale": 1},
                {"newest_first": None},
                {"since": "yesterday"},
                {"since": datetime(2026, 1, 2)},  # naive
                *(
                    {name: text}
                    for name in ("action_name", "idempotency_key", "action_id_prefix", "namespace")
                    for text in BAD_TEXT
                ),
            ]
            for filters in bad:
                (name,) = filters
                given = ("str",) if name == "final_status" else ()
                await self._refused(receipts(**filters), unchanged, name, *given)
            # Both ends of the limit: none at all, and the bound itself.
            assert await receipts(limit=0) == []
            assert await receipts(limit=MAX_COUNT) == [current]

        self._run_arguments(check)

    def test_json_no_ledger_can_store_is_refused(self) -> None:
        """Metadata or an attempt record JSON cannot hold, or with a lone surrogate, is refused."""

        async def check(
            ledger: Ledger, current: ActionReceipt, unchanged: Callable[[], Awaitable[None]]
        ) -> None:
            if not self.refuses_unencodable_json:
                return
            for metadata in ({"x": {1, 2}}, {"x": math.nan}, {"x": "a\ud800"}):
                fresh = make_receipt(idempotency_key="fresh")
                object.__setattr__(fresh, "metadata", metadata)
                await self._refused(ledger.claim(fresh), unchanged, "metadata")
            record = dataclasses.replace(current.attempt_records[-1], error="a\ud800")
            wrong = current.evolve(attempt_records=(record,), version=current.version + 1)
            await self._refused(ledger.record(wrong), unchanged, "attempt record", first=False)
            assert await ledger.find("charge", "fresh") is None

        self._run_arguments(check)
