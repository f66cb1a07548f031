"""The proven ledger's reads: every read the runner makes, and what a failed one means.

A read that raises is an ``ActionPersistenceError`` (``NothingInvokedError``:
nothing was invoked because of it), never a raw driver error. Part of
``ProvenLedger`` (``_proven``), the runner's only door to the ledger.
"""

from __future__ import annotations

from dataoad._errors import ActionNotFoundError, InvalidArgumentError, NothingInvokedError
from dataoad._ledger import Ledger
from dataoad._receipt import ActionReceipt, bounded_error

__all__ = ["ProvenReads"]


class ProvenReads:
    """Reads within one namespace (``ledger`` and ``namespace`` are the ProvenLedger's)."""

    __slots__ = ()
    ledger: Ledger
    namespace: str

    async def _find(self, action_name: str, idempotency_key: str) -> ActionReceipt | None:
        if not self.namespace:  # a ledger written before namespaces takes none
            return await self.ledger.find(action_name, idempotency_key)
        return await self.ledger.find(action_name, idempotency_key, self.namespace)

    async def read_claim(self, action_name: str, idempotency_key: str) -> ActionReceipt | None:
        """The receipt holding the key, or None; NothingInvokedError if unreadable."""
        try:
            return await self._find(action_name, idempotency_key)
        except Exception as exc:
            raise NothingInvokedError(
                f"could not read the ledger for {action_name!r}: {bounded_error(exc)}; "
                "nothing was invoked",
                receipt=None,
                operation_invoked=False,
            ) from exc

    async def read(self, action_id: str) -> ActionReceipt:
        """The stored receipt; ActionNotFoundError if none, NothingInvokedError if unreadable."""
        try:
            stored = await self.ledger.get(action_id)
        except Exception as exc:
            raise NothingInvokedError(
                f"could not read action {action_id} from the ledger: {bounded_error(exc)}",
                receipt=None,
                operation_invoked=False,
            ) from exc
        if stored is None or stored.namespace != self.namespace:
            where = f" in namespace {self.namespace!r}" if self.namespace else ""
            raise ActionNotFoundError(
                f"no action with id {action_id!r}{where}", action_id=action_id
            )
        return stored

    async def stale_claims(self, limit: int) -> list[ActionReceipt]:
        """PENDING claims of this namespace whose lease ran out (the sweep's listing).

        NothingInvokedError if the ledger cannot list them (the ledger's own
        error is its cause); InvalidArgumentError if it cannot list at all.
        """
        listing = getattr(self.ledger, "receipts", None)
        if not callable(listing):
            raise InvalidArgumentError(
                f"ledger {type(self.ledger).__qualname__} cannot list receipts, so it cannot "
                "be swept for stale claims"
            )
        try:
            found: list[ActionReceipt] = await listing(
                stale=True, limit=limit, namespace=self.namespace
            )
        except Exception as exc:
            raise NothingInvokedError(
                f"could not list the stale claims: {bounded_error(exc)}; nothing was settled",
                receipt=None,
                operation_invoked=False,
            ) from exc
        return found

    async def renew(self, held: ActionReceipt, lease: float) -> bool | None:
        """Extend ``held``'s lease under its fencing token: kept, refused, or None (unknown)."""
        try:
            return bool(
                await self.ledger.renew(  # type: ignore[attr-defined]
                    held.action_id, held.fencing_token, lease
                )
            )
        except Exception:
            return None  # a lost renewal: the lease's margin covers one
