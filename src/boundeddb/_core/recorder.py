"""
The recorders of a run's figures, from which :class:`~boundeddb.RunStats` is made.

A :class:`Recorder` counts units, latencies and units in flight as the run goes, beside the loop-lag
ticker. :class:`NullRecorder` records nothing, and :class:`Totals` adds up a runner's runs.
"""

from __future__ import annotations

import threading
from array import array
from time import perf_counter
from typing import Any, Protocol

import anyio

from .._outcome import Outcome
from .._stats import RunStats, percentile

__all__ = ["CheckoutPeak", "LoopLag", "NullRecorder", "Recorder", "Totals"]

#: How often the loop-lag ticker asks to be woken, in seconds.
LOOP_LAG_INTERVAL_S = 0.005


class CheckoutPeak(Protocol):
    """The executor layer's gauge: the peak number of connections checked out while a run lasted."""

    @property
    def peak(self) -> int: ...

    def close(self) -> None: ...


class LoopLag:
    """A ticker task that records how late the event loop wakes it."""

    def __init__(self) -> None:
        self.lags: array[float] = array("d")

    async def tick_forever(self) -> None:
        interval = LOOP_LAG_INTERVAL_S
        while True:
            start = perf_counter()
            await anyio.sleep(interval)
            self.lags.append(max(0.0, perf_counter() - start - interval))

    def summary(self) -> tuple[float | None, float | None]:
        if not self.lags:
            return None, None
        ordered = sorted(self.lags)
        return percentile(ordered, 0.99), ordered[-1]


class NullRecorder:
    """Records nothing: for :meth:`submit`, which returns a value, not stats."""

    __slots__ = ()

    loop_lag: LoopLag | None = None

    def unit_started(self) -> None:
        pass

    def units_started(self, n: int) -> None:
        pass

    def units_committed(self, n: int, latency_s: float, wait_s: float, attempt: int, verified: bool) -> None:
        pass

    def unit_finished(self, outcome: Outcome[object]) -> None:
        pass

    def unit_skipped(self) -> None:
        pass

    def attempt_paused(self) -> None:
        pass

    def attempt_resumed(self) -> None:
        pass

    def batch_committed(self) -> None:
        pass

    def rerun(self, units: int) -> None:
        pass

    def close(self) -> None:
        pass


class Recorder(NullRecorder):
    """Per-run counters, filled from the per-unit path. Worker threads fill them too, hence the lock."""

    __slots__ = (
        "_lock",
        "batches_committed",
        "checkouts",
        "commit_unknown",
        "commits_verified",
        "failed",
        "in_flight",
        "keep_latencies",
        "latencies",
        "loop_lag",
        "peak_in_flight",
        "retried",
        "rows_loaded",
        "rows_rejected",
        "skipped",
        "started",
        "submitted",
        "succeeded",
        "units_rerun",
        "wait_s",
    )

    def __init__(self, checkouts: CheckoutPeak, *, keep_latencies: bool = True) -> None:
        self.submitted = 0
        self.succeeded = 0
        self.failed = 0
        self.retried = 0
        self.commits_verified = 0
        self.commit_unknown = 0
        self.batches_committed = 0
        self.units_rerun = 0
        self.skipped = 0
        self.rows_loaded = 0
        self.rows_rejected = 0
        self.wait_s = 0.0
        self.in_flight = 0
        self.peak_in_flight = 0
        self.keep_latencies = keep_latencies
        self.latencies: array[float] = array("d")
        self.loop_lag: LoopLag | None = None
        self.checkouts = checkouts
        self.started = perf_counter()
        self._lock = threading.Lock()

    def rows_written(self, loaded: int, rejected: int) -> None:
        """A ``load()`` chunk committed ``loaded`` rows and rejected ``rejected``."""
        with self._lock:
            self.rows_loaded += loaded
            self.rows_rejected += rejected

    def unit_started(self) -> None:
        with self._lock:
            self.submitted += 1
            self.in_flight += 1
            if self.in_flight > self.peak_in_flight:
                self.peak_in_flight = self.in_flight

    def units_started(self, n: int) -> None:
        """``n`` units of a batch started: :meth:`unit_started` ``n`` times, in one step."""
        with self._lock:
            self.submitted += n
            self.in_flight += n
            if self.in_flight > self.peak_in_flight:
                self.peak_in_flight = self.in_flight

    def units_committed(self, n: int, latency_s: float, wait_s: float, attempt: int, verified: bool) -> None:
        """
        A batch of ``n`` units committed, each with these figures: :meth:`batch_committed` and
        :meth:`unit_finished` for each of its outcomes, in one step.
        """
        with self._lock:
            self.batches_committed += 1
            self.in_flight -= n
            self.retried += n * max(0, attempt - 1)
            self.wait_s += n * wait_s
            self.succeeded += n
            if verified:
                self.commits_verified += n
            if self.keep_latencies:
                self.latencies.extend(array("d", (latency_s,)) * n)

    def unit_finished(self, outcome: Outcome[object]) -> None:
        with self._lock:
            self.in_flight -= 1
            self.retried += max(0, outcome.attempts - 1)
            self.wait_s += outcome.wait_s
            if outcome.error is None:
                self.succeeded += 1
            else:
                self.failed += 1
                if outcome.commit_unknown:
                    self.commit_unknown += 1
            if outcome.commit_verified:
                self.commits_verified += 1
            if self.keep_latencies:
                self.latencies.append(outcome.latency_s)

    def unit_skipped(self) -> None:
        """A journalled item was done already: it is settled without running."""
        with self._lock:
            self.skipped += 1

    def attempt_paused(self) -> None:
        """A unit gave its slot back to back off before a retry: it is not in flight meanwhile."""
        with self._lock:
            self.in_flight -= 1

    def attempt_resumed(self) -> None:
        with self._lock:
            self.in_flight += 1
            if self.in_flight > self.peak_in_flight:
                self.peak_in_flight = self.in_flight

    def batch_committed(self) -> None:
        """A ``batch=`` transaction committed."""
        with self._lock:
            self.batches_committed += 1

    def rerun(self, units: int) -> None:
        """``units`` that ran in a batch that was rolled back will run again."""
        with self._lock:
            self.units_rerun += units

    def close(self) -> None:
        """Stop tracking the pool's checkouts. Idempotent: :meth:`finish` does it too."""
        self.checkouts.close()

    def finish(self, **limits: Any) -> RunStats:
        """The run's figures. ``limits`` are its ``limit_*`` fields of :class:`~boundeddb.RunStats`."""
        elapsed = perf_counter() - self.started
        self.close()
        ordered = sorted(self.latencies)
        lag_p99, lag_max = self.loop_lag.summary() if self.loop_lag else (None, None)
        finished = self.succeeded + self.failed
        return RunStats(
            submitted=self.submitted,
            succeeded=self.succeeded,
            failed=self.failed,
            elapsed_s=elapsed,
            throughput=finished / elapsed if elapsed > 0 else 0.0,
            latency_p50_s=percentile(ordered, 0.50),
            latency_p95_s=percentile(ordered, 0.95),
            latency_p99_s=percentile(ordered, 0.99),
            latency_max_s=ordered[-1] if ordered else 0.0,
            peak_in_flight=self.peak_in_flight,
            peak_connections=self.checkouts.peak,
            loop_lag_p99_s=lag_p99,
            loop_lag_max_s=lag_max,
            retried=self.retried,
            commits_verified=self.commits_verified,
            batches_committed=self.batches_committed,
            units_rerun=self.units_rerun,
            skipped=self.skipped,
            **limits,
        )


