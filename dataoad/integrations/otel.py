"""OpenTelemetry: one span per runner verb call. Needs the ``otel`` extra.

``OpenTelemetryObserver`` is a runner observer: pass it to
``ActionRunner(ledger, observers=[OpenTelemetryObserver()])``. Every verb
(``execute``, ``reconcile``, ``recover_pending``, ``release_unstarted``)
runs in a span named ``dataoad.<verb>`` (``dataoad.execute <action name>``),
current while the operation and verifier run, so their own spans nest in it.
Attributes carry the action name, action id, statuses, attempts and whether
the result was a replay; never the request, the idempotency key, metadata or
provider values. ``TracedActionRunner`` is an ``ActionRunner`` with one.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from dataoad._clock import Clock
from dataoad._events import EventKind, RunnerEvent, RunnerObserver
from dataoad._ledger import Ledger
from dataoad._policy import RetryPolicy
from dataoad._result import ActionResult
from dataoad._runner import ActionRunner
from dataoad.integrations._common import require

_trace = require("opentelemetry.trace", "otel")
_context = require("opentelemetry.context", "otel")

__all__ = ["OpenTelemetryObserver", "TracedActionRunner"]


def _attributes(result: ActionResult[Any]) -> dict[str, Any]:
    receipt = result.receipt
    return {
        "dataoad.action_id": receipt.action_id,
        "dataoad.final_status": result.status.value,
        "dataoad.execution_status": "-"
        if receipt.execution_status is None
        else receipt.execution_status.value,
        "dataoad.verification_status": "-"
        if receipt.verification_status is None
        else receipt.verification_status.value,
        "dataoad.attempts": receipt.attempts,
        "dataoad.replayed": result.replayed,
    }


class OpenTelemetryObserver:
    """Records one span per verb call, from the runner's call events."""

    def __init__(self, tracer: Any = None) -> None:
        self._tracer = tracer if tracer is not None else _trace.get_tracer("dataoad")
        self._open: dict[int, tuple[Any, object]] = {}

    def on_event(self, event: RunnerEvent) -> None:
        """Open the call's span when it starts; fill in and end it when it finishes."""
        if event.kind is EventKind.CALL_STARTED:
            name = f"dataoad.{event.verb}" + (f" {event.action_name}" if event.action_name else "")
            attributes: dict[str, Any] = {}
            if event.action_name:
                attributes["dataoad.action_name"] = event.action_name
            if event.action_id:
                attributes["dataoad.action_id"] = event.action_id
            span = self._tracer.start_span(name, attributes=attributes, record_exception=False)
            # Current while the verb runs (same task), so the operation's spans nest.
            token = _context.attach(_trace.set_span_in_context(span))
            self._open[event.call] = (span, token)
        elif event.kind is EventKind.CALL_FINISHED:
            opened = self._open.pop(event.call, None)
            if opened is None:
                return
            span, token = opened
            try:
                self._finish(span, event)
            finally:
                span.end()
                _context.detach(token)

    @staticmethod
    def _finish(span: Any, event: RunnerEvent) -> None:
        if event.error is not None:
            # The error's type is the protocol outcome; its message may name keys.
            outcome = type(event.error).__name__
            span.set_attribute("dataoad.outcome", outcome)
            if event.receipt is not None:
                span.set_attribute("dataoad.action_id", event.receipt.action_id)
            span.set_status(_trace.Status(_trace.StatusCode.ERROR, outcome))
        elif isinstance(event.result, ActionResult):
            span.set_attributes(_attributes(event.result))
        elif event.verb == "release_unstarted":
            span.set_attribute("dataoad.outcome", "released")


class TracedActionRunner(ActionRunner):
    """An ActionRunner with an :class:`OpenTelemetryObserver` (and any others given).

    Takes every option of ActionRunner (lease, owner, namespace, bounds...).
    """

    def __init__(
        self,
        ledger: Ledger,
        *,
        policy: RetryPolicy | None = None,
        clock: Clock | None = None,
        observers: Sequence[RunnerObserver] = (),
        tracer: Any = None,
        **options: Any,
    ) -> None:
        super().__init__(
            ledger,
            policy=policy,
            clock=clock,
            observers=(*observers, OpenTelemetryObserver(tracer)),
            **options,
        )
