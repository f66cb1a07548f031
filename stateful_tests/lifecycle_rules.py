"""The receipt lifecycle in the runner machine: keys freed by expiry and by reopen.

``free_a_settled_key`` takes a key whose receipt is completed (CONFIRMED,
FAILED or UNKNOWN) and whose callers are all done, and starts one or two
callers that free it: ``execute(expires_after=...)`` on a clock that puts
the key's receipt just past it (``ExpiryClock``; each with the provider
reference of a new mutation, one generation on), an operator's ``reopen``,
or both at once. They race each other and whatever operators and provider
events the run adds; the properties in ``lifecycle_invariants`` judge who
freed what, and the world-truth properties judge every invocation.

While a key is being freed no plain ``execute`` of it starts: its caller
would still pass the provider reference of the old mutation, which a real
caller asking for a new one would not.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any, Final

from hypothesis import strategies as st
from hypothesis.stateful import precondition, rule

from dataoad import ActionReceipt
from stateful_tests.harness import Contender, split_key

__all__ = ["EXPIRES_AFTER", "ExpiryClock", "LifecycleRules"]

#: What a caller freeing a key by expiry asks for, in seconds.
EXPIRES_AFTER: Final = 3600.0


class ExpiryClock:
    """The machine's clock, with a wall time fixed when its caller starts.

    It reads exactly ``EXPIRES_AFTER`` past the last change of the receipt
    that held the key then: that receipt has expired for this caller, and
    any receipt written after it (another caller's new claim) has not. So
    of several callers freeing one key, one claims afresh and the others
    meet its claim, as callers asking for a day's expiry would.
    """

    def __init__(self, base: Any, wall: datetime) -> None:
        self.base = base
        self.wall = wall

    def monotonic(self) -> float:
        return float(self.base.monotonic())

    async def sleep(self, seconds: float) -> None:
        await self.base.sleep(seconds)

    def wall_time(self) -> datetime:
        return self.wall


class LifecycleRules:
    """Rules and bookkeeping for freeing keys; mixed into the runner machine."""

    contenders_list: list[Contender]
    observed: dict[str, ActionReceipt]
    order_keys: list[str]
    max_active: int

    def generation(self, key: str) -> int:
        """How often the key was freed, as observed: its next claim's reference suffix."""
        wanted = split_key(key)
        return sum(
            1
            for r in self.observed.values()
            if r.retired_at is not None and (r.namespace, r.idempotency_key) == wanted
        )

    def expiry_clock(self, key: str) -> ExpiryClock:
        """The clock of a caller freeing ``key`` by expiry (see ExpiryClock)."""
        held = self.holder(key)
        base = getattr(self, "virtual_time")  # noqa: B009  (the runner machine's)
        if held is None:
            return ExpiryClock(base, datetime.now(UTC))
        return ExpiryClock(base, held.updated_at + timedelta(seconds=EXPIRES_AFTER))

    def keys_being_freed(self) -> set[str]:
        """Keys an unfinished caller is freeing (expiring or reopening)."""
        return {
            c.key
            for c in self.contenders_list
            if not c.finished and (c.kind == "reopen" or c.expires_after is not None)
        }

    def holder(self, key: str) -> ActionReceipt | None:
        """The observed receipt holding ``key``, if any."""
        wanted = split_key(key)
        for r in self.observed.values():
            if r.retired_at is None and (r.namespace, r.idempotency_key) == wanted:
                return r
        return None

    def _settled_keys(self) -> list[str]:
        busy = {c.key for c in self.contenders_list if not c.finished}
        return [
            key
            for key in self.order_keys
            if key not in busy and (held := self.holder(key)) is not None and not held.is_pending
        ]

    @precondition(lambda self: bool(self._settled_keys()) and self._active() < self.max_active)
    @rule(
        data=st.data(),
        how=st.sampled_from(["expire", "expire twice", "reopen", "reopen and expire"]),
        policy=st.sampled_from(["default", "retry-failed"]),
        with_verifier=st.booleans(),
    )
    def free_a_settled_key(
        self, data: st.DataObject, how: str, policy: str, with_verifier: bool
    ) -> None:
        """Callers free a settled key: by expiry (``expires_after=0``), by reopen, or both racing."""
        key = data.draw(st.sampled_from(self._settled_keys()), label="settled key")
        if how.startswith("reopen"):
            self.operate(key, "reopen")
        expirers = {"expire": 1, "expire twice": 2, "reopen": 0, "reopen and expire": 1}[how]
        for _ in range(expirers):
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
            )

    # Provided by the runner machine.
    def _active(self) -> int:
        raise NotImplementedError

    def operate(self, key: str, how: str) -> None:
        raise NotImplementedError

    def start_execute(self, key: str, **arguments: Any) -> None:
        raise NotImplementedError
