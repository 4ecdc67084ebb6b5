"""
The OpenTelemetry instrumentation of every runner's units, off until :func:`instrument` turns it on.

Its metrics and spans are listed in ``docs/how-to/observe.md``.
"""

from __future__ import annotations

import contextlib
import inspect
import threading
import weakref
from collections.abc import Awaitable, Callable, Iterable, Iterator, Mapping
from typing import TYPE_CHECKING, Any, Protocol

from ._outcome import ChunkResult, Outcome

if TYPE_CHECKING:
    from opentelemetry.context import Context
    from opentelemetry.metrics import CallbackOptions, MeterProvider, Observation
    from opentelemetry.trace import Span, TracerProvider

    from ._stats import RunnerStatistics

__all__ = [
    "CallTelemetry",
    "Telemetry",
    "active",
    "attached",
    "instrument",
    "labels",
    "register",
    "uninstrument",
]

#: Bucket boundaries in seconds for unit durations and slot waits: 1 ms to 1 min, roughly x2.5 apart.
BUCKETS_S = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
#: The buckets of ``boundeddb.batch.size``, in units.
BATCH_BUCKETS = (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000)

_lock = threading.Lock()
_active: Telemetry | None = None


def _version() -> str:
    """The installed boundeddb's version, for the instrumentation scope."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("boundeddb")
    except PackageNotFoundError:  # pragma: no cover - a source tree without metadata
        return "0.0.0"


class Observed(Protocol):
    """What the gauges read of a runner."""

    def statistics(self) -> RunnerStatistics: ...


#: Every runner made and not yet collected, with its attributes: the gauges read them.
_runners: weakref.WeakKeyDictionary[Observed, Mapping[str, str]] = weakref.WeakKeyDictionary()


def labels(runner: str, db_system: str) -> dict[str, str]:
    """The attributes of a runner's metrics and spans."""
    return {"boundeddb.runner": runner, "db.system": db_system}


def register(runner: Observed, attributes: Mapping[str, str]) -> None:
    """Let the gauges see ``runner``, once per runner, instrumented or not: it costs nothing per unit."""
    with _lock:
        _runners[runner] = attributes


def active() -> Telemetry | None:
    """The instrumentation in force, if :func:`instrument` was called. Read once per call, not per unit."""
    return _active


