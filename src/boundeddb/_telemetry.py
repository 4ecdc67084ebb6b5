"""OpenTelemetry metrics and traces of every runner: :func:`instrument` and :func:`uninstrument`."""

from __future__ import annotations

import inspect
import threading
import weakref
from collections.abc import Awaitable, Callable, Iterable
from typing import TYPE_CHECKING, Any, Protocol

from ._outcome import Outcome

if TYPE_CHECKING:
    from opentelemetry.context import Context
    from opentelemetry.metrics import CallbackOptions, MeterProvider, Observation
    from opentelemetry.trace import Span, TracerProvider

    from ._stats import RunnerStatistics

__all__ = ["CallTelemetry", "Telemetry", "active", "instrument", "register", "uninstrument"]

#: Seconds: bucket boundaries for unit durations and slot waits (1 ms to 1 min, roughly x2.5 apart).
BUCKETS_S = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)

_lock = threading.Lock()
_active: Telemetry | None = None


class Observed(Protocol):
    """What the gauges read of a runner."""

    def statistics(self) -> RunnerStatistics: ...


#: Every runner made (and not yet collected), with its attributes: the gauges read them.
_runners: weakref.WeakKeyDictionary[Observed, dict[str, str]] = weakref.WeakKeyDictionary()


def register(runner: Observed, db_system: str) -> None:
    """Let the gauges see ``runner`` (called once per runner, instrumented or not)."""
    with _lock:
        _runners[runner] = {"boundeddb.runner": type(runner).__name__, "db.system": db_system}


def active() -> Telemetry | None:
    """The instrumentation in force, if :func:`instrument` was called (read once per call, not per unit)."""
    return _active


def instrument(
    *, meter_provider: MeterProvider | None = None, tracer_provider: TracerProvider | None = None
) -> None:
    """
    Record metrics and traces of every runner's units with OpenTelemetry, from now on.

    Needs ``opentelemetry-api`` (``pip install 'boundeddb[otel]'``); the SDK and exporters are
    yours to set up. Calls made after this one are recorded, on runners old and new; calling it again
    replaces the providers. Without it, the runners record nothing and pay nothing per unit.

    Args:
        meter_provider: Where the metrics go; ``None`` for OpenTelemetry's global provider.
        tracer_provider: Where the spans go; ``None`` for the global provider.

    See :doc:`/how-to/observe` for the metrics, the spans and what each answers.

    .. versionadded:: 0.2.0
    """
    global _active
    telemetry = Telemetry(meter_provider, tracer_provider)
    with _lock:
        _active = telemetry


def uninstrument() -> None:
    """
    Stop recording: calls that start from now on record nothing.

    .. versionadded:: 0.2.0
    """
    global _active
    with _lock:
        _active = None


class Telemetry:
    """The instruments and the tracer of one :func:`instrument` call."""

    def __init__(
        self,
        meter_provider: MeterProvider | None,
        tracer_provider: TracerProvider | None,
        *,
        metrics: bool = True,
    ) -> None:
        from opentelemetry import metrics as otel_metrics
        from opentelemetry import trace

        from . import __version__

        self.metrics = metrics
        meter = (meter_provider or otel_metrics.get_meter_provider()).get_meter("boundeddb", __version__)
        self.tracer = (tracer_provider or trace.get_tracer_provider()).get_tracer("boundeddb", __version__)
        self.duration = meter.create_histogram(
            "boundeddb.unit.duration",
            unit="s",
            description="How long each unit's last attempt ran, from opening its session to closing it",
            explicit_bucket_boundaries_advisory=BUCKETS_S,
        )
        self.wait = meter.create_histogram(
            "boundeddb.unit.wait",
            unit="s",
            description="How long each unit waited for a slot (a connection) of its runner",
            explicit_bucket_boundaries_advisory=BUCKETS_S,
        )
        self.retries = meter.create_counter(
            "boundeddb.unit.retries", unit="{attempt}", description="Attempts of units after their first"
        )
        self.in_flight = meter.create_observable_gauge(
            "boundeddb.units.in_flight",
            callbacks=[self._gauge("in_flight")],
            unit="{unit}",
            description="Units holding a slot (a connection) now",
        )
        self.waiting = meter.create_observable_gauge(
            "boundeddb.units.waiting",
            callbacks=[self._gauge("waiting")],
            unit="{unit}",
            description="Units waiting for a slot now",
        )
        self.limit = meter.create_observable_gauge(
            "boundeddb.limit",
            callbacks=[self._gauge("limit")],
            unit="{unit}",
            description="The runners' limits now (they move with limit='auto')",
        )

    def _gauge(self, field: str) -> Callable[[CallbackOptions], Iterable[Observation]]:
        """A gauge's callback: ``field`` of every live runner's statistics, summed by attributes."""
        from opentelemetry.metrics import Observation

        def observe(_options: CallbackOptions) -> Iterable[Observation]:
            with _lock:
                runners = list(_runners.items())
            totals: dict[tuple[tuple[str, str], ...], int] = {}
            for runner, attributes in runners:
                key = tuple(sorted(attributes.items()))
                totals[key] = totals.get(key, 0) + getattr(runner.statistics(), field)
            return [Observation(value, dict(key)) for key, value in totals.items()]

        return observe

    def call(self, runner: str, db_system: str, *, is_async: bool) -> CallTelemetry:
        """What records the units of one call, their spans children of the span current now."""
        return CallTelemetry(self, runner, db_system, is_async=is_async)


