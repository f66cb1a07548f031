"""Runner events: one enum of what can happen, one place that emits it.

Every durable transition and every public verb call is emitted here, once:
it is logged on the ``dataoad`` logger and handed to each observer (the
OpenTelemetry integration is one). An observer that raises is logged and
ignored: telemetry must never change what the runner does or records.
"""

from __future__ import annotations

import dataclasses
import enum
import itertools
import logging
from collections.abc import Iterable, Mapping
from typing import Any, Protocol, runtime_checkable

from dataoad._log import log_event, logger
from dataoad._receipt import ActionReceipt

__all__ = ["EventKind", "EventSink", "RunnerEvent", "RunnerObserver"]


class EventKind(enum.Enum):
    """What happened. Values are the ``event`` field of the log records."""

    #: A public verb (``execute``, ``reconcile`` ...) was called.
    CALL_STARTED = "call_started"
    #: That verb returned or raised; ``result`` or ``error`` says which.
    CALL_FINISHED = "call_finished"
    CLAIMED = "claimed"
    CONFLICT = "conflict"
    IN_PROGRESS = "in_progress"
    REPLAYED = "replayed"
    ATTEMPT_STARTED = "attempt_started"
    ATTEMPT_START_ACKNOWLEDGEMENT_RECOVERED = "attempt_start_acknowledgement_recovered"
    ATTEMPT_NOT_STARTED = "attempt_not_started"
    RETRYING = "retrying"
    COMPLETED = "completed"
    OUTCOME_ACKNOWLEDGEMENT_RECOVERED = "outcome_acknowledgement_recovered"
    OUTCOME_NOT_RECORDED = "outcome_not_recorded"
    RECONCILED = "reconciled"
    #: A verifier raised or gave no usable answer: no evidence. Its message is
    #: logged here only (it may carry a provider's values); a receipt stores
    #: the exception's type, and a completed receipt is not written at all.
    VERIFICATION_FAILED = "verification_failed"
    RECOVERED = "recovered"
    RELEASED = "released"
    #: An expired claim passed to this runner (fencing token + 1).
    TAKEN_OVER = "taken_over"
    #: This runner's claim was taken over: it can no longer write it.
    FENCED = "fenced"
    #: A sweep could not settle one stale claim (it goes on with the others).
    STALE_CLAIM_NOT_SETTLED = "stale_claim_not_settled"
    #: A fenced worker's evidence was merged into the new owner's receipt.
    ZOMBIE_EVIDENCE_MERGED = "zombie_evidence_merged"
    #: A definitive receipt gave up its key (expired or reopened); it stays readable.
    RETIRED = "retired"


@dataclasses.dataclass(frozen=True, slots=True)
class RunnerEvent:
    """One emitted event. ``call`` ties it to the verb call it happened in."""

    kind: EventKind
    receipt: ActionReceipt | None
    level: int
    fields: Mapping[str, Any]
    call: int
    verb: str
    action_name: str | None = None
    #: The action id the verb was called with (reconcile, recover, release).
    action_id: str | None = None
    result: Any = None
    error: BaseException | None = None


@runtime_checkable
class RunnerObserver(Protocol):
    """Receives every runner event, synchronously, on the caller's task."""

    def on_event(self, event: RunnerEvent) -> None:
        """Handle one event; must not block. Exceptions are logged and ignored."""
        ...


_calls = itertools.count(1)


class EventSink:
    """Logs events and fans them out to observers, for one verb call."""

    __slots__ = ("_observers", "action_id", "action_name", "call", "verb")

    def __init__(
        self,
        observers: tuple[RunnerObserver, ...],
        verb: str,
        action_name: str | None = None,
        action_id: str | None = None,
    ) -> None:
        self._observers = observers
        self.verb = verb
        self.action_name = action_name
        self.action_id = action_id
        self.call = next(_calls)

    def emit(
        self,
        event: EventKind,
        receipt: ActionReceipt | None,
        *,
        level: int = logging.INFO,
        result: Any = None,
        error: BaseException | None = None,
        **fields: Any,
    ) -> None:
        """Log ``event`` (unless call-level) and hand it to every observer."""
        # Call-level events only observers see: the log has one record per
        # transition, not per call. The level is asked first: a call emits
        # about five events, and most processes log none of them.
        if (
            event is not EventKind.CALL_STARTED
            and event is not EventKind.CALL_FINISHED
            and logger.isEnabledFor(level)
        ):
            log_event(event.value, receipt, level=level, **fields)
        if not self._observers:
            return
        record = RunnerEvent(
            kind=event,
            receipt=receipt,
            level=level,
            fields=fields,
            call=self.call,
            verb=self.verb,
            action_name=self.action_name,
            action_id=self.action_id,
            result=result,
            error=error,
        )
        for observer in self._observers:
            try:
                observer.on_event(record)
            except Exception:
                logger.warning(
                    "observer %r raised on %s; ignored", observer, event.value, exc_info=True
                )


def check_observers(observers: Iterable[object]) -> tuple[RunnerObserver, ...]:
    """The observers as a tuple, or TypeError naming the first that is not one."""
    checked: list[RunnerObserver] = []
    for observer in observers:
        if not isinstance(observer, RunnerObserver):
            raise TypeError(f"observer {type(observer).__qualname__} has no on_event(event) method")
        checked.append(observer)
    return tuple(checked)
