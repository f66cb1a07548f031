"""A ledger wrapper that injects storage faults on either side of a write."""

from __future__ import annotations

import enum
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar, cast

from dataoad._errors import InvalidArgumentError
from dataoad._ledger import LeasingLedger, Ledger
from dataoad._receipt import ActionReceipt

__all__ = ["FaultyLedger", "LedgerFault", "LedgerFaultError"]

T = TypeVar("T")


class LedgerFault(enum.Enum):
    """Where an injected ledger fault strikes."""

    #: The write fails before it reaches storage: nothing is stored.
    FAIL_BEFORE_WRITE = "fail_before_write"
    #: The write commits, then its acknowledgement is lost (the call raises).
    LOSE_ACKNOWLEDGEMENT = "lose_acknowledgement"


class LedgerFaultError(ConnectionError):
    """The error an injected ledger fault raises."""


_WRITES = ("claim", "start_attempt", "record", "release", "take_over", "renew", "retire", "prune")
_READS = ("get", "find", "receipts")


class FaultyLedger:
    """Wraps a ledger; scripted faults hit the next calls of a given method.

    ``inject("start_attempt", LedgerFault.LOSE_ACKNOWLEDGEMENT)`` makes the
    next ``start_attempt`` commit and then raise. Reads can be made to fail
    with ``FAIL_BEFORE_WRITE`` as well. ``calls`` logs every call by name.
    It keeps leases exactly when the wrapped ledger does.
    """

    def __init__(self, inner: Ledger) -> None:
        self.inner = inner
        self._faults: dict[str, list[LedgerFault]] = {}
        self.calls: list[str] = []
        self.on_call: Callable[[str], None] | None = None

    def inject(self, method: str, fault: LedgerFault, times: int = 1) -> None:
        """Make the next ``times`` calls of ``method`` suffer ``fault``."""
        if method not in _WRITES + _READS:
            raise ValueError(f"unknown ledger method {method!r}")
        if method in _READS and fault is LedgerFault.LOSE_ACKNOWLEDGEMENT:
            raise ValueError("a read has no acknowledgement to lose")
        self._faults.setdefault(method, []).extend([fault] * times)

    def pending_faults(self) -> int:
        """How many injected faults have not struck yet."""
        return sum(len(v) for v in self._faults.values())

    def _take(self, method: str) -> LedgerFault | None:
        self.calls.append(method)
        if self.on_call is not None:
            self.on_call(method)
        queue = self._faults.get(method)
        return queue.pop(0) if queue else None

    async def _fault(self, method: str) -> LedgerFault | None:
        """The fault for this call; subclasses may decide it another way."""
        return self._take(method)

    async def _read(self, method: str, call: Callable[[], Awaitable[T]]) -> T:
        if await self._fault(method) is not None:
            raise LedgerFaultError(f"injected: {method} failed")
        return await call()

    async def _write(self, method: str, call: Callable[[], Awaitable[T]]) -> T:
        fault = await self._fault(method)
        if fault is LedgerFault.FAIL_BEFORE_WRITE:
            raise LedgerFaultError(f"injected: {method} failed before write")
        outcome = await call()
        if fault is LedgerFault.LOSE_ACKNOWLEDGEMENT:
            raise LedgerFaultError(f"injected: {method} committed, acknowledgement lost")
        return outcome

    async def claim(
        self, receipt: ActionReceipt, *, lease: float | None = None
    ) -> tuple[ActionReceipt, bool]:
        """Delegate, with any injected fault."""
        if lease is None:  # the wrapped ledger may predate leases
            return await self._write("claim", lambda: self.inner.claim(receipt))
        return await self._write("claim", lambda: self.inner.claim(receipt, lease=lease))

    async def get(self, action_id: str) -> ActionReceipt | None:
        """Delegate, with any injected fault."""
        return await self._read("get", lambda: self.inner.get(action_id))

    async def find(
        self, action_name: str, idempotency_key: str, namespace: str = ""
    ) -> ActionReceipt | None:
        """Delegate, with any injected fault."""
        if not namespace:  # the wrapped ledger may predate namespaces
            return await self._read("find", lambda: self.inner.find(action_name, idempotency_key))
        return await self._read(
            "find", lambda: self.inner.find(action_name, idempotency_key, namespace)
        )

    async def receipts(self, **filters: Any) -> list[ActionReceipt]:
        """Delegate the listing (the Inspection protocol), with any injected fault."""
        listing = getattr(self.inner, "receipts", None)
        if listing is None:
            raise InvalidArgumentError(
                f"ledger {type(self.inner).__qualname__} cannot list receipts"
            )
        return cast("list[ActionReceipt]", await self._read("receipts", lambda: listing(**filters)))

    async def start_attempt(self, receipt: ActionReceipt, *, lease: float | None = None) -> bool:
        """Delegate, with any injected fault."""
        if lease is None:
            return await self._write("start_attempt", lambda: self.inner.start_attempt(receipt))
        return await self._write(
            "start_attempt", lambda: self.inner.start_attempt(receipt, lease=lease)
        )

    async def take_over(self, receipt: ActionReceipt, *, lease: float) -> bool:
        """Delegate, with any injected fault."""
        inner = cast(LeasingLedger, self.inner)
        return await self._write("take_over", lambda: inner.take_over(receipt, lease=lease))

    async def renew(self, action_id: str, fencing_token: int, lease: float) -> bool:
        """Delegate, with any injected fault."""
        inner = cast(LeasingLedger, self.inner)
        return await self._write("renew", lambda: inner.renew(action_id, fencing_token, lease))

    async def record(self, receipt: ActionReceipt) -> bool:
        """Delegate, with any injected fault."""
        return await self._write("record", lambda: self.inner.record(receipt))

    async def release(self, action_id: str, version: int) -> bool:
        """Delegate, with any injected fault."""
        return await self._write("release", lambda: self.inner.release(action_id, version))

    def _lifecycle(self, method: str) -> Any:
        found = getattr(self.inner, method, None)
        if found is None:
            raise InvalidArgumentError(
                f"ledger {type(self.inner).__qualname__} has no {method} (written before v0.2)"
            )
        return found

    async def retire(self, receipt: ActionReceipt, **options: Any) -> bool:
        """Delegate (``older_than`` included), with any injected fault."""
        retire = self._lifecycle("retire")
        return cast(bool, await self._write("retire", lambda: retire(receipt, **options)))

    async def prune(self, **arguments: Any) -> int:
        """Delegate, with any injected fault (before the first batch, or after the last)."""
        prune = self._lifecycle("prune")
        return cast(int, await self._write("prune", lambda: prune(**arguments)))

    async def close(self) -> None:
        """Close the wrapped ledger."""
        await self.inner.close()
