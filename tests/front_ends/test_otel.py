"""OpenTelemetry: one span per action, with statuses and no request contents."""

from __future__ import annotations

import asyncio
import contextlib
import re
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from suite_support.agents import framework

framework("opentelemetry.sdk", "otel")

from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import (
    InMemorySpanExporter,
)
from opentelemetry.util.types import AnyValue

if TYPE_CHECKING:
    from opentelemetry.sdk.metrics.export import NumberDataPoint

from dataoad import ActionInProgressError, InMemoryLedger
from dataoad.integrations.otel import TracedActionRunner
from suite_support import confirmed, unstarted

SECRET_REQUEST = {"card_number": "4242424242424242", "amount_cents": 2500}

Spans = tuple[InMemorySpanExporter, TracerProvider]


def attributes(item: ReadableSpan | NumberDataPoint) -> Mapping[str, AnyValue]:
    """A finished span's or a data point's attributes (the SDK always sets them)."""
    assert item.attributes is not None
    return item.attributes


@pytest.fixture
def spans() -> Spans:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return exporter, provider


async def test_one_span_per_action_with_outcome_attributes(spans: Spans) -> None:
    exporter, provider = spans
    runner = TracedActionRunner(InMemoryLedger(), tracer=provider.get_tracer("test"))

    async def lost() -> None:
        raise TimeoutError("response lost")

    first = await runner.execute(
        "charge",
        lost,
        request=SECRET_REQUEST,
        idempotency_key="order-1",
        provider_reference="order-1",
    )
    await runner.execute(
        "charge",
        lost,
        request=SECRET_REQUEST,
        idempotency_key="order-1",
        provider_reference="order-1",
    )
    await runner.reconcile(first.receipt.action_id, lambda receipt: confirmed(ref="order-1"))
    execute, replay, reconcile = exporter.get_finished_spans()
    assert execute.name == "dataoad.execute charge"
    assert attributes(execute)["dataoad.final_status"] == "UNKNOWN"
    assert attributes(execute)["dataoad.attempts"] == 1
    assert attributes(execute)["dataoad.replayed"] is False
    assert attributes(replay)["dataoad.replayed"] is True
    assert reconcile.name == "dataoad.reconcile"
    assert attributes(reconcile)["dataoad.final_status"] == "CONFIRMED"
    for span in (execute, replay, reconcile):
        text = repr(dict(attributes(span))) + repr(span.events)
        assert "4242" not in text
        assert "card_number" not in text


async def test_a_refusal_marks_the_span_with_its_outcome(spans: Spans) -> None:
    exporter, provider = spans
    runner = TracedActionRunner(InMemoryLedger(), tracer=provider.get_tracer("test"))

    started, release = asyncio.Event(), asyncio.Event()

    async def held() -> None:
        started.set()
        await release.wait()

    holder = asyncio.create_task(
        runner.execute("charge", held, request=SECRET_REQUEST, idempotency_key="k")
    )
    await started.wait()
    with pytest.raises(ActionInProgressError):
        await runner.execute("charge", held, request=SECRET_REQUEST, idempotency_key="k")
    release.set()
    await holder
    refused = next(s for s in exporter.get_finished_spans() if "dataoad.outcome" in attributes(s))
    assert attributes(refused)["dataoad.outcome"] == "ActionInProgressError"
    assert refused.status.status_code.name == "ERROR"


@pytest.mark.parametrize(
    "bad",
    [
        "card=4111111111111111&cvv=123\n" + "x" * 1_000_000,  # a secret, a line break, 1 MB
        "n" * 129,  # one past the longest action name
        "a\x00b",
        "",
    ],
    ids=["secret 1 MB", "129 characters", "NUL", "empty"],
)
async def test_a_refused_name_or_id_reaches_no_span_or_metric(spans: Spans, bad: str) -> None:
    # Observers hear of a call before its arguments are checked: a name or id
    # the checks refuse must not become a span name, an attribute or a series.
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader

    from dataoad import InvalidArgumentError
    from dataoad.integrations.otel_metrics import MetricsObserver

    exporter, provider = spans
    reader = InMemoryMetricReader()
    meter = MeterProvider(metric_readers=[reader]).get_meter("test")
    runner = TracedActionRunner(
        InMemoryLedger(), tracer=provider.get_tracer("test"), observers=[MetricsObserver(meter)]
    )

    async def charge() -> str:
        return "ch"

    with pytest.raises(InvalidArgumentError):
        await runner.execute(bad, charge, request={}, idempotency_key="k")
    with pytest.raises(InvalidArgumentError):
        await runner.reconcile(bad, lambda receipt: confirmed())
    good = "n" * 128  # the longest name is still reported as it is
    await runner.execute(good, charge, request={}, idempotency_key="k")
    data = reader.get_metrics_data()
    assert data is not None
    exported = repr(data.to_json()) + repr(
        [(s.name, dict(attributes(s))) for s in exporter.get_finished_spans()]
    )
    if bad:  # (the empty name shows as the span names below)
        assert bad not in exported
    assert "4111111111111111" not in exported  # the card number whole: a duration has digits
    assert good in exported
    names = [s.name for s in exporter.get_finished_spans()]
    assert names == ["dataoad.execute", "dataoad.reconcile", f"dataoad.execute {good}"]


