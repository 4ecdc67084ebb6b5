"""
Where a run's outcomes go: counted, handed to the sink and the caller's hooks, and what the run
owes its caller at the end. :class:`~boundeddb._core.run.Run` is a :class:`Settling` that pulls.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Generic, TypeVar

from .._errors import RunFailed, UnitMisuseError
from .._outcome import Outcome, RunReport, committed_outcome
from .._stats import RunStats
from .._telemetry import CallTelemetry
from .feedback import OutcomeHook
from .recorder import NullRecorder
from .sinks import Sink

__all__ = ["Settling", "SinkT", "failures_error"]

SinkT = TypeVar("SinkT", bound=Sink)


class Settling(Generic[SinkT]):
    """A run's outcomes: each recorded and delivered as it settles, from any thread."""

    def __init__(
        self,
        sink: SinkT,
        *,
        stop_on_failure: bool,
        recorder: NullRecorder,
        observe: Callable[[float], None] | None,
        on_outcome: Callable[[Outcome[Any]], object] | None,
        telemetry: CallTelemetry | None,
    ) -> None:
        self.sink = sink
        self._put: Callable[[Outcome[Any]], None] = sink.put
        #: A batch's outcomes in one call, where the sink has one and nothing else sees each outcome.
        self._put_many: Callable[[list[Outcome[Any]]], None] | None = getattr(sink, "put_many", None)
        #: The caller's ``on_outcome``, served on the loop. None if not asked, and then nothing per unit.
        self.hook: OutcomeHook | None = None
        if on_outcome is not None:
            self.hook = hook = OutcomeHook(on_outcome, self.stop)
            self._put = _also(self._put, hook.put)
            self._put_many = None
        #: ``boundeddb.instrument()``'s view of this call, or None when not instrumented.
        self.telemetry = telemetry
        if telemetry is not None:  # boundeddb.instrument(): else nothing more per unit
            self._put = _also(self._put, telemetry.settled)
            self._put_many = None
        self.recorder = recorder
        #: With an auto limit: told the latency of each unit that succeeded, from any thread.
        self._observe = observe
        self._stop_on_failure = stop_on_failure
        #: Start no more units: a failure with errors="raise", misuse, a failed input, or cancellation.
        self.stopping = False
        self.misuse: UnitMisuseError | None = None
        #: What the caller's input raised: the run stops, and raises it at the end.
        self.input_error: BaseException | None = None

    def stop(self) -> None:
        """Start no more units. Any thread may call it."""
        self.stopping = True

    def finish(self, outcome: Outcome[Any]) -> None:
        """Record and deliver a unit's outcome, and stop starting units if the run must. From any thread."""
        self.recorder.unit_finished(outcome)
        error = outcome.error
        if error is None:
            if self._observe is not None:
                self._observe(outcome.latency_s)
        elif self._stop_on_failure:
            if isinstance(error, UnitMisuseError) and self.misuse is None:
                self.misuse = error
            self.stopping = True
        self._put(outcome)

    def finish_committed(
        self, group: list[tuple[Any, int]], values: list[Any], latency: float, wait_s: float, attempt: int,
        verified: bool,
    ) -> None:  # fmt: skip
        """:meth:`finish` for each unit of a batch that committed, counted and delivered in one step each."""
        outcomes = [
            committed_outcome(index, value, latency, wait_s, attempt, verified)
            for (_, index), value in zip(group, values, strict=True)
        ]
        self.recorder.units_committed(len(outcomes), latency, wait_s, attempt, verified)
        if (observe := self._observe) is not None:
            for _ in outcomes:
                observe(latency)
        if (put_many := self._put_many) is not None:
            put_many(outcomes)
        else:
            put = self._put
            for outcome in outcomes:
                put(outcome)

    def serve_hook(self) -> None:
        """On the loop, once the units are done: hand the hook what is left, and raise what it raised."""
        if self.hook is not None:
            self.hook.drain()
            if self.hook.error is not None:
                raise self.hook.error

    def raise_for(self, report: RunReport[Any]) -> None:
        """
        Raise what the run owes its caller: misuse, the input's own error, ``on_outcome``'s own
        error, or :class:`RunFailed`.
        """
        if self.misuse is not None:
            raise self.misuse
        if self.input_error is not None:
            raise self.input_error
        if self.hook is not None and self.hook.error is not None:
            raise self.hook.error
        if self._stop_on_failure and (failed := failures_error(report)) is not None:
            raise failed

    def report(self, outcomes: list[Outcome[Any]], stats: RunStats) -> RunReport[Any]:
        report = RunReport(outcomes, stats)
        self.raise_for(report)
        return report


def _also(
    put: Callable[[Outcome[Any]], None], then: Callable[[Outcome[Any]], object]
) -> Callable[[Outcome[Any]], None]:
    """``put``, then ``then``: one more thing done with each outcome."""

    def put_and_then(outcome: Outcome[Any]) -> None:
        put(outcome)
        then(outcome)

    return put_and_then


def failures_error(report: RunReport[Any]) -> RunFailed | None:
    """The :class:`RunFailed` that ``errors="raise"`` owes for ``report``'s failed units, if any failed."""
    failures = [o.error for o in report.outcomes if o.error is not None]
    if not failures:
        return None
    first = next(o for o in report.outcomes if o.error is not None)
    message = (
        f"{len(failures)} of {report.stats.submitted} units failed "
        f"(first: unit {first.index}: {type(first.error).__qualname__}); "
        "the rest committed or were never started"
    )
    return RunFailed(message, failures, report=report)
