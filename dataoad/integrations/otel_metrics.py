"""OpenTelemetry metrics: outcomes, latency and the ledger's backlog. Needs ``otel``.

``MetricsObserver`` is a runner observer (``ActionRunner(ledger,
observers=[MetricsObserver()])``) recording:

* ``dataoad.actions`` (counter): finished ``execute`` calls, by
  ``dataoad.action_name``, ``dataoad.status`` (CONFIRMED, FAILED, UNKNOWN,
  or the refusal's type such as ActionInProgressError) and
  ``dataoad.replayed``;
* ``dataoad.execute.duration`` (histogram, seconds): how long each
  ``execute`` took, with the same attributes.

``LedgerGauges`` reads the ledger through its inspection protocol and
reports observable gauges, the two numbers to alert on:

* ``dataoad.receipts.unknown``: completed receipts whose outcome is UNKNOWN
  (each needs a verifier or a person);
* ``dataoad.receipts.pending`` and ``dataoad.receipts.stale``: PENDING
  claims, and those whose lease has run out by the ledger's clock (a worker
  that died mid-action leaves one): the same "stale" as
  ``ledger.receipts(stale=True)``, ``dataoad receipts list --stale`` and
  ``recover_stale``.

The gauges report the values of the latest ``await gauges.refresh()``;
``gauges.start(interval)`` refreshes them in a background task.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Iterable
from typing import Any

from dataoad._events import EventKind, RunnerEvent
from dataoad._ledger import Inspection
from dataoad._result import ActionResult
from dataoad._status import ActionStatus
from dataoad.integrations._common import require

_metrics = require("opentelemetry.metrics", "otel")

__all__ = ["LedgerGauges", "MetricsObserver"]


def _meter(meter: Any) -> Any:
    return meter if meter is not None else _metrics.get_meter("dataoad")


class MetricsObserver:
    """Counts outcomes and times ``execute`` calls, from the runner's events."""

    def __init__(self, meter: Any = None) -> None:
        meter = _meter(meter)
        self._actions = meter.create_counter(
            "dataoad.actions", unit="{action}", description="finished execute calls by outcome"
        )
        self._duration = meter.create_histogram(
            "dataoad.execute.duration", unit="s", description="time each execute call took"
        )
        self._started: dict[int, float] = {}

    def on_event(self, event: RunnerEvent) -> None:
        """Start timing an ``execute``; count and time it when it finishes."""
        if event.verb != "execute":
            return
        if event.kind is EventKind.CALL_STARTED:
            self._started[event.call] = time.monotonic()
            return
        if event.kind is not EventKind.CALL_FINISHED:
            return
        started = self._started.pop(event.call, None)
        if isinstance(event.result, ActionResult):
            status, replayed = event.result.status.value, event.result.replayed
        else:
            status, replayed = type(event.error).__name__, False
        attributes = {
            "dataoad.action_name": event.action_name or "-",
            "dataoad.status": status,
            "dataoad.replayed": replayed,
        }
        self._actions.add(1, attributes)
        if started is not None:
            self._duration.record(time.monotonic() - started, attributes)


class LedgerGauges:
    """Observable gauges of the ledger's UNKNOWN, PENDING and stale receipts."""

    def __init__(self, ledger: Inspection, *, meter: Any = None) -> None:
        self._ledger = ledger
        self.values: dict[str, int] = {"unknown": 0, "pending": 0, "stale": 0}
        meter = _meter(meter)
        for name, what in (
            ("unknown", "completed receipts whose outcome is UNKNOWN"),
            ("pending", "PENDING claims"),
            ("stale", "PENDING claims whose lease has run out by the ledger's clock"),
        ):
            meter.create_observable_gauge(
                f"dataoad.receipts.{name}",
                callbacks=[self._callback(name)],
                unit="{receipt}",
                description=what,
            )

    def _callback(self, name: str) -> Any:
        def observe(options: Any) -> Iterable[Any]:
            return [_metrics.Observation(self.values[name])]

        return observe

    async def refresh(self) -> dict[str, int]:
        """Read the counts from the ledger now; returns them."""
        unknown = await self._ledger.receipts(final_status=ActionStatus.UNKNOWN)
        pending = await self._ledger.receipts(pending=True)
        # The ledger judges the lease by its own clock: never this host's.
        stale = await self._ledger.receipts(stale=True)
        self.values = {"unknown": len(unknown), "pending": len(pending), "stale": len(stale)}
        return dict(self.values)

    def start(self, interval: float = 30.0) -> asyncio.Task[None]:
        """Refresh every ``interval`` seconds in a task on the running loop (cancel it to stop)."""

        async def loop() -> None:
            while True:
                # A ledger hiccup must not end the metrics: the next round retries.
                with contextlib.suppress(Exception):
                    await self.refresh()
                await asyncio.sleep(interval)

        return asyncio.get_running_loop().create_task(loop())
