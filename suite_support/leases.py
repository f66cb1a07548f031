"""Leases in example tests: a request, a lease, and workers that die mid-claim."""

from __future__ import annotations

import asyncio
import dataclasses
from typing import Any

import pytest

from dataoad import ActionRunner, InMemoryLedger, VerificationResult
from suite_support import unstarted

REQUEST = {"amount": 100}
LEASE = 30.0


class Crash(BaseException):
    """A worker dying mid-call (not an Exception, so the runner records nothing)."""


def counting(value: Any = "ok") -> Any:
    calls: list[int] = []

    async def op() -> Any:
        calls.append(1)
        return value

    op.calls = calls  # type: ignore[attr-defined]
    return op


async def crash_after_start(runner: ActionRunner, key: str = "k") -> None:
    async def dies() -> None:
        raise Crash

    with pytest.raises(Crash):
        await runner.execute("charge", dies, request=REQUEST, idempotency_key=key)


async def crash_before_start(ledger: InMemoryLedger, runner: ActionRunner) -> str:
    """A worker that claimed and died before its attempt started (only a v0.1 runner could)."""
    stored = await unstarted(
        ledger, request=REQUEST, provider_reference=None, owner=runner.owner, lease=runner.lease
    )
    assert stored.attempts == 0
    return stored.action_id


def confirmed_by(reference: str) -> Any:
    return lambda receipt: VerificationResult.confirmed(verified_provider_reference=reference)


def absent_retry_safe(reference: str) -> Any:
    return lambda receipt: VerificationResult.absent(
        verified_provider_reference=reference, retry_safe=True
    )


@dataclasses.dataclass
class PausedHolder:
    """A holder parked inside its provider call (a GC pause, a partition); ``finish`` lets it go."""

    task: asyncio.Task[Any]
    finish: asyncio.Event


async def paused_holder(
    runner: ActionRunner, *, outcome: Any = "ch_1", **execute: Any
) -> PausedHolder:
    """``runner`` charges ``REQUEST`` under key ``k`` and stays inside the provider call.

    Let go, the call returns ``outcome``, or raises it if it is an exception.
    ``execute`` adds to or overrides the call's arguments.
    """
    started, finish = asyncio.Event(), asyncio.Event()

    async def slow_charge() -> Any:
        started.set()
        await finish.wait()
        if isinstance(outcome, BaseException):
            raise outcome
        return outcome

    call = {"request": REQUEST, "idempotency_key": "k", **execute}
    task = asyncio.create_task(runner.execute("charge", slow_charge, **call))
    await started.wait()
    return PausedHolder(task, finish)
