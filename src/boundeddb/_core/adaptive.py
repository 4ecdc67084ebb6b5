"""
The auto limit's controller: moves a :class:`~.limiter.Limiter`'s limit from what units measure.

Delay-based, in the manner of TCP Vegas and Netflix's concurrency-limits, with the baseline
re-measured as Envoy's adaptive concurrency filter does:

- Units report each attempt (:meth:`LimitController.observe`, :meth:`LimitController.failed`;
  from any thread, cheap: two appends under a lock). With each latency goes the number of units
  in flight when the unit finished (itself included).
- On the event loop, :meth:`LimitController.adjust` closes a *window* once it holds at least
  ``max(MIN_SAMPLES, 2 * limit)`` latencies and :data:`MIN_WINDOW_S` passed (or
  :data:`MAX_WINDOW_S` passed with a few): its mean latency ``rtt`` is compared with ``base``, the
  latency measured at low concurrency. Windows at one limit are smoothed together; a change of the
  limit starts afresh (a window never mixes latencies of two limits, nor of the units that were in
  flight when it changed).
- While ``rtt < 2 * base`` the limit goes up, but only if the window *filled* it (units in flight
  reached the limit): a limit that is not used says nothing about a higher one. It doubles while
  ``rtt < 1.25 * base`` (slow start: nothing queues yet), else it goes up by a tenth; once it has
  fallen, by 1 (additive increase). Above ``2.5 * base`` it falls: the first time straight to where
  latency should be in the middle of the band (``limit * 2.25 * base / rtt``, at most by half),
  then by a tenth. In between it holds: a band, so the noise of mixed units (fast reads, slower
  writes) does not make it swing. In the terms of TCP Vegas, the limit rises while fewer than half
  the units in flight queue (Little's law: ``queue = limit * (1 - base / rtt)``) and falls when
  more than 60% do. The band is wide on purpose: on a client or server that is busy but not
  saturated, latency rises well before throughput stops rising, and a tight band (Vegas's few
  units of queue) gives away throughput that a user who asks for "auto" expects.
- A fall must not cost throughput: each window's throughput by Little's law (mean units in
  flight / mean latency) is kept per limit for :data:`THROUGHPUT_MEMORY_S`; a fall is taken only
  if a limit at or below the new one (but above half of it) was measured at no less than
  ``1 - FALL_COST`` of the throughput now, or none was. Units that mostly wait on a loaded client see latency
  grow while throughput still grows: the limit stays up. A probe that finds the base latency
  changed by more than :data:`CHANGED` forgets the throughputs measured before (a neighbour came
  or went: they were another database's).
- A sign of overload (a timeout, a pool timeout, a deadlock or serialization failure) cuts the
  limit by a quarter at once, at most once per window.
- ``base`` is measured in a *probe*: for one window the limit drops to the probe limit (a quarter
  of the limit, at least 2, within the bounds), and the mean latency there becomes ``base``.
  Until the first probe, :data:`FIRST_PROBE_S` into the first run, that run's first window (at the
  initial limit, where the climb starts at once) stands in; then a probe runs every
  :data:`PROBE_INTERVAL_S`, so that a database that became slower for everyone raises ``base`` (it
  is not overload) and one that became faster lowers it. No probe runs while the limit is at its
  ceiling: it could not move the limit up, and it costs units that mostly wait the most (a faster
  database there lowers ``base`` directly).
  A probe also starts at once when :data:`FASTER_WINDOWS` windows in a row have a latency below
  ``0.75 * base`` (the database got faster: without it, the stale ``base`` would let the limit
  climb to the ceiling), or when the latency stays above ``2.5 * base`` at the probe limit itself
  (the database got slower for everyone: no lower limit can help).

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
MIN_SAMPLES = 32
PROBE_SAMPLES = 32
#: A window lasts at least this long (seconds): fewer, steadier decisions on fast units.
MIN_WINDOW_S = 0.1
#: A window closes after this long if it has at least MIN_WINDOW_SAMPLES latencies.
MAX_WINDOW_S = 1.0
MIN_WINDOW_SAMPLES = 3
#: The lowest probe limit (a probe runs at a quarter of the limit, at least this).
PROBE_LIMIT = 2
#: How often the low-concurrency latency is measured again.
PROBE_INTERVAL_S = 10.0
#: The first probe, this long after the first run's first units (whose latency, at the initial
#: limit, is the base until then).
FIRST_PROBE_S = 1.0
#: Weight of the newest window in the latency smoothed over windows at one limit.
SMOOTHING = 0.5
#: Latency over the low-concurrency latency: below SLOW_START the limit doubles (until it first
#: falls), below RISE it goes up (by a tenth; by 1 once it has fallen), above FALL it goes down;
#: the first fall aims at TARGET.
SLOW_START, RISE, TARGET, FALL = 1.25, 2.0, 2.25, 2.5
#: Windows in a row whose mean latency is below FASTER times the base: a probe (a faster database).
FASTER, FASTER_WINDOWS = 0.75, 2
#: Cut on overload: the limit times this.
BACKOFF = 0.75
#: A fall is taken only if a limit at or below the new one gave at least 1 - FALL_COST of the
#: throughput now, as measured in the last THROUGHPUT_MEMORY_S seconds (or none was measured).
FALL_COST = 0.05
THROUGHPUT_MEMORY_S = PROBE_INTERVAL_S
#: A probe whose latency is more than this factor off the base before forgets those throughputs.
CHANGED = 1.25
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
        #: The window's latencies, and the units in flight as each finished (itself included).
        self._samples: list[float] = []
        self._loads: list[int] = []
        self._overloaded = False
        self._window_start: float | None = None  # the first look at the controller starts the first window
        self._rtt: float | None = None  # smoothed over the windows since the limit last changed
        self._base: float | None = None
        self._target = initial  # where the limit goes back to after a probe
        self._probing = False
        self._draining = False  # a probe waits for the units in flight to fall to its limit
        self._skip = 0  # latencies to drop before the next window: of units that started before a change
        self._fallen = False  # once the limit has fallen, it climbs by 1 at a time
        self._faster = 0  # windows in a row well below the base latency
        #: Little's-law throughput (units/s) last measured at each limit, and when.
        self._throughput: dict[int, tuple[float, float]] = {}
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
        """A unit's attempt succeeded after ``latency_s`` seconds (called while it holds its slot)."""
        in_flight = self._limiter.in_flight
        with self._lock:
            self._samples.append(latency_s)
            self._loads.append(in_flight)

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
            self._take_window(now)
            self._overloaded = False
            self._fallen = True
            self._set(min(limit - 1, int(limit * BACKOFF)), "overload")
            return
        if not self._probing and now >= self._next_probe and limit < self.high:
            self._start_probe(limit)
            return
        if self._draining or self._skip:
            self._drop_old_samples(now)
            return
        count = len(self._samples)
        if self._window_start is None or (self._base is None and not count):
            self._window_start = now  # idle before the first run: that time is no window's
            return
        elapsed = now - self._window_start
        needed = PROBE_SAMPLES if self._probing else max(MIN_SAMPLES, 2 * limit)
        if not (
            (count >= needed and elapsed >= MIN_WINDOW_S)
            or (elapsed >= MAX_WINDOW_S and count >= MIN_WINDOW_SAMPLES)
        ):
            return
        started = self._window_start
        samples, loads = self._take_window(now)
        mean = sum(samples) / len(samples)
        throughput = sum(loads) / len(loads) / mean if mean > 0 else 0.0
        self._throughput[limit] = (throughput, now)
        if self._probing:
            self._end_probe(mean, now)
            return
        base = self._base
        if base is None:  # the first window: a first base, at the initial limit; a probe follows
            self._base = base = mean
            self._next_probe = started + FIRST_PROBE_S
        rtt = mean if self._rtt is None else SMOOTHING * mean + (1 - SMOOTHING) * self._rtt
        self._rtt = rtt
        ratio = rtt / base if base > 0 else 1.0
        if mean < FASTER * base:  # faster than at low concurrency: the database got faster?
            self._faster += 1
            if self._faster < FASTER_WINDOWS:
                return  # one window is no evidence: hold, and see the next
            if limit >= self.high:  # no probe at the ceiling: take the new base as it is
                self._base = rtt
                return
        else:
            self._faster = 0
        if limit < self.high and (self._faster or (ratio > FALL and limit <= self._probe_limit)):
            # Faster than at low concurrency, or slow at the concurrency base was measured at:
            # the database changed for everyone (a neighbour came or went). Measure again now.
            self._start_probe(limit, "the latency at low concurrency changed")
            return
        if rtt < base:
            self._base = base = rtt
        why = f"latency {ratio:.2f}x the low-concurrency latency"
        if ratio < RISE:
            if max(loads) >= limit - self._limiter.reserve:  # the window filled the limit
                # additive once it has fallen; before, doubling while nothing queues, else a tenth
                step = 1 if self._fallen else limit if ratio < SLOW_START else max(1, limit // 10)
                self._move(limit + step, f"{why} < {RISE}x")
        elif ratio > FALL:
            if self._fallen:
                lower = limit - max(1, limit // 10)
            else:  # straight to the middle of the band, at most by half
                lower = max(limit // 2, int(limit * TARGET / ratio))
            lower = max(self.low, min(lower, limit - 1))
            if lower >= limit:
                return
            if self._costs_throughput(lower, throughput, now):
                logger.debug("auto limit: holds at %d (%s; a lower limit gave less throughput)", limit, why)
                return
            self._fallen = True
            self._move(lower, f"{why} > {FALL}x")

    def _take_window(self, now: float) -> tuple[list[float], list[int]]:
        """The window's latencies and loads; a new window starts at ``now``."""
        with self._lock:
            samples, self._samples = self._samples, []
            loads, self._loads = self._loads, []
        self._window_start = now
        return samples, loads

    def _costs_throughput(self, lower: int, throughput: float, now: float) -> bool:
        """
        Whether the limits in ``(lower / 2, lower]`` measured lately all gave under 1 - FALL_COST of
        ``throughput`` (a limit far below says little about ``lower``: throughput grows with it).
        """
        known = [
            seen
            for limit, (seen, when) in self._throughput.items()
            if lower / 2 < limit <= lower and now - when <= THROUGHPUT_MEMORY_S
        ]
        return bool(known) and max(known) < (1 - FALL_COST) * throughput

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
                self._samples, self._loads = [], []
                if self._limiter.in_flight <= self._probe_limit:
                    self._draining = False
                    self._skip = self._limiter.in_flight
            else:
                dropped = min(self._skip, len(self._samples))
                del self._samples[:dropped]
                del self._loads[:dropped]
                self._skip -= dropped
        self._window_start = now

    def _probe_at(self, limit: int) -> int:
        """The probe limit: a quarter of the limit, at least 2, within the bounds."""
        return max(self.low, min(self.high, max(PROBE_LIMIT, limit // 4)))

    def _start_probe(self, limit: int, why: str = "due") -> None:
        self._probing = True
        self._draining = True
        self._skip = 0
        self._faster = 0
        self._target = limit
        self._probe_limit = self._probe_at(limit)
        self._set(self._probe_limit, f"measuring the latency at low concurrency: {why}")

    def _end_probe(self, mean: float, now: float) -> None:
        self._probing = False
        old = self._base
        if old is not None and not old / CHANGED <= mean <= old * CHANGED:
            # The database changed for everyone: throughput measured before says nothing now.
            self._throughput = {self._probe_limit: self._throughput[self._probe_limit]}
        self._base = mean
        self._next_probe = now + PROBE_INTERVAL_S
        logger.debug("auto limit: latency at low concurrency %.2f ms", mean * 1e3)
        self._move(self._target, "probe done")

    def _set(self, limit: int, reason: str) -> bool:
        """Move the limit to ``limit``, within ``[low, high]``; whether it moved (a fresh window if so)."""
        limit = max(self.low, min(self.high, limit))
        old = self._limiter.target
        if limit == old:
            return False
        self._limiter.set_limit(limit)
        self._rtt = None
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
