"""
What the auto limit measures: unit latencies gathered into windows, and each window's throughput.

By Little's law, a window's throughput is its mean units in flight over its latency. A window whose
units did not fill the limit has none, and the latencies of units that ran at an old limit or warmed
up a new connection are left out. See "Windows" in ``docs/explanation/auto-limit-controller.md``.
"""

from __future__ import annotations

import math
import threading

from .limiter import Limiter

__all__ = ["Windows"]

#: Fewest latencies in a window, or twice the limit if that is more.
MIN_SAMPLES = 32
#: A window lasts at least this many seconds: fewer, steadier decisions on fast units.
MIN_WINDOW_S = 0.1
#: A climb's windows: at least this many latencies, or twice the limit if that is more, and this
#: long. Its steps are coarse: a doubling that pays shows as a third more throughput.
CLIMB_SAMPLES, CLIMB_WINDOW_S = 16, 0.1
#: A window closes after this long if it has at least MIN_WINDOW_SAMPLES latencies.
MAX_WINDOW_S = 1.0
MIN_WINDOW_SAMPLES = 3
#: The share of a window's latencies, the fastest, whose mean is the window's latency.
KEPT = 0.8
#: A window fills the limit if the units in flight averaged at least this share of it.
FILLED = 0.9
#: Latencies left out for each slot the limit opens for the first time: they warm up.
WARM_UP = 4


class Windows:
    """The latencies units report, gathered into windows. See the module docstring."""

    def __init__(self, limiter: Limiter, initial: int) -> None:
        self._limiter = limiter
        self._lock = threading.Lock()
        #: The window's latencies, and the units in flight as each finished, itself included.
        self._samples: list[float] = []
        self._loads: list[int] = []
        self._start: float | None = None  # the first look starts the first window
        #: Latencies to leave out before the next window: of old units, and of units warming up.
        self.skip = WARM_UP * initial
        self._opened = initial  # the highest the limit has been
        #: Windows closed so far: the controller's clock.
        self.closed = 0

    def observe(self, latency_s: float) -> None:
        """A unit's attempt succeeded after ``latency_s`` seconds. Any thread, while it holds its slot."""
        in_flight = self._limiter.in_flight
        with self._lock:
            self._samples.append(latency_s)
            self._loads.append(in_flight)

    def moved(self, limit: int) -> None:
        """The limit was just set to ``limit``: leave out the units in flight, and new slots' first units."""
        self.skip = self._limiter.in_flight + WARM_UP * max(0, limit - self._opened)
        self._opened = max(self._opened, limit)

    def restart(self, now: float) -> None:
        """Drop what the window holds. A new one starts at ``now``."""
        self._take(now)

    def close(self, now: float, *, climbing: bool) -> tuple[bool, float | None]:
        """Whether a window closed at ``now``, where a new one starts, and its throughput if it has one."""
        if self.skip:
            self._leave_out(now)
            return False, None
        count = len(self._samples)
        if self._start is None or (not self.closed and not count):
            self._start = now  # idle before the first run: that time is no window's
            return False, None
        elapsed, limit = now - self._start, self._limiter.target
        least, shortest = (CLIMB_SAMPLES, CLIMB_WINDOW_S) if climbing else (MIN_SAMPLES, MIN_WINDOW_S)
        if not (
            (count >= max(least, 2 * limit) and elapsed >= shortest)
            or (elapsed >= MAX_WINDOW_S and count >= MIN_WINDOW_SAMPLES)
        ):
            return False, None
        samples, loads = self._take(now)
        self.closed += 1
        load = sum(loads) / len(loads)
        if load < FILLED * (limit - self._limiter.reserve):
            return True, None
        samples.sort()
        kept = samples[: max(1, math.ceil(KEPT * len(samples)))]
        latency = sum(kept) / len(kept)
        return True, (load / latency if latency > 0 else None)

    def _take(self, now: float) -> tuple[list[float], list[int]]:
        with self._lock:
            samples, self._samples = self._samples, []
            loads, self._loads = self._loads, []
        self._start = now
        return samples, loads

    def _leave_out(self, now: float) -> None:
        """Drop the latencies to skip as they come, since old units finish first. The window starts after."""
        with self._lock:
            dropped = min(self.skip, len(self._samples))
            del self._samples[:dropped]
            del self._loads[:dropped]
            self.skip -= dropped
        self._start = now
