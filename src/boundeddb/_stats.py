"""RunStats, a frozen dataclass, and the probes that fill it: a pool gauge and a loop-lag ticker."""

from __future__ import annotations

import dataclasses
import math
import threading
import weakref
from array import array
from collections.abc import Sequence
from time import perf_counter
from typing import Any

import anyio
from sqlalchemy import event
from sqlalchemy.pool import Pool, QueuePool

__all__ = ["RunStats"]

#: How often the loop-lag ticker asks to be woken, in seconds.
LOOP_LAG_INTERVAL_S = 0.005


@dataclasses.dataclass(frozen=True, slots=True)
class RunStats:
    """
    Figures for one batch, measured by the runner while it ran.

    Latencies are those of units that started (each unit's last attempt).
    ``peak_connections`` counts connections checked out of the engine's pool,
    observed through the pool's ``checkout``/``checkin`` events during the run;
    it includes connections that other code checked out of the same pool meanwhile.

    .. versionadded:: 0.1.0
    """

    #: Units pulled from the input and started.
    submitted: int
    #: Units that returned and committed.
    succeeded: int
    #: Units that failed and were rolled back.
    failed: int
    #: Wall-clock seconds from the start of the run to its end.
    elapsed_s: float
    #: Finished units (succeeded + failed) per second of ``elapsed_s``.
    throughput: float
    latency_p50_s: float
    latency_p95_s: float
    latency_p99_s: float
    latency_max_s: float
    #: Most units of this run in flight at once.
    peak_in_flight: int
    #: Most connections checked out of the pool at once while the run lasted.
    peak_connections: int
    #: 99th percentile of how late the event loop ran a 5 ms timer during the run
    #: (``None`` where no event loop ran, as in :meth:`~boundeddb.ThreadOffloadRunner.run_sync`).
    loop_lag_p99_s: float | None = None
    #: The worst such lateness.
    loop_lag_max_s: float | None = None
    #: Attempts that failed and were tried again under the runner's retry policy.
    retried: int = 0


def percentile(sorted_values: Sequence[float], fraction: float) -> float:
    """The nearest-rank percentile of already sorted values (0.0 for none)."""
    if not sorted_values:
        return 0.0
    rank = max(1, math.ceil(fraction * len(sorted_values)))
    return sorted_values[rank - 1]


class _PoolGauge:
    """Counts connections checked out of one pool, through its events, for any thread."""

    def __init__(self, pool: Pool) -> None:
        self._lock = threading.Lock()
        self.current = pool.checkedout() if isinstance(pool, QueuePool) else 0
        self._watches: set[_Watch] = set()
        event.listen(pool, "checkout", self._on_checkout)
        event.listen(pool, "checkin", self._on_checkin)

    def _on_checkout(self, *_: Any) -> None:
        with self._lock:
            self.current += 1
            for watch in self._watches:
                watch.peak = max(watch.peak, self.current)

    def _on_checkin(self, *_: Any) -> None:
        with self._lock:
            self.current = max(0, self.current - 1)

    def watch(self) -> _Watch:
        with self._lock:
            watch = _Watch(self, self.current)
            self._watches.add(watch)
            return watch

    def unwatch(self, watch: _Watch) -> None:
        with self._lock:
            self._watches.discard(watch)


class _Watch:
    __slots__ = ("__weakref__", "gauge", "peak")

    def __init__(self, gauge: _PoolGauge, peak: int) -> None:
        self.gauge = gauge
        self.peak = peak


_gauges: weakref.WeakKeyDictionary[Pool, _PoolGauge] = weakref.WeakKeyDictionary()
_gauges_lock = threading.Lock()


def watch_pool(pool: Pool) -> _Watch:
    """Start recording the peak number of connections checked out of ``pool``."""
    with _gauges_lock:
        gauge = _gauges.get(pool)
        if gauge is None:
            gauge = _gauges[pool] = _PoolGauge(pool)
    return gauge.watch()


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


class StatsRecorder:
    """Per-run counters, filled by the runner's per-unit path."""

    __slots__ = (
        "_lock",
        "failed",
        "in_flight",
        "keep_latencies",
        "latencies",
        "loop_lag",
        "peak_in_flight",
        "retried",
        "started",
        "submitted",
        "succeeded",
        "watch",
    )

    def __init__(self, pool: Pool, *, keep_latencies: bool = True) -> None:
        self.submitted = 0
        self.succeeded = 0
        self.failed = 0
        self.retried = 0
        self.in_flight = 0
        self.peak_in_flight = 0
        self.keep_latencies = keep_latencies
        self.latencies: array[float] = array("d")
        self.loop_lag: LoopLag | None = None
        self.watch = watch_pool(pool)
        self.started = perf_counter()
        self._lock = threading.Lock()  # ThreadOffloadRunner's worker threads report here too

    def unit_started(self) -> None:
        with self._lock:
            self.submitted += 1
            self.in_flight += 1
            self.peak_in_flight = max(self.peak_in_flight, self.in_flight)

    def unit_finished(self, ok: bool, latency_s: float, attempts: int) -> None:
        with self._lock:
            self.in_flight -= 1
            self.retried += attempts - 1
            if ok:
                self.succeeded += 1
            else:
                self.failed += 1
            if self.keep_latencies:
                self.latencies.append(latency_s)

    def attempt_paused(self) -> None:
        """A unit gave its slot back to back off before a retry: it is not in flight meanwhile."""
        with self._lock:
            self.in_flight -= 1

    def attempt_resumed(self) -> None:
        with self._lock:
            self.in_flight += 1
            self.peak_in_flight = max(self.peak_in_flight, self.in_flight)

    def close(self) -> None:
        """Stop watching the pool (idempotent; also done by :meth:`finish`)."""
        self.watch.gauge.unwatch(self.watch)

    def finish(self) -> RunStats:
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
            peak_connections=self.watch.peak,
            loop_lag_p99_s=lag_p99,
            loop_lag_max_s=lag_max,
            retried=self.retried,
        )
