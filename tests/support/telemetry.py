"""boundeddb instrumented with the OpenTelemetry SDK's in-memory reader and exporter, for tests."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

import boundeddb

__all__ = ["Telemetry", "telemetry_fixture"]


class Telemetry:
    """The SDK's in-memory reader and exporter, what boundeddb.instrument() was given."""

    def __init__(self) -> None:
        self.reader = InMemoryMetricReader()
        self.exporter = InMemorySpanExporter()
        self.meters = MeterProvider(metric_readers=[self.reader])
        self.tracers = TracerProvider()
        self.tracers.add_span_processor(SimpleSpanProcessor(self.exporter))

    def points(self, name: str) -> list[Any]:
        """The data points of metric ``name`` now (cumulative)."""
        data = self.reader.get_metrics_data()
        if data is None:
            return []
        return [
            point
            for resource in data.resource_metrics
            for scope in resource.scope_metrics
            for metric in scope.metrics
            if metric.name == name
            for point in metric.data.data_points
        ]

    def counts(self, name: str, key: str) -> dict[object, int]:
        """A histogram's count by the value of attribute ``key``."""
        return {point.attributes.get(key): point.count for point in self.points(name)}

    def unit_spans(self) -> list[ReadableSpan]:
        return [span for span in self.exporter.get_finished_spans() if span.name == "boundeddb.unit"]


@pytest.fixture(name="telemetry")
def telemetry_fixture() -> Iterator[Telemetry]:
    """boundeddb instrumented with in-memory providers for the test; uninstrumented after."""
    recorded = Telemetry()
    boundeddb.instrument(meter_provider=recorded.meters, tracer_provider=recorded.tracers)
    yield recorded
    boundeddb.uninstrument()
