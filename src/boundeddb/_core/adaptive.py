"""
The auto limit's controller: moves a :class:`~.limiter.Limiter`'s limit from what units measure.

Delay-based, in the manner of TCP Vegas and Netflix's concurrency-limits, with the baseline
re-measured as Envoy's adaptive concurrency filter does:

- Units report each attempt (:meth:`LimitController.observe`, :meth:`LimitController.failed`;
  from any thread, cheap: an append under a lock).
- On the event loop, :meth:`LimitController.adjust` closes a *window* once it holds at least
  ``max(MIN_SAMPLES, 2 * limit)`` latencies (or :data:`MAX_WINDOW_S` passed with a few): its mean
  latency ``rtt``, smoothed over windows, is compared with ``base``, the latency measured at low
  concurrency.  While ``rtt < 2 * base`` the limit goes up (by half while ``rtt < 1.5 * base``,
  else by a tenth), above ``2.5 * base`` it goes down by a tenth, and in between it holds:
  a band, so the noise of mixed units (fast reads, slower writes) does not make it swing.
  In the terms of TCP Vegas, the limit rises while fewer than half the units in flight queue
  (Little's law: ``queue = limit * (1 - base / rtt)``) and falls when more than 60% do.
  The band is wide on purpose: on a client or server that is busy but not saturated, latency
  rises well before throughput stops rising, and a tight band (Vegas's few units of queue) gives
  away throughput that a user who asks for "auto" expects (see the auto-limit how-to).
- A sign of overload (a timeout, a pool timeout, a deadlock or serialization failure) cuts the
  limit by a quarter at once, at most once per window.
- ``base`` is measured in a *probe*: for one window the limit drops to the probe limit (a quarter
  of the limit, at least 2, within the bounds), and the mean latency there becomes ``base``.  A
  quarter, not 1 or 2: it is low enough that units queue for little (the limit holds where
  latency is at least twice ``base``), and at a large limit the probe costs less.  Until the first probe,
  :data:`FIRST_PROBE_S` after the first window, that window's latency at the initial limit is
  ``base`` (so units that only wait climb from the start); then a probe runs every
  :data:`PROBE_INTERVAL_S`, so that a database that became slower for everyone raises ``base``
  (it is not overload) and one that became faster lowers it; it waits while the limit is at its
  ceiling with latency below the band (it could not move the limit up, and it costs units that
  mostly wait the most).  A probe also starts at once when a
  window's latency falls below ``0.75 * base`` (the database got faster: without it, the stale
  ``base`` would let the limit climb to the ceiling) or stays above ``2.5 * base`` at the probe
  limit itself (the database got slower for everyone: no lower limit can help).

The limiter never over-grants while the limit moves (see :meth:`~.limiter.Limiter.set_limit`).
Nothing here imports SQLAlchemy; what counts as overload is the runner's (dialect's) business.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from time import perf_counter
from typing import Any

from .limiter import Limiter

__all__ = ["LimitController", "LimitTrace", "limit_figures"]

logger = logging.getLogger("boundeddb")

#: Fewest latencies in a window (more: twice the limit); a probe's window takes PROBE_SAMPLES.
MIN_SAMPLES = 16
PROBE_SAMPLES = 32
#: A window closes after this long if it has at least MIN_WINDOW_SAMPLES latencies.
MAX_WINDOW_S = 1.0
MIN_WINDOW_SAMPLES = 3
#: The lowest probe limit (a probe runs at a quarter of the limit, at least this).
PROBE_LIMIT = 2
#: How often the low-concurrency latency is measured again.
PROBE_INTERVAL_S = 10.0
#: The first probe, this long after the first window (whose latency, at the initial limit, is the
#: base until then): a run that starts with units that only wait climbs at once.
FIRST_PROBE_S = 2.0
#: Weight of the newest window in the smoothed latency.
SMOOTHING = 0.5
#: Latency (smoothed) over the low-concurrency latency: below RISE the limit goes up (by half below
#: FAST_RISE, else by a tenth), above FALL it goes down by a tenth, in between it holds.
RISE, FAST_RISE, FALL = 2.0, 1.5, 2.5
#: A window's mean latency below this times the base one starts a probe at once (a faster database).
FASTER = 0.75
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
        self._probe_limit = self._probe_at(initial)
        self._lock = threading.Lock()
        self._samples: list[float] = []
        self._overloaded = False
        self._window_start = perf_counter()
        self._rtt: float | None = None
        self._base: float | None = None
        self._target = initial  # where the limit goes back to after a probe
        self._probing = False
        self._draining = False  # a probe waits for the units in flight to fall to its limit
        self._skip = 0  # latencies to drop before the next window: of units that started before a change
        self._at_ease = False  # at the ceiling and below the band: the periodic probe waits
        self._next_probe = float("inf")  # the first window sets it
        self.trace = LimitTrace(limiter.limit)

    @property
    def base_s(self) -> float | None:
        """The latency measured at low concurrency, if measured."""
        return self._base

    @property
    def probing(self) -> bool:
        """Whether the limit is down at the probe limit, measuring the base latency."""
        return self._probing

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
        if not self._probing and now >= self._next_probe and not self._at_ease:
            self._start_probe(limit)
            return
        if self._draining or self._skip:
            self._drop_old_samples(now)
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
        base = self._base
        if base is None:  # the first window: a first base, at the initial limit; a probe follows
            self._base = self._rtt = mean
            self._next_probe = now + FIRST_PROBE_S
            return
        rtt = mean if self._rtt is None else SMOOTHING * mean + (1 - SMOOTHING) * self._rtt
        self._rtt = rtt
        ratio = rtt / base if base > 0 else 1.0
        if mean < FASTER * base or (ratio > FALL and limit <= self._probe_limit):
            # Faster than at low concurrency, or slow at the concurrency base was measured at:
            # the database changed for everyone (a neighbour came or went). Measure again now.
            self._start_probe(limit, "the latency at low concurrency changed")
            return
        if rtt < base:
            self._base = base = rtt
        # At the ceiling with latency below the band, a probe could only move the limit up (which
        # it cannot): it waits until latency rises (a slower database) or falls (see above).
        self._at_ease = limit >= self.high and ratio < RISE
        if ratio < RISE:
            step = max(1, limit // (2 if ratio < FAST_RISE else 10))
            self._move(limit + step, f"latency {ratio:.2f}x the low-concurrency latency < {RISE}x")
        elif ratio > FALL:
            self._move(
                limit - max(1, limit // 10), f"latency {ratio:.2f}x the low-concurrency latency > {FALL}x"
            )

    def _move(self, limit: int, reason: str) -> None:
        """Move the limit; the next window leaves out the units in flight now (they ran at the old one)."""
        if self._set(limit, reason):
            self._skip = self._limiter.in_flight

    def _drop_old_samples(self, now: float) -> None:
        """
        Drop latencies of units that started before the limit changed: all of them while a probe
        drains (until no more than the probe limit are in flight), then those of the units still
        in flight (the first ones to finish).
        """
        with self._lock:
            if self._draining:
                self._samples = []
                if self._limiter.in_flight <= self._probe_limit:
                    self._draining = False
                    self._skip = self._limiter.in_flight
            else:
                dropped = min(self._skip, len(self._samples))
                del self._samples[:dropped]
                self._skip -= dropped
        self._window_start = now

    def _probe_at(self, limit: int) -> int:
        """The probe limit: a quarter of the limit, at least 2, within the bounds."""
        return max(self.low, min(self.high, max(PROBE_LIMIT, limit // 4)))

    def _start_probe(self, limit: int, why: str = "due") -> None:
        self._probing = True
        self._draining = True
        self._skip = 0
        self._target = limit
        self._probe_limit = self._probe_at(limit)
        self._set(self._probe_limit, f"measuring the latency at low concurrency: {why}")

    def _end_probe(self, mean: float, now: float) -> None:
        self._probing = False
        self._base = mean
        self._rtt = None
        self._next_probe = now + PROBE_INTERVAL_S
        logger.debug("auto limit: latency at low concurrency %.2f ms", mean * 1e3)
        self._set(self._target, "probe done")

    def _set(self, limit: int, reason: str) -> bool:
        """Move the limit to ``limit``, within ``[low, high]``; whether it moved."""
        limit = max(self.low, min(self.high, limit))
        old = self._limiter.target
        if limit == old:
            return False
        self._limiter.set_limit(limit)
        self.trace.add(limit)
        logger.debug("auto limit: %d -> %d (%s)", old, limit, reason)
        return True


def limit_figures(limiter: Limiter, controller: LimitController | None, started: float) -> dict[str, Any]:
    """The ``limit_*`` fields of the RunStats of a run that started at ``started`` (``perf_counter()``)."""
    if controller is None:
        limit = limiter.limit
        return {"limit_min": limit, "limit_max": limit, "limit_final": limit, "limit_trace": ((0.0, limit),)}
    trace = controller.trace.since(started)
    values = [n for _, n in trace]
    return {
        "limit_min": min(values),
        "limit_max": max(values),
        "limit_final": limiter.limit,
        "limit_trace": trace,
    }
