"""Leases in the runner machine: the ledger's clock, heartbeats, and running out.

Time on the ledger's clock passes only by the ``lease_runs_out`` rule, and a
holder's lease is renewed only by the ``heartbeat`` rule, so a shrunk trace
says exactly when a contender became a zombie: it was parked (at the
provider, say) while its lease ran out, another contender took its claim
over, and then it was released to finish what it had started.
"""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta
from typing import Any, Final

from hypothesis import event
from hypothesis import strategies as st
from hypothesis.stateful import precondition, rule

from dataoad._leases import RENEWAL_TASK_NAME

#: Every runner's lease, in seconds of the ledger's clock.
LEASE: Final = 30.0
_START: Final = datetime(2026, 1, 1, tzinfo=UTC)


class LedgerClock:
    """The ledger's wall clock, shared by every client; it moves only when a rule says so."""

    def __init__(self) -> None:
        self.now = _START

    def __call__(self) -> datetime:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += timedelta(seconds=seconds)


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
    loop: Any
    observer: Any
    observed: dict[str, Any]
    contenders_list: list[Any]

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
        before = self.loop.run(self.observer.get(action_id))
        renewed = self.loop.run(self.observer.renew(action_id, token, LEASE))
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

    def _after_lease_step(self) -> None:
        raise NotImplementedError