#: What :class:`Totals` counts: a :class:`Recorder`'s fields of the same names.
_COUNTED = (
    "succeeded",
    "failed",
    "commit_unknown",
    "retried",
    "wait_s",
    "batches_committed",
    "units_rerun",
    "skipped",
    "rows_loaded",
    "rows_rejected",
)


class Totals:
    """A runner's counters since it was made: its finished runs' and submits', and its live runs'."""

    __slots__ = ("_counts", "_live", "_lock")

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._live: set[Recorder] = set()
        self._counts: list[float] = [0] * len(_COUNTED)

    def follow(self, recorder: Recorder) -> None:
        """Count ``recorder``'s run while it lasts, until :meth:`merge`."""
        with self._lock:
            self._live.add(recorder)

    def merge(self, recorder: Recorder) -> None:
        """A run is over: keep its counts, stop following it."""
        with self._lock, recorder._lock:
            self._live.discard(recorder)
            self._add([getattr(recorder, name) for name in _COUNTED])

    def add(self, outcome: Outcome[object]) -> None:
        """One unit settled outside any recorded run: by ``submit()``, or a ProcessRunner's."""
        failed = outcome.error is not None
        with self._lock:
            if outcome.skipped:
                self._counts[_COUNTED.index("skipped")] += 1
                return
            self._add(
                [not failed, failed, outcome.commit_unknown, max(0, outcome.attempts - 1), outcome.wait_s]
            )

    def add_batches(self, committed: int, rerun: int) -> None:
        """Batches committed and units run again outside any recorded run, by a ProcessRunner's worker."""
        with self._lock:
            self._counts[_COUNTED.index("batches_committed")] += committed
            self._counts[_COUNTED.index("units_rerun")] += rerun

    def _add(self, counts: list[Any]) -> None:
        for position, count in enumerate(counts):
            self._counts[position] += count

    def figures(self) -> dict[str, Any]:
        """The :class:`~boundeddb.RunnerStatistics` counter fields, live runs included."""
        with self._lock:
            figures = list(self._counts)
            for recorder in self._live:
                with recorder._lock:
                    for position, name in enumerate(_COUNTED):
                        figures[position] += getattr(recorder, name)
        names = (
            "succeeded",
            "failed",
            "commit_unknown",
            "retried",
            "slot_wait_s",
            "batches_committed",
            "units_rerun",
            "skipped",
            "rows_loaded",
            "rows_rejected",
        )
        return {
            name: figure if name == "slot_wait_s" else int(figure)
            for name, figure in zip(names, figures, strict=True)
        }