async def test_release_unstarted_runs_in_a_span_too(spans: Spans) -> None:
    from dataoad import ActionNotFoundError

    exporter, provider = spans
    inner = InMemoryLedger()
    runner = TracedActionRunner(inner, tracer=provider.get_tracer("test"))

    stranded = await unstarted(inner)  # a claim only a v0.1 runner could leave
    await runner.release_unstarted(stranded.action_id)
    with pytest.raises(ActionNotFoundError):  # it is gone now
        await runner.release_unstarted(stranded.action_id)
    released, refused = [
        s for s in exporter.get_finished_spans() if s.name == "dataoad.release_unstarted"
    ]
    assert attributes(released)["dataoad.outcome"] == "released"
    assert attributes(refused)["dataoad.outcome"] == "ActionNotFoundError"
    assert refused.status.status_code.name == "ERROR"


def test_the_operations_own_spans_nest_in_the_action_span(spans: Spans) -> None:
    exporter, provider = spans
    tracer = provider.get_tracer("test")
    runner = TracedActionRunner(InMemoryLedger(), tracer=tracer)

    async def charge() -> str:
        with tracer.start_as_current_span("provider.charge"):
            return "ok"

    asyncio.run(runner.execute("charge", charge, request=SECRET_REQUEST, idempotency_key="k"))
    inner, outer = exporter.get_finished_spans()
    assert outer.name == "dataoad.execute charge"
    assert inner.parent is not None
    assert inner.parent.span_id == outer.context.span_id


async def test_metrics_count_outcomes_time_calls_and_gauge_the_backlog() -> None:
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import (
        Histogram,
        InMemoryMetricReader,
        NumberDataPoint,
        Sum,
    )

    from dataoad import ActionRunner
    from dataoad.integrations.otel_metrics import LedgerGauges, MetricsObserver
    from dataoad.testing import FaultyLedger, LedgerFault, ManualClock
    from suite_support import CountingOperation

    reader = InMemoryMetricReader()
    meter = MeterProvider(metric_readers=[reader]).get_meter("test")
    clock = ManualClock()
    ledger = InMemoryLedger(clock=clock)
    runner = ActionRunner(ledger, observers=[MetricsObserver(meter)])
    gauges = LedgerGauges(ledger, meter=meter)

    await runner.execute("charge", CountingOperation(), request={}, idempotency_key="a")
    await runner.execute("charge", CountingOperation(), request={}, idempotency_key="a")
    await runner.execute(
        "charge", CountingOperation(TimeoutError("lost")), request={}, idempotency_key="b"
    )
    stuck = FaultyLedger(ledger)
    stuck.inject("record", LedgerFault.FAIL_BEFORE_WRITE)
    stuck.inject("get", LedgerFault.FAIL_BEFORE_WRITE)
    with pytest.raises(Exception, match="could not be recorded"):
        await ActionRunner(stuck).execute(
            "refund", CountingOperation(), request={}, idempotency_key="c"
        )
    with pytest.raises(ActionInProgressError):
        await runner.execute("refund", CountingOperation(), request={}, idempotency_key="c")
    # Stale means what `receipts list --stale` means: the claim's lease ran out, by the
    # ledger's clock (the default lease is 30 s), however long ago it was written.
    clock.advance(29)
    assert await gauges.refresh() == {"unknown": 1, "pending": 1, "stale": 0}
    clock.advance(2)
    assert await gauges.refresh() == {"unknown": 1, "pending": 1, "stale": 1}
    assert gauges.values["stale"] == len(await ledger.receipts(stale=True))
    data = reader.get_metrics_data()
    assert data is not None
    metrics = {
        m.name: m for rm in data.resource_metrics for sm in rm.scope_metrics for m in sm.metrics
    }
    actions = metrics["dataoad.actions"].data
    assert isinstance(actions, Sum)  # a counter
    counted = {
        (attributes(p)["dataoad.status"], attributes(p)["dataoad.replayed"]): p.value
        for p in actions.data_points
    }
    assert counted == {
        ("CONFIRMED", False): 1,
        ("CONFIRMED", True): 1,
        ("UNKNOWN", False): 1,
        ("ActionInProgressError", False): 1,
    }
    durations = metrics["dataoad.execute.duration"].data
    assert isinstance(durations, Histogram)
    assert sum(p.count for p in durations.data_points) == 4
    for name, value in (("unknown", 1), ("pending", 1), ("stale", 1)):
        [point] = metrics[f"dataoad.receipts.{name}"].data.data_points
        assert isinstance(point, NumberDataPoint)  # a gauge's
        assert point.value == value
    # The docs site's table names exactly the instruments that exist.
    page = (Path(__file__).parents[2] / "docs" / "how-to" / "monitoring.md").read_text()
    documented = set(re.findall(r"^\| `(dataoad\.[a-z_.]+)` \|", page, re.M))
    assert documented == set(metrics)


async def test_gauges_started_on_the_loop_refresh_until_cancelled() -> None:
    from opentelemetry.sdk.metrics import MeterProvider

    from dataoad.integrations.otel_metrics import LedgerGauges
    from suite_support import CountingOperation

    ledger = InMemoryLedger()
    gauges = LedgerGauges(ledger, meter=MeterProvider().get_meter("test"))

    refresher = gauges.start(interval=0.01)
    await asyncio.sleep(0.03)
    assert gauges.values["unknown"] == 0
    runner = TracedActionRunner(ledger)
    await runner.execute(
        "charge", CountingOperation(TimeoutError("lost")), request={}, idempotency_key="a"
    )
    for _ in range(200):  # the next refresh sees the new UNKNOWN receipt
        if gauges.values["unknown"] == 1:
            break
        await asyncio.sleep(0.01)
    assert gauges.values["unknown"] == 1
    refresher.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await refresher
    assert refresher.cancelled()
