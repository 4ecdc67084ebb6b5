"""
Those who watch a runner's calls, set up once per runner and handed to each call.

They are the runner's own ``on_outcome``, its counters since it was made, and its telemetry.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable, Iterator
from typing import Any

from sqlalchemy.pool import Pool

from .._core.recorder import Recorder, Totals
from .._executors.checkouts import track_peak
from .._outcome import Outcome
from .._progress import both_hooks, check_on_outcome, runner_hook
from .._stats import RunnerStatistics
from .._telemetry import CallTelemetry, Observed, active, labels, register

__all__ = ["Observers"]


class Observers:
    """A runner's ``on_outcome``, its :class:`Totals` and its telemetry attributes, for each of its calls."""

    def __init__(self, runner: Observed, db_system: str, on_outcome: object, *, async_units: bool) -> None:
        #: The attributes of the runner's metrics and spans under ``boundeddb.instrument()``.
        self.labels = labels(type(runner).__name__, db_system)
        #: Called with every unit's outcome, of every call. What it raises is logged, not raised.
        self._hook = runner_hook(check_on_outcome(on_outcome))
        self.totals = Totals()
        self._async_units = async_units
        register(runner, self.labels)

    def for_call(
        self, priority: int, on_outcome: Callable[[Outcome[Any]], object] | None
    ) -> tuple[Callable[[Outcome[Any]], object] | None, CallTelemetry | None]:
        """A call's hook, the runner's then the call's own, and its telemetry if instrumented."""
        telemetry = active()
        if telemetry is not None:
            return both_hooks(self._hook, on_outcome), telemetry.call(
                self.labels, priority=priority, is_async=self._async_units
            )
        return both_hooks(self._hook, on_outcome), None

    @contextlib.contextmanager
    def recording(self, pool: Pool, *, keep_latencies: bool = True) -> Iterator[Recorder]:
        """A run's recorder, counted in the runner's totals while it lasts and after, closed at the end."""
        recorder = Recorder(track_peak(pool), keep_latencies=keep_latencies)
        self.totals.follow(recorder)
        try:
            yield recorder
        finally:
            recorder.close()
            self.totals.merge(recorder)

    def statistics(self, now: RunnerStatistics) -> RunnerStatistics:
        """``now``, the limiter's snapshot, with the runner's counters since it was made."""
        return dataclasses.replace(now, **self.totals.figures())
