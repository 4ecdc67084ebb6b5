"""
The auto limit's controller: moves a :class:`~.limiter.Limiter`'s limit from what units measure.

Delay-based, in the manner of TCP Vegas and Netflix's concurrency-limits, with the baseline
re-measured as Envoy's adaptive concurrency filter does:

- Units report each attempt (:meth:`LimitController.observe`, :meth:`LimitController.failed`;
  from any thread, cheap: an append under a lock).
- On the event loop, :meth:`LimitController.adjust` closes a *window* once it holds at least
  ``max(MIN_SAMPLES, 2 * limit)`` latencies (or :data:`MAX_WINDOW_S` passed with a few): its mean latency
  ``rtt``, smoothed over windows. With ``base`` the latency measured at low concurrency, Little's
  law gives the units that queue rather than work: ``queue = limit * (1 - base / rtt)``. Below
  ``alpha`` the limit goes up, above ``beta`` down, in between it stays: a band, so the noise of
  mixed units (fast reads, slower writes) does not make it swing.
- A sign of overload (a timeout, a pool timeout, a deadlock or serialization failure) cuts the
  limit by a quarter at once, at most once per window.
- ``base`` is measured in a *probe*: for one window the limit drops to the probe limit (2, within
  the bounds), and the mean latency there becomes ``base``. A probe runs first, and again every
  :data:`PROBE_INTERVAL_S`, so that a database that became slower for everyone raises ``base``
  (it is not overload) and one that became faster lowers it; a smoothed latency below ``base``
  lowers it at once.

The limiter never over-grants while the limit moves (see :meth:`~.limiter.Limiter.set_limit`).
Nothing here imports SQLAlchemy; what counts as overload is the runner's (dialect's) business.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from time import perf_counter

from .limiter import Limiter

__all__ = ["LimitController", "LimitTrace"]

logger = logging.getLogger("boundeddb")

#: Fewest latencies in a window (more: twice the limit); a probe's window takes PROBE_SAMPLES.
MIN_SAMPLES = 16
PROBE_SAMPLES = 32
#: A window closes after this long if it has at least MIN_WINDOW_SAMPLES latencies.
MAX_WINDOW_S = 1.0
MIN_WINDOW_SAMPLES = 3
#: How often the low-concurrency latency is measured again.
PROBE_INTERVAL_S = 10.0
#: Weight of the newest window in the smoothed latency.
SMOOTHING = 0.5
#: Cut on overload: the limit times this.
BACKOFF = 0.75
#: The most (seconds since start, limit) points a trace keeps; then every other point is dropped.
TRACE_POINTS = 512


class LimitTrace:
    """(seconds since start, limit) at each change, bounded: thinned by half when full."""

    __slots__ = ("_points", "_start")

    def __init__(self, limit: int) -> None:
        self._start = perf_counter()
        self._points: list[tuple[float, int]] = [(0.0, limit)]

    def add(self, limit: int) -> None:
        self._points.append((round(perf_counter() - self._start, 4), limit))
        if len(self._points) > TRACE_POINTS:
            last = self._points[-1]
            self._points = self._points[::2]
            if self._points[-1] != last:
                self._points.append(last)

    def since(self, start: float) -> tuple[tuple[float, int], ...]:
        """The limit at ``start`` (a ``perf_counter()`` reading) and each change after it, re-based."""
        offset = start - self._start
        first = self._points[0][1]
        later: list[tuple[float, int]] = []
        for t, n in self._points:
            if t < offset:
                first = n
            else:
                later.append((round(t - offset, 4), n))
        return ((0.0, first), *later)


class LimitController:
    """Moves ``limiter``'s limit within ``[low, high]``; see the module docstring."""

    def __init__(
        self,
        limiter: Limiter,
        *,
        low: int,
        high: int,
        initial: int,
        is_overload: Callable[[Exception], bool] = lambda error: False,
    ) -> None:
        self._limiter = limiter
        self._is_overload = is_overload
        self.low, self.high = low, high
        self._probe_limit = max(low, min(2, high))
        self._lock = threading.Lock()
        self._samples: list[float] = []
        self._overloaded = False
        self._window_start = perf_counter()
        self._rtt: float | None = None
        self._base: float | None = None
        self._target = initial  # where the limit goes back to after a probe
        self._probing = False
        self._probe_skip = -1  # latencies still to drop in a probe; -1 while it drains
        self._next_probe = 0.0  # probe first
        self.trace = LimitTrace(limiter.limit)

    @property
    def base_s(self) -> float | None:
        """The latency measured at low concurrency, if measured."""
        return self._base

    # -- from the units (any thread) ------------------------------------------------------------------

    def observe(self, latency_s: float) -> None:
        """A unit's attempt succeeded after ``latency_s`` seconds."""
        with self._lock:
            self._samples.append(latency_s)

    def failed(self, error: Exception) -> None:
        """An attempt failed with ``error``: note it if it says the database (or pool) is overloaded."""
        if self._is_overload(error):
            self._overloaded = True

    # -- on the event loop ----------------------------------------------------------------------------

    def adjust(self, now: float | None = None) -> None:
        """Close the window if it is full, and move the limit if it should move."""
        now = perf_counter() if now is None else now
        limit = self._limiter.target
        if self._overloaded and not self._probing:
            with self._lock:
                self._overloaded = False
                self._samples = []
            self._window_start = now
            self._set(min(limit - 1, int(limit * BACKOFF)), "overload")
            return
        if not self._probing and now >= self._next_probe:
            self._start_probe(limit)
            return
        if self._probing and self._probe_skip != 0:
            self._drain_probe(now)
            return
        samples = self._samples
        needed = PROBE_SAMPLES if self._probing else max(MIN_SAMPLES, 2 * limit)
        if len(samples) < needed and not (
            now - self._window_start >= MAX_WINDOW_S and len(samples) >= MIN_WINDOW_SAMPLES
        ):
            return
        with self._lock:
            samples, self._samples = self._samples, []
            self._overloaded = False
        self._window_start = now
        mean = sum(samples) / len(samples)
        if self._probing:
            self._end_probe(mean, now)
            return
        rtt = mean if self._rtt is None else SMOOTHING * mean + (1 - SMOOTHING) * self._rtt
        self._rtt = rtt
        base = self._base
        assert base is not None  # measured by the first probe
        if rtt < base:  # faster than at low concurrency: the database got faster
            self._base = base = rtt
        queue = limit * (1.0 - base / rtt) if rtt > 0 else 0.0
        alpha = max(1.0, limit / 8)
        beta = 2 * alpha
        step = max(1, limit // 10)
        if queue < alpha:
            self._set(limit + step, f"queue {queue:.1f} < {alpha:.1f}")
        elif queue > beta:
            self._set(limit - step, f"queue {queue:.1f} > {beta:.1f}")

    def _start_probe(self, limit: int) -> None:
        self._probing = True
        self._probe_skip = -1
        self._target = limit
        self._set(self._probe_limit, "measuring the latency at low concurrency")

    def _drain_probe(self, now: float) -> None:
        """Drop the latencies of units that started above the probe limit; then of those in flight."""
        with self._lock:
            if self._probe_skip < 0:
                if self._limiter.in_flight <= self._probe_limit:
                    self._probe_skip = self._limiter.in_flight
                self._samples = []
            else:
                dropped = min(self._probe_skip, len(self._samples))
                del self._samples[:dropped]
                self._probe_skip -= dropped
        self._window_start = now

    def _end_probe(self, mean: float, now: float) -> None:
        self._probing = False
        self._base = mean
        self._rtt = None
        self._next_probe = now + PROBE_INTERVAL_S
        logger.debug("auto limit: latency at low concurrency %.2f ms", mean * 1e3)
        self._set(self._target, "probe done")

    def _set(self, limit: int, reason: str) -> None:
        """Move the limit to ``limit``, within ``[low, high]``."""
        limit = max(self.low, min(self.high, limit))
        old = self._limiter.target
        if limit == old:
            return
        self._limiter.set_limit(limit)
        self.trace.add(limit)
        logger.debug("auto limit: %d -> %d (%s)", old, limit, reason)