class CallTelemetry:
    """One call's units: a span each (current while the unit runs), and their metrics as they settle."""

    def __init__(self, telemetry: Telemetry, runner: str, db_system: str, *, is_async: bool) -> None:
        from opentelemetry import context

        self._telemetry = telemetry
        self._parent: Context = context.get_current()
        self._is_async = is_async
        self._attributes = {"boundeddb.runner": runner, "db.system": db_system}
        self._spans: dict[int, Span] = {}

    def _span(self, index: int) -> Span:
        span = self._spans.get(index)
        if span is None:
            span = self._spans[index] = self._telemetry.tracer.start_span(
                "boundeddb.unit", self._parent, attributes={**self._attributes, "boundeddb.unit.index": index}
            )
        return span

    def wrap(self, unit: Any, index: int) -> Any:
        """``unit`` with its span current while it runs (so statement spans are its children)."""
        from opentelemetry import trace

        return _Traced(unit, trace.set_span_in_context(self._span(index), self._parent), self._is_async)

    def retried(self) -> None:
        if self._telemetry.metrics:
            self._telemetry.retries.add(1, self._attributes)

    def settled(self, outcome: Outcome[Any], priority: int = 0) -> None:
        """Record ``outcome`` and end its unit's span (from any thread)."""
        from opentelemetry.trace import Status, StatusCode

        telemetry = self._telemetry
        kind = "ok" if outcome.error is None else "commit_unknown" if outcome.commit_unknown else "error"
        if telemetry.metrics:
            telemetry.duration.record(outcome.latency_s, {**self._attributes, "boundeddb.outcome": kind})
            telemetry.wait.record(outcome.wait_s, {**self._attributes, "boundeddb.priority": priority})
        span = self._spans.pop(outcome.index, None) or self._span(outcome.index)
        self._spans.pop(outcome.index, None)
        span.set_attribute("boundeddb.unit.attempts", outcome.attempts)
        span.set_attribute("boundeddb.unit.wait", outcome.wait_s)
        span.set_attribute("boundeddb.commit_unknown", outcome.commit_unknown)
        span.set_attribute("boundeddb.outcome", kind)
        if outcome.error is not None:
            span.record_exception(outcome.error)
            span.set_status(Status(StatusCode.ERROR, type(outcome.error).__qualname__))
        span.end()


class _Traced:
    """A unit whose span is the current one while it runs, in its task or its thread."""

    __slots__ = ("_context", "_is_async", "_unit")

    def __init__(self, unit: Any, context: Context, is_async: bool) -> None:
        self._unit, self._context, self._is_async = unit, context, is_async

    def __call__(self, session: Any) -> Any:
        from opentelemetry import context

        token = context.attach(self._context)
        try:
            result = self._unit(session)
        finally:
            context.detach(token)
        if self._is_async and inspect.isawaitable(result):
            return self._awaited(result)
        return result  # a thread runner's own checks see what the unit returned

    async def _awaited(self, result: Awaitable[Any]) -> Any:
        from opentelemetry import context

        token = context.attach(self._context)
        try:
            return await result
        finally:
            context.detach(token)
