"""InMemoryLedger under threads and several event loops."""

from __future__ import annotations

import asyncio
import contextlib
import threading

import pytest

from dataoad import ActionInProgressError, ActionRunner, ActionStatus, InMemoryLedger


def test_one_winner_per_key_across_threads_and_event_loops() -> None:
    ledger = InMemoryLedger()
    calls: dict[str, int] = {}
    lock = threading.Lock()
    barrier = threading.Barrier(8)

    def worker() -> None:
        async def main() -> None:
            runner = ActionRunner(ledger)
            barrier.wait()
            for n in range(200):
                key = f"k{n}"

                def op(key: str = key) -> str:
                    with lock:
                        calls[key] = calls.get(key, 0) + 1
                    return key

                with contextlib.suppress(ActionInProgressError):
                    await runner.execute("a", op, request={"n": n}, idempotency_key=key)

        asyncio.run(main())

    threads = [threading.Thread(target=worker) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert calls == {f"k{n}": 1 for n in range(200)}
    receipts = ledger.snapshot()
    assert len(receipts) == 200
    assert all(r.final_status is ActionStatus.CONFIRMED for r in receipts)


async def test_a_claim_reusing_a_stored_action_id_is_refused_by_name() -> None:
    import pytest

    from dataoad.testing import make_receipt

    ledger = InMemoryLedger()
    first = make_receipt(idempotency_key="k1")
    await ledger.claim(first)
    clash = make_receipt(idempotency_key="k2", action_id=first.action_id)
    with pytest.raises(ValueError, match=f"^action id '{first.action_id}' already exists$"):
        await ledger.claim(clash)
    assert await ledger.find(clash.action_name, "k2") is None


async def test_a_claim_that_does_not_hold_its_key_is_refused_by_name() -> None:
    from dataoad._receipt import utc_now
    from dataoad.testing._ledger_contract import make_receipt

    ledger = InMemoryLedger()
    with pytest.raises(ValueError, match="must hold its key") as info:
        await ledger.claim(make_receipt(retired_at=utc_now()))
    assert str(info.value) == "a new claim must hold its key (retired_at is None)"
    assert await ledger.receipts() == []


def test_an_operator_record_not_yet_stamped_round_trips_through_json() -> None:
    from dataoad import OperatorRecord

    record = OperatorRecord("ana", "h", "verify", None, "", "looked", "PENDING")
    assert record.at is None
    assert record.to_json()["at"] is None
    assert OperatorRecord.from_json(record.to_json()) == record
