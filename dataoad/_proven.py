"""The proven-write rule: a ledger write counts only when it is proven.

Every ledger call the runner makes goes through :class:`ProvenLedger`. A
write that returns normally is durable. A write that raises may have
committed with its acknowledgement lost, so the receipt is read back, and
the write counts only when the ledger shows *exactly* the transition asked
for (for a release: that the claim is gone). Anything else is refused with
an ``ActionPersistenceError`` subclass that tells the caller what ran:
``NothingInvokedError`` before the operation, ``OutcomeNotRecordedError``
after it. A read that raises is an ``ActionPersistenceError`` too, never a
raw driver error.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, Final, cast

from dataoad._errors import (
    ActionNotFoundError,
    ClaimFencedError,
    LedgerUnusableError,
    NothingInvokedError,
    OutcomeNotRecordedError,
    RecoveryRefusedError,
)
from dataoad._events import EventKind, EventSink
from dataoad._ledger import LeasingLedger, Ledger, LifecycleLedger
from dataoad._proven_reads import ProvenReads
from dataoad._receipt import ActionReceipt, bounded_error
from dataoad._status import ActionStatus

__all__ = ["ProvenLedger", "fenced", "keeps_leases", "proves"]

#: How often an owner's outcome is rebuilt over evidence merged under it.
_REBASE_ROUNDS: Final = 16


def keeps_leases(ledger: object) -> bool:
    """Whether ``ledger`` implements ``take_over`` and ``renew`` (a ``LeasingLedger``)."""
    return all(callable(getattr(ledger, name, None)) for name in ("take_over", "renew"))


def proves(stored: ActionReceipt | None, expected: ActionReceipt | None) -> bool:
    """Whether a read-back proves a write: the exact receipt (None: deleted) is stored."""
    return stored == expected


@dataclasses.dataclass(frozen=True, slots=True)
class _Write:
    """What one conditional write established."""

    proven: bool = False
    #: A read-back's answer (None: absent, or not read, or the read failed).
    stored: ActionReceipt | None = None
    #: The read-back's exception, when it raised.
    read_error: Exception | None = None
    #: The write's own exception, when it raised.
    error: Exception | None = None

    @property
    def read_failed(self) -> bool:
        """Whether the read-back raised."""
        return self.read_error is not None

    @property
    def acknowledgement_lost(self) -> bool:
        """Proven only by reading back after the write raised."""
        return self.proven and self.error is not None


#: The two answers of a write that did not raise (a _Write is immutable: shared).
_PROVEN: Final = _Write(proven=True)
_REFUSED: Final = _Write()


def fenced(stored: ActionReceipt | None, mine: ActionReceipt) -> bool:
    """Whether ``stored`` shows that ``mine``'s holder lost the claim to a later owner."""
    return stored is not None and stored.fencing_token > mine.fencing_token


