"""OpenTelemetry: one span per action. Needs the ``otel`` extra.

``TracedActionRunner`` is an ``ActionRunner`` whose ``execute``,
``reconcile``, ``recover_pending`` and ``release_unstarted`` each run in a span named
``dataoad.<method> <action name>``. Attributes carry the action name,
action id, statuses, attempts and whether the result was a replay; never
the request, the idempotency key's meaning, metadata or provider values.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from dataoad._clock import Clock
from dataoad._errors import DataoadError
from dataoad._ledger import Ledger
from dataoad._policy import RetryPolicy
from dataoad._result import ActionResult
from dataoad._runner import ActionRunner
from dataoad._verification import AnyVerifier
from dataoad.integrations._common import require

_trace = require("opentelemetry.trace", "otel")

__all__ = ["TracedActionRunner"]


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


class TracedActionRunner(ActionRunner):
    """An ActionRunner that records one OpenTelemetry span per action call."""

    def __init__(
        self,
        ledger: Ledger,
        *,
        policy: RetryPolicy | None = None,
        clock: Clock | None = None,
        tracer: Any = None,
    ) -> None:
        super().__init__(ledger, policy=policy, clock=clock)
        self._tracer = tracer if tracer is not None else _trace.get_tracer("dataoad")

    @contextmanager
    def _span(self, method: str, action_name: str | None) -> Iterator[Any]:
        name = f"dataoad.{method}" + (f" {action_name}" if action_name else "")
        attributes = {"dataoad.action_name": action_name} if action_name else {}
        with self._tracer.start_as_current_span(
            name, attributes=attributes, record_exception=False
        ) as span:
            try:
                yield span
            except DataoadError as exc:
                # The error's type is the protocol outcome; its message may name keys.
                span.set_attribute("dataoad.outcome", type(exc).__name__)
                receipt = getattr(exc, "receipt", None)
                if receipt is not None:
                    span.set_attribute("dataoad.action_id", receipt.action_id)
                span.set_status(_trace.Status(_trace.StatusCode.ERROR, type(exc).__name__))
                raise

    async def execute(
        self, action_name: str, operation: Callable[[], Any], **kwargs: Any
    ) -> ActionResult[Any]:
        """``ActionRunner.execute`` in a span."""
        with self._span("execute", action_name) as span:
            result = await super().execute(action_name, operation, **kwargs)
            span.set_attributes(_attributes(result))
            return result

    async def reconcile(self, action_id: str, verifier: AnyVerifier) -> ActionResult[Any]:
        """``ActionRunner.reconcile`` in a span."""
        with self._span("reconcile", None) as span:
            result = await super().reconcile(action_id, verifier)
            span.set_attributes(_attributes(result))
            return result

    async def recover_pending(self, action_id: str, verifier: AnyVerifier) -> ActionResult[Any]:
        """``ActionRunner.recover_pending`` in a span."""
        with self._span("recover_pending", None) as span:
            result = await super().recover_pending(action_id, verifier)
            span.set_attributes(_attributes(result))
            return result

    async def release_unstarted(self, action_id: str) -> None:
        """``ActionRunner.release_unstarted`` in a span."""
        with self._span("release_unstarted", None) as span:
            span.set_attribute("dataoad.action_id", action_id)
            await super().release_unstarted(action_id)
            span.set_attribute("dataoad.outcome", "released")
