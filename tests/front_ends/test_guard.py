"""The decorator and the synchronous facade: ergonomics over the same rules.

The evidence and idempotency rules themselves run through both front ends in
test_execution_evidence.py and test_idempotency.py (the ``front_end`` fixture).
"""

from __future__ import annotations

import asyncio
import inspect
import threading

import pytest

from dataoad import (
    ActionResult,
    ActionRunner,
    ActionStatus,
    DataoadError,
    InMemoryLedger,
    SQLiteLedger,
    SyncActionRunner,
    guarded,
)


async def test_decorator_keeps_name_docstring_and_signature_and_guards_calls() -> None:
    runner = ActionRunner(InMemoryLedger())
    calls: list[str] = []

    @guarded(
        "charge",
        runner=runner,
        idempotency_key=lambda order_id, amount: order_id,
        request=lambda order_id, amount: {"order_id": order_id, "amount": amount},
        provider_reference=lambda order_id, amount: order_id,
    )
    async def charge(order_id: str, amount: int) -> str:
        """Charge an order."""
        calls.append(order_id)
        return f"ch-{order_id}"

    assert charge.__name__ == "charge"
    assert charge.__doc__ == "Charge an order."
    assert list(inspect.signature(charge).parameters) == ["order_id", "amount"]

    first = await charge("o-1", 100)
    again = await charge("o-1", 100)
    assert isinstance(first, ActionResult)
    assert first.value == "ch-o-1"
    assert again.replayed is True
    assert calls == ["o-1"]


def test_decorator_on_a_sync_function_with_a_sync_runner_is_sync_and_guards_calls() -> None:
    calls: list[str] = []
    with SyncActionRunner(InMemoryLedger()) as runner:

        @guarded(
            "send", runner=runner, idempotency_key=lambda to: to, request=lambda to: {"to": to}
        )
        def send(to: str) -> int:
            calls.append(to)
            return 1

        assert not inspect.iscoroutinefunction(send)
        assert send.__name__ == "send"
        result = send("a@example.org")
        again = send("a@example.org")
    assert isinstance(result, ActionResult)
    assert result.status is ActionStatus.CONFIRMED
    assert result.value == 1
    assert again.replayed is True
    # The function ran once: a duplicate call is a replay, not a second send.
    assert calls == ["a@example.org"]


def test_decorator_refuses_a_sync_function_with_an_async_runner_when_decorating() -> None:
    from dataoad import InvalidArgumentError

    decorate = guarded(
        "send",
        runner=ActionRunner(InMemoryLedger()),
        idempotency_key=lambda to: to,
        request=lambda to: {"to": to},
    )
    with pytest.raises(InvalidArgumentError, match=r"sync function.*SyncActionRunner"):

        @decorate  # type: ignore[arg-type]
        def send(to: str) -> int:
            return 1


def test_decorator_refuses_an_async_function_with_a_sync_runner_when_decorating() -> None:
    from dataoad import InvalidArgumentError

    with SyncActionRunner(InMemoryLedger()) as runner:
        decorate = guarded(
            "send", runner=runner, idempotency_key=lambda to: to, request=lambda to: {"to": to}
        )
        with pytest.raises(InvalidArgumentError, match=r"is async.*ActionRunner"):

            @decorate
            async def send(to: str) -> int:
                return 1


def test_decorator_rejects_non_callable_derivations() -> None:
    from dataoad import InvalidArgumentError

    with pytest.raises(InvalidArgumentError):
        guarded(  # type: ignore[call-overload]
            "a", runner=ActionRunner(InMemoryLedger()), idempotency_key="k", request=dict
        )


def test_sync_facade_from_many_threads_on_sqlite(tmp_path: object) -> None:
    calls: list[int] = []
    lock = threading.Lock()

    def op() -> str:
        with lock:
            calls.append(1)
        return "ok"

    with SyncActionRunner(SQLiteLedger(f"{tmp_path}/ledger.sqlite3")) as runner:
        results: list[object] = []

        def worker() -> None:
            for n in range(20):
                try:
                    results.append(
                        runner.execute("a", op, request={"n": n}, idempotency_key=f"k{n}")
                    )
                except DataoadError as exc:  # an in-progress duplicate is fine
                    results.append(exc)

        threads = [threading.Thread(target=worker) for _ in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert len(calls) == 20
        receipt = runner.receipt(results[0].receipt.action_id)  # type: ignore[attr-defined]
        assert receipt.final_status is ActionStatus.CONFIRMED


def test_sync_facade_refuses_inside_a_running_loop() -> None:
    runner = SyncActionRunner(InMemoryLedger())
    try:

        async def inside() -> None:
            with pytest.raises(DataoadError, match="running event loop"):
                runner.execute("a", lambda: 1, request={}, idempotency_key="k")

        asyncio.run(inside())
    finally:
        runner.close()
    runner.close()
    with pytest.raises(DataoadError, match="closed"):
        runner.execute("a", lambda: 1, request={}, idempotency_key="k")


async def test_keyword_arguments_reach_the_key_the_request_and_the_reference() -> None:
    # Called by keyword, or half by keyword: the derivations see every argument,
    # so one intent keeps one key however it is called, and two keep two.
    runner = ActionRunner(InMemoryLedger())
    calls: list[tuple[str, int]] = []

    @guarded(
        "charge",
        runner=runner,
        idempotency_key=lambda order_id, amount=0: f"{order_id}:{amount}",
        request=lambda order_id, amount=0: {"order_id": order_id, "amount": amount},
        provider_reference=lambda order_id, amount=0: order_id,
    )
    async def charge(order_id: str, amount: int = 0) -> str:
        calls.append((order_id, amount))
        return "ok"

    first = await charge(order_id="o-1", amount=5)
    assert (first.receipt.idempotency_key, first.receipt.provider_reference) == ("o-1:5", "o-1")
    assert (await charge("o-1", amount=5)).replayed
    assert (await charge("o-1", 5)).replayed
    other = await charge("o-1", amount=6)
    assert not other.replayed
    assert other.receipt.idempotency_key == "o-1:6"
    assert calls == [("o-1", 5), ("o-1", 6)]


def test_keyword_arguments_reach_the_derivations_of_a_sync_function() -> None:
    with SyncActionRunner(InMemoryLedger()) as runner:

        @guarded(
            "send",
            runner=runner,
            idempotency_key=lambda to, subject="": f"{to}/{subject}",
            request=lambda to, subject="": {"to": to, "subject": subject},
        )
        def send(to: str, subject: str = "") -> str:
            return "sent"

        first = send(to="a@example.com", subject="hi")
        assert first.receipt.idempotency_key == "a@example.com/hi"
        assert send("a@example.com", subject="hi").replayed
