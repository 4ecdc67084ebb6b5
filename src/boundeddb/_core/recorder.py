"""What a run measures as it goes: counts, latencies, units in flight, loop lag; and the null recorder."""

from __future__ import annotations

import threading
from array import array
from time import perf_counter
from typing import Any, Protocol

import anyio

from .._outcome import Outcome
from .._stats import RunStats, percentile

__all__ = ["CheckoutPeak", "LoopLag", "NullRecorder", "Recorder"]

#: How often the loop-lag ticker asks to be woken, in seconds.
LOOP_LAG_INTERVAL_S = 0.005


class CheckoutPeak(Protocol):
    """The peak number of connections checked out while a run lasted (the executor layer's gauge)."""

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

    def unit_finished(self, outcome: Outcome[object]) -> None:
        pass

    def attempt_paused(self) -> None:
        pass

    def attempt_resumed(self) -> None:
        pass

    def close(self) -> None:
        pass


class Recorder(NullRecorder):
    """Per-run counters, filled from the per-unit path (worker threads included, hence the lock)."""

    __slots__ = (
        "_lock",
        "checkouts",
        "commits_verified",
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
    )

    def __init__(self, checkouts: CheckoutPeak, *, keep_latencies: bool = True) -> None:
        self.submitted = 0
        self.succeeded = 0
        self.failed = 0
        self.retried = 0
        self.commits_verified = 0
        self.in_flight = 0
        self.peak_in_flight = 0
        self.keep_latencies = keep_latencies
        self.latencies: array[float] = array("d")
        self.loop_lag: LoopLag | None = None
        self.checkouts = checkouts
        self.started = perf_counter()
        self._lock = threading.Lock()

    def unit_started(self) -> None:
        with self._lock:
            self.submitted += 1
            self.in_flight += 1
            if self.in_flight > self.peak_in_flight:
                self.peak_in_flight = self.in_flight

    def unit_finished(self, outcome: Outcome[object]) -> None:
        with self._lock:
            self.in_flight -= 1
            self.retried += max(0, outcome.attempts - 1)
            if outcome.error is None:
                self.succeeded += 1
            else:
                self.failed += 1
            if outcome.commit_verified:
                self.commits_verified += 1
            if self.keep_latencies:
                self.latencies.append(outcome.latency_s)

    def attempt_paused(self) -> None:
        """A unit gave its slot back to back off before a retry: it is not in flight meanwhile."""
        with self._lock:
            self.in_flight -= 1

    def attempt_resumed(self) -> None:
        with self._lock:
            self.in_flight += 1
            if self.in_flight > self.peak_in_flight:
                self.peak_in_flight = self.in_flight

    def close(self) -> None:
        """Stop tracking the pool's checkouts (idempotent; also done by :meth:`finish`)."""
        self.checkouts.close()

    def finish(self, **limits: Any) -> RunStats:
        """The run's figures; ``limits`` are its ``limit_*`` fields (see :class:`~boundeddb.RunStats`)."""
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
            **limits,
        )