class ProvenLedger(ProvenReads):
    """A ledger seen through the proven-write rule, within one namespace.

    The namespace is the runner's: keys are looked up in it, and a receipt
    of another namespace is not found by id either, so one tenant's runner
    can neither replay nor settle nor reopen another's actions.
    """

    __slots__ = ("ledger", "namespace")

    def __init__(self, ledger: Ledger, namespace: str) -> None:
        self.ledger = ledger
        self.namespace = namespace

    async def _read_back(self, read: Callable[[], Awaitable[ActionReceipt | None]]) -> _Write:
        try:
            return _Write(stored=await read())
        except Exception as exc:
            return _Write(read_error=exc)

    async def _prove(
        self,
        write: Callable[[], Awaitable[bool]],
        expected: ActionReceipt | None,
        action_id: str,
    ) -> _Write:
        """The write, proven or refused; on a refusal, what is stored instead."""
        attempt = await self._prove_unread(write, expected, action_id)
        if attempt.proven or attempt.error is not None:
            return attempt
        return await self._read_back(lambda: self.ledger.get(action_id))

    async def _prove_unread(
        self,
        write: Callable[[], Awaitable[bool]],
        expected: ActionReceipt | None,
        action_id: str,
    ) -> _Write:
        """The write, proven or refused; a refusal reads nothing (only an error reads back)."""
        try:
            done = await write()
        except Exception as exc:
            back = await self._read_back(lambda: self.ledger.get(action_id))
            proven = not back.read_failed and proves(back.stored, expected)
            return dataclasses.replace(back, proven=proven, error=exc)
        return _PROVEN if done else _REFUSED

    # -- writes ------------------------------------------------------------------

    async def claim(
        self, proposed: ActionReceipt, lease: float | None = None
    ) -> tuple[ActionReceipt, bool]:
        """Insert the claim: ``(proposed, True)``, or ``(someone else's, False)``."""
        try:
            if lease is None:  # a ledger written before leases takes no lease
                return await self.ledger.claim(proposed)
            return await self.ledger.claim(proposed, lease=lease)
        except Exception as exc:
            # Our action id is fresh, so finding it stored proves the claim is ours.
            back = await self._read_back(
                lambda: self._find(proposed.action_name, proposed.idempotency_key)
            )
            if not back.read_failed and proves(back.stored, proposed):
                return proposed, True
            if back.stored is not None and back.stored.action_id != proposed.action_id:
                return back.stored, False
            # Read back and absent: nothing is stored, so there is no claim to
            # carry (the proposal's counted attempt never existed anywhere).
            stored = proposed if back.read_failed else None
            if isinstance(exc, LedgerUnusableError):
                # The ledger's set-up (no schema yet, not a ledger file), not a
                # lost write: recovery advice would send the reader the wrong way.
                advice = "The ledger cannot be used as set up: fix it and call again"
            else:
                advice = (
                    "Re-read the ledger: if the claim was stored, it counts attempt 1 (claim "
                    "and attempt start are one write) and settles read-only (recover_pending) "
                    "or by a lease takeover"
                )
            raise NothingInvokedError(
                f"the claim for {proposed.action_name!r} could not be proven durable "
                f"({bounded_error(exc)}); the operation was not invoked. {advice}",
                receipt=stored,
                operation_invoked=False,
            ) from exc

    async def start_attempt(
        self,
        proposed: ActionReceipt,
        previous: ActionReceipt,
        events: EventSink,
        lease: float | None = None,
        *,
        rebase: Callable[[ActionReceipt, ActionReceipt, ActionReceipt], ActionReceipt | None],
    ) -> ActionReceipt:
        """Count the attempt durably before invoking, or raise NothingInvokedError.

        Returns what was stored. ClaimFencedError (nothing invoked) when the
        claim was taken over. Refused (or failed) because a fenced worker's
        evidence was merged under its holder, the start is rebuilt over it by
        ``rebase`` (see ``record_outcome``) and written again.
        """
        base = previous
        write = _Write()
        for _ in range(_REBASE_ROUNDS):
            mine = proposed
            write = await self._prove(
                functools.partial(self.ledger.start_attempt, mine)
                if lease is None
                else functools.partial(self.ledger.start_attempt, mine, lease=lease),
                mine,
                mine.action_id,
            )
            if write.acknowledgement_lost:
                events.emit(EventKind.ATTEMPT_START_ACKNOWLEDGEMENT_RECOVERED, proposed)
            if write.proven:
                return proposed
            # Refused, or failed while the claim moved: what is stored decides
            # (a write that failed never counts unless the read-back proves it).
            stored = write.stored
            if stored is None:
                break
            rebased = rebase(proposed, base, stored)
            if rebased is None:
                break
            base, proposed = stored, rebased
        shown = write.stored if write.stored is not None else previous
        if fenced(write.stored, proposed):
            events.emit(EventKind.FENCED, shown, level=logging.WARNING)
            raise ClaimFencedError(
                f"action {proposed.action_id} was taken over by {shown.owner!r} before "
                f"attempt {proposed.attempts} could start; the operation was not invoked",
                receipt=shown,
                operation_invoked=False,
            )
        if write.error is not None:
            events.emit(EventKind.ATTEMPT_NOT_STARTED, previous, level=logging.WARNING)
            raise NothingInvokedError(
                f"attempt {proposed.attempts} of action {proposed.action_id} could not be "
                f"proven durable ({bounded_error(write.error)}); the operation was not invoked",
                receipt=shown,
                operation_invoked=False,
            ) from write.error
        raise NothingInvokedError(
            f"action {proposed.action_id} changed before attempt {proposed.attempts} could "
            "start (released or recovered concurrently, or a fenced worker's evidence that "
            "the effect may have happened merged in?); the operation was not invoked",
            receipt=shown,
            operation_invoked=False,
        )

    async def record_outcome(
        self,
        final: ActionReceipt,
        durable: ActionReceipt,
        events: EventSink,
        *,
        observed_status: ActionStatus,
        observed_metadata: Mapping[str, Any],
        value: object,
        has_value: bool,
        rebase: Callable[[ActionReceipt, ActionReceipt, ActionReceipt], ActionReceipt | None],
    ) -> ActionReceipt:
        """Record an invoked operation's outcome and return what was recorded.

        OutcomeNotRecordedError when it cannot be; ClaimFencedError (with what
        is stored now) when the claim was taken over. When the write is
        refused, or fails, because the claim moved without leaving its holder
        (a fenced worker's evidence merged into it), ``rebase(final, base, stored)``
        gives the outcome (written over ``base``) rebuilt over what is stored,
        which is written instead (bounded rounds): the holder's outcome is
        always recorded.
        """
        base = durable
        write = _Write()
        back: _Write | None = None  # what is stored since the last write
        for _ in range(_REBASE_ROUNDS):
            mine = final
            write = await self._prove_unread(
                functools.partial(self.ledger.record, mine), mine, mine.action_id
            )
            if write.acknowledgement_lost:
                events.emit(EventKind.OUTCOME_ACKNOWLEDGEMENT_RECOVERED, final)
            if write.proven:
                return final
            back = await self._read_back(functools.partial(self.ledger.get, mine.action_id))
            stored = back.stored
            if write.error is not None and proves(stored, mine):
                # The write's own read-back could not tell; this one shows it landed.
                events.emit(EventKind.OUTCOME_ACKNOWLEDGEMENT_RECOVERED, final)
                return final
            rebased = None if stored is None else rebase(final, base, stored)
            if stored is None or rebased is None:
                break
            base, final, back = stored, rebased, None
        if back is None:  # every round rebased: the last write is unread
            back = await self._read_back(lambda: self.ledger.get(final.action_id))
        # Refused, or failed without landing: if a new owner took the claim,
        # this outcome is a fenced worker's evidence, however the write ended.
        if fenced(back.stored, final):
            assert back.stored is not None
            events.emit(EventKind.FENCED, back.stored, level=logging.WARNING)
            raise ClaimFencedError(
                f"action {durable.action_id} was taken over by {back.stored.owner!r} "
                f"(its lease had run out); this worker's outcome "
                f"({observed_status.value}) is evidence only. The operation WAS "
                "invoked: do not repeat it",
                receipt=back.stored,
                operation_invoked=True,
                observed_status=observed_status,
                observed_metadata=observed_metadata,
                value_available=has_value,
                observed_value=value,
            )
        events.emit(
            EventKind.OUTCOME_NOT_RECORDED,
            durable,
            level=logging.ERROR,
            observed_status=observed_status.value,
        )
        problem = (
            "the claim changed concurrently" if write.error is None else bounded_error(write.error)
        )
        raise OutcomeNotRecordedError(
            f"the outcome of action {durable.action_id} ({observed_status.value}) "
            f"could not be recorded ({problem}). The operation WAS invoked: do not repeat "
            "it. Re-read the ledger; a PENDING claim needs read-only recover_pending",
            receipt=durable,
            operation_invoked=True,
            observed_status=observed_status,
            observed_metadata=observed_metadata,
            value_available=has_value,
            observed_value=value,  # the error keeps it only when value_available
        ) from write.error

    async def record_best_effort(self, receipt: ActionReceipt) -> None:
        """Try once to record ``receipt``; a PENDING claim left behind is still a barrier."""
        try:
            await self.ledger.record(receipt)
        except BaseException:
            return

    async def merge(self, proposed: ActionReceipt, current: ActionReceipt) -> ActionReceipt | None:
        """Write a read-only observation's receipt: None when written, else what is stored now.

        The caller re-merges into the returned receipt (another writer won).
        """
        write = await self._prove(
            lambda: self.ledger.record(proposed), proposed, proposed.action_id
        )
        if write.proven:
            return None
        if write.error is not None:
            raise NothingInvokedError(
                f"the verification of action {proposed.action_id} could not be recorded "
                f"({bounded_error(write.error)}); nothing was invoked",
                receipt=write.stored if write.stored is not None else current,
                operation_invoked=False,
                observed_status=proposed.final_status,
                observed_metadata=proposed.metadata,
            ) from write.error
        if write.read_error is not None:
            raise NothingInvokedError(
                f"the verification of action {proposed.action_id} lost a race and the "
                f"receipt could not be re-read ({bounded_error(write.read_error)}); nothing "
                "was invoked",
                receipt=current,
                operation_invoked=False,
                observed_status=proposed.final_status,
                observed_metadata=proposed.metadata,
            ) from write.read_error
        if write.stored is None:
            raise ActionNotFoundError(
                f"action {proposed.action_id} disappeared during reconciliation",
                action_id=proposed.action_id,
            )
        return write.stored

    async def take_over(self, proposed: ActionReceipt, lease: float) -> bool:
        """Take an expired claim over: True when proven, False when refused.

        NothingInvokedError when the write raised and could not be proven
        either way (the claim may now be this runner's, with nothing started).
        """
        ledger = cast(LeasingLedger, self.ledger)
        write = await self._prove_unread(
            lambda: ledger.take_over(proposed, lease=lease), proposed, proposed.action_id
        )
        if write.proven:
            return True
        if write.error is None:
            return False
        if not write.read_failed and not fenced(write.stored, proposed):
            return False  # the read-back shows someone else's write, not ours
        raise NothingInvokedError(
            f"taking over action {proposed.action_id} could not be proven "
            f"({bounded_error(write.error)}); nothing was invoked",
            receipt=write.stored,
            operation_invoked=False,
        ) from write.error

    async def release(self, receipt: ActionReceipt, events: EventSink) -> None:
        """Delete a claim that never started an attempt, or raise and change nothing."""
        action_id = receipt.action_id
        write = await self._prove(
            lambda: self.ledger.release(action_id, receipt.version), None, action_id
        )
        if write.proven and write.error is None:
            events.emit(EventKind.RELEASED, receipt)
            return
        if write.error is not None:
            if write.proven:
                # Gone, but absence does not prove this delete: another release,
                # or a prune once another worker had started and completed the
                # claim, leaves the same absence.
                raise NothingInvokedError(
                    f"the release of action {action_id} could not be confirmed "
                    f"({bounded_error(write.error)}): the claim is gone, removed by this "
                    "release or by another writer (a release, or a prune once it had completed)",
                    receipt=receipt,
                    operation_invoked=False,
                ) from write.error
            # Not proven: either the read-back failed, or the claim is still there.
            if write.read_error is not None:
                raise NothingInvokedError(
                    f"the release of action {action_id} could not be confirmed "
                    f"({bounded_error(write.error)})",
                    receipt=receipt,
                    operation_invoked=False,
                ) from write.error
            raise NothingInvokedError(
                f"the release of action {action_id} failed ({bounded_error(write.error)})",
                receipt=write.stored,
                operation_invoked=False,
            ) from write.error
        if write.read_error is not None:
            raise NothingInvokedError(
                f"action {action_id} changed before it could be released, and it could "
                f"not be re-read ({bounded_error(write.read_error)}); nothing was released",
                receipt=receipt,
                operation_invoked=False,
            ) from write.read_error
        raise RecoveryRefusedError(
            f"action {action_id} changed before it could be released (an attempt may "
            "have started); nothing was released",
            receipt=write.stored,
        )

    async def retire(
        self, proposed: ActionReceipt, current: ActionReceipt, *, older_than: float | None = None
    ) -> bool:
        """Free a key: True when proven, False when refused (changed first, or too young).

        ``older_than`` asks the ledger to free it only if it stored
        ``current`` at least that many seconds ago by its own clock.
        NothingInvokedError when the write raised and could not be proven
        either way (the key may or may not be free; nothing was invoked).
        """
        ledger = cast(LifecycleLedger, self.ledger)
        if older_than is None:
            write = await self._prove_unread(
                lambda: ledger.retire(proposed), proposed, proposed.action_id
            )
        else:
            write = await self._prove_unread(
                lambda: ledger.retire(proposed, older_than=older_than),
                proposed,
                proposed.action_id,
            )
        if write.proven:
            return True
        if write.error is None or (not write.read_failed and write.stored != current):
            return False  # refused, or the read-back shows another writer's change
        raise NothingInvokedError(
            f"freeing the key of action {proposed.action_id} could not be proven "
            f"({bounded_error(write.error)}); nothing was invoked",
            # Not this call's claim: it made none (the receipt is named in the message).
            receipt=None,
            operation_invoked=False,
        ) from write.error