def instrument(
    *, meter_provider: MeterProvider | None = None, tracer_provider: TracerProvider | None = None
) -> None:
    """
    Record metrics and traces of every runner's units with OpenTelemetry, from now on.

    Needs ``opentelemetry-api``, from ``pip install 'boundeddb[otel]'``. The SDK and exporters are
    yours to set up. Calls made after this one are recorded, on runners old and new. Calling it again
    replaces the providers. Without it, the runners record nothing and pay nothing per unit.

    Args:
        meter_provider: Where the metrics go. ``None`` for OpenTelemetry's global provider.
        tracer_provider: Where the spans go. ``None`` for the global provider.

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

        self.metrics = metrics
        version = _version()
        if metrics:
            meter = (meter_provider or otel_metrics.get_meter_provider()).get_meter("boundeddb", version)
        else:  # a ProcessRunner's worker: its caller records the metrics
            meter = otel_metrics.NoOpMeter("boundeddb", version)
        self.tracer = (tracer_provider or trace.get_tracer_provider()).get_tracer("boundeddb", version)
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
        self.batch_size = meter.create_histogram(
            "boundeddb.batch.size",
            unit="{unit}",
            description="Units in each batch transaction that committed (batch=)",
            explicit_bucket_boundaries_advisory=BATCH_BUCKETS,
        )
        self.rows = meter.create_counter(
            "boundeddb.load.rows",
            unit="{row}",
            description="Rows that load() committed or rejected, by boundeddb.outcome",
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
                if _active is not self:  # uninstrumented, or instrumented anew: nothing from here
                    return []
                runners = list(_runners.items())
            totals: dict[tuple[tuple[str, str], ...], int] = {}
            for runner, attributes in runners:
                key = tuple(sorted(attributes.items()))
                totals[key] = totals.get(key, 0) + getattr(runner.statistics(), field)
            return [Observation(value, dict(key)) for key, value in totals.items()]

        return observe

    def retried(self, attributes: Mapping[str, str]) -> None:
        """An attempt failed and the unit will run again."""
        if self.metrics:
            self.retries.add(1, attributes)

    def call(
        self, attributes: Mapping[str, str], *, priority: int = 0, is_async: bool, spans: bool = True
    ) -> CallTelemetry:
        """What records the units of one call, their spans children of the span current now."""
        return CallTelemetry(self, attributes, priority=priority, is_async=is_async, spans=spans)

    @staticmethod
    def carrier() -> dict[str, str]:
        """The current context as a W3C trace context, for another process: see :func:`attached`."""
        from opentelemetry import propagate

        carrier: dict[str, str] = {}
        propagate.inject(carrier)
        return carrier


@contextlib.contextmanager
def attached(carrier: Mapping[str, str] | None) -> Iterator[None]:
    """
    In a ProcessRunner's worker: the caller's context, from ``carrier``, is the current one, and the
    runner's units make spans. This process's tracer provider exports them. The metrics are the caller's.
    """
    if carrier is None:
        yield
        return
    global _active
    from opentelemetry import context, propagate

    with _lock:
        if _active is None:
            _active = Telemetry(None, None, metrics=False)
    token = context.attach(propagate.extract(carrier))
    try:
        yield
    finally:
        context.detach(token)


class CallTelemetry:
    """One call's units: a span each, current while the unit runs, and their metrics as they settle."""

    def __init__(
        self,
        telemetry: Telemetry,
        attributes: Mapping[str, str],
        *,
        priority: int,
        is_async: bool,
        spans: bool = True,
    ) -> None:
        from opentelemetry import context

        self._telemetry = telemetry
        self._parent: Context = context.get_current()
        self._is_async = is_async
        self._attributes = attributes
        self._wait_attributes: dict[str, str | int] = {**attributes, "boundeddb.priority": priority}
        self._spans: dict[int, Span] = {}
        #: Whether units get spans here. Not in a ProcessRunner's parent: its workers make them.
        self._traced = spans

    def _start(self, index: int, parent: Context | None = None) -> Span:
        span = self._spans[index] = self._telemetry.tracer.start_span(
            "boundeddb.unit",
            self._parent if parent is None else parent,
            attributes={**self._attributes, "boundeddb.unit.index": index},
        )
        return span

    def wrap(self, unit: Any, index: int, parent: Context | None = None) -> Any:
        """``unit`` with its span current while it runs, so that statement spans are its children."""
        from opentelemetry import trace

        span = self._start(index, parent)
        return _Traced(unit, trace.set_span_in_context(span, self._parent), self._is_async)

    def open_batch(self, batch: list[tuple[Any, int]]) -> tuple[Span, list[tuple[Any, int]]]:
        """A ``boundeddb.batch`` span for ``batch``, and its units wrapped in spans that are its children."""
        from opentelemetry import trace

        span = self._telemetry.tracer.start_span(
            "boundeddb.batch",
            self._parent,
            attributes={**self._attributes, "boundeddb.batch.size": len(batch)},
        )
        inside = trace.set_span_in_context(span, self._parent)
        return span, [(self.wrap(unit, index, inside), index) for unit, index in batch]

    def batch_committed(self, units: int) -> None:
        """A batch transaction of ``units`` units committed."""
        if self._telemetry.metrics:
            self._telemetry.batch_size.record(units, self._attributes)

    def settled(self, outcome: Outcome[Any]) -> None:
        """Record ``outcome`` and end its unit's span, from any thread."""
        from opentelemetry.trace import Status, StatusCode

        telemetry = self._telemetry
        error = outcome.error
        if error is not None:
            kind = "commit_unknown" if outcome.commit_unknown else "error"
        else:
            kind = "skipped" if outcome.skipped else "ok"
        rows = outcome.value if isinstance(outcome.value, ChunkResult) else None
        if telemetry.metrics:
            telemetry.duration.record(outcome.latency_s, {**self._attributes, "boundeddb.outcome": kind})
            telemetry.wait.record(outcome.wait_s, self._wait_attributes)
            if rows is not None:
                telemetry.rows.add(rows.loaded, {**self._attributes, "boundeddb.outcome": "loaded"})
                telemetry.rows.add(len(rows.rejected), {**self._attributes, "boundeddb.outcome": "rejected"})
        if not self._traced:
            if outcome.attempts > 1 and telemetry.metrics:  # its retries were in another process
                telemetry.retries.add(outcome.attempts - 1, self._attributes)
            return
        span = self._spans.pop(outcome.index, None)
        if span is None:  # settled before it ran: refused
            span = self._start(outcome.index)
            del self._spans[outcome.index]
        span.set_attributes(
            {
                "boundeddb.unit.attempts": outcome.attempts,
                "boundeddb.unit.wait": outcome.wait_s,
                "boundeddb.commit_unknown": outcome.commit_unknown,
                "boundeddb.outcome": kind,
            }
        )
        if rows is not None:  # a load() chunk's transaction
            span.set_attributes(
                {"boundeddb.load.rows": rows.loaded, "boundeddb.load.rejected": len(rows.rejected)}
            )
        if error is not None:
            span.record_exception(error)
            span.set_status(Status(StatusCode.ERROR, type(error).__qualname__))
        span.end()


class _Traced:
    """A unit whose span is the current one while it runs, in its task or its thread."""

    __slots__ = ("_context", "_is_async", "_unit")

    def __init__(self, unit: Any, context: Context, is_async: bool) -> None:
        self._unit, self._context, self._is_async = unit, context, is_async

    def __getattr__(self, name: str) -> Any:
        # What the executor asks of the unit it wraps: a journalled unit's probe of a lost COMMIT.
        if name in ("probe_async", "probe_sync"):
            return getattr(self._unit, name)
        raise AttributeError(name)

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
