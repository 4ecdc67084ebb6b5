"""The OpenTelemetry set-up of the benchmarks' instrumented sides: an operator's SDK, exporting nowhere."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from typing import Any

import boundeddb


@contextlib.contextmanager
def instrumented() -> Iterator[None]:
    """
    ``boundeddb.instrument()`` with the OpenTelemetry SDK, as in production, for the duration.

    Metrics go to an in-memory reader read once at the end, as a scrape would; spans go through a
    ``BatchSpanProcessor`` (its thread included in the cost) to an exporter that drops them, so the
    measurement counts making and batching them, not a network.
    """
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult

    class Dropped(SpanExporter):
        def export(self, spans: Sequence[Any]) -> SpanExportResult:
            return SpanExportResult.SUCCESS

    reader = InMemoryMetricReader()
    meters = MeterProvider(metric_readers=[reader])
    tracers = TracerProvider()
    tracers.add_span_processor(BatchSpanProcessor(Dropped()))
    boundeddb.instrument(meter_provider=meters, tracer_provider=tracers)
    try:
        yield
    finally:
        boundeddb.uninstrument()
        reader.get_metrics_data()
        tracers.shutdown()
        meters.shutdown()
