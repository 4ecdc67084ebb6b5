"""
The auto limit's controller: it moves a limiter's limit to the fewest units giving the most throughput.

It climbs, then cruises at the limit with a look at a neighbouring limit now and then, comparing
the throughput of windows of units: see :mod:`.climb` and :mod:`.windows`. A sign of overload cuts
the limit at once. How and why: ``docs/explanation/auto-limit-controller.md``.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from time import perf_counter
from typing import Any, Literal

from .climb import CLIMB_GAIN, TOLERANCE, Climb
from .limiter import Limiter
from .windows import Windows

__all__ = ["LimitController", "LimitTrace", "limit_figures"]

logger = logging.getLogger("boundeddb.limit")

#: Windows at the limit before the first look up / down in a cruise ...
FIRST_WAIT_UP, FIRST_WAIT_DOWN = 2, 1
#: ... and before the first look at a side whose neighbour the climb's curve shows to give more than
#: SEED_MARGIN less than the side would have to.
SEEDED_WAIT, SEED_MARGIN = 4, 0.05
#: The cruise moves up if the higher limit gives more than 1 + GAIN times the throughput, down if
#: the lower one gives more than 1 - TOLERANCE times it, with Z standard errors to spare.
GAIN, Z = 0.02, 1.0
#: The spread, as sd of the log ratio, a single comparison is assumed to have until a side has its
#: own, and how many comparisons that assumption weighs as.
PRIOR_SPREAD, PRIOR_WEIGHT = 0.12, 2
#: Comparisons a side keeps, the newest.
EVIDENCE = 8
#: The most windows at the limit between two looks at one side. Each look that moves nothing
#: doubles the gap, up to this.
MAX_WAIT = 16
#: Throughput this many times off its recent level, two windows in a row: the database changed. The
#: climb that follows waits, at most SETTLE_WINDOWS windows, for two windows in a row within SETTLED
#: of each other: while another workload starts or stops, throughput moves whatever the limit does.
CHANGE, SETTLED, SETTLE_WINDOWS = 1.6, 1.25, 4
#: Weight of the newest window in the recent level of throughput at the limit.
LEVEL_WEIGHT = 0.3
#: Cut on overload: the limit times this, then no rise for CALM_WINDOWS windows.
BACKOFF = 0.75
CALM_WINDOWS = 8
#: The most points a trace keeps. Beyond it every other point is dropped.
TRACE_POINTS = 512

Side = Literal["up", "down"]
#: What a neighbour's throughput must be shown to exceed, as a share of the limit's, for each side.
BARS: dict[Side, float] = {"up": 1 + GAIN, "down": 1 - TOLERANCE}


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
        """The limit at ``start``, a ``perf_counter()`` reading, and each change after it, re-based."""
        offset = start - self._start
        first = self._points[0][1]
        later: list[tuple[float, int]] = []
        for t, n in self._points:
            if t < offset:
                first = n
            else:
                later.append((round(t - offset, 4), n))
        return ((0.0, first), *later)


class Evidence:
    """One side's comparisons: log(throughput at the neighbour / throughput at the limit)."""

    __slots__ = ("due", "ratios", "step", "wait")

    def __init__(self, step: int, wait: int = 1) -> None:
        self.step = step  # how far the neighbour is from the limit
        self.ratios: list[float] = []
        self.wait = wait  # windows at the limit between two looks
        self.due = wait - 1  # windows at the limit until the next look

    def add(self, ratio: float) -> None:
        self.ratios = [*self.ratios[-(EVIDENCE - 1) :], ratio]

    def bounds(self) -> tuple[float, float]:
        """The mean log ratio less and plus Z standard errors. The spread is shrunk towards the prior's."""
        n = len(self.ratios)
        mean = sum(self.ratios) / n
        squares = sum((r - mean) ** 2 for r in self.ratios)
        spread = math.sqrt((PRIOR_SPREAD**2 * PRIOR_WEIGHT + squares) / (PRIOR_WEIGHT + n - 1))
        margin = Z * spread / math.sqrt(n)
        return mean - margin, mean + margin


class LimitController:
    """Moves ``limiter``'s limit within ``[low, high]``. See the module docstring."""

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
        #: What the units report, in windows. ``observe`` is on the per-unit path.
        self.windows = Windows(limiter, initial)
        self.observe = self.windows.observe
        self._overloaded = False
        self._cut_at = float("-inf")  # perf_counter() when the limit was last cut for overload
        self._calm_until = 0  # after an overload, no rise before this window
        #: "climb" or "cruise"; the climb under way, or the last one.
        self.phase = "climb"
        self._climbing = Climb(initial)
        #: Cruise: the limit it holds, the last window's throughput there, the side being looked at,
        #: and that side's throughput until the window at the limit after it.
        self._home = initial
        self._before: float | None = None
        self._looking: Side | None = None
        self._looked: tuple[Side, float] | None = None
        self._sides: dict[Side, Evidence] = {"up": Evidence(1), "down": Evidence(1)}
        #: The recent level of log throughput at the limit, and windows in a row far off it.
        self._level: float | None = None
        self._off = 0
        self.trace = LimitTrace(limiter.limit)

    # -- from the units, in any thread; ``observe`` is the windows' ---------------------------------

    def failed(self, error: Exception, latency_s: float = 0.0) -> None:
        """
        An attempt failed with ``error`` after ``latency_s`` seconds: note it if it says the database or
        the pool is overloaded, unless it started before the last cut, which dealt with it.
        """
        if self._is_overload(error) and perf_counter() - latency_s >= self._cut_at:
            self._overloaded = True

    # -- on the event loop ----------------------------------------------------------------------------

    def adjust(self, now: float | None = None) -> None:
        """Close the window if it is full, and move the limit if it should move."""
        now = perf_counter() if now is None else now
        if self._overloaded:
            self._overloaded = False
            self._cut_at = perf_counter()
            self.windows.restart(now)
            self._calm_until = self.windows.closed + CALM_WINDOWS
            limit = self._limiter.target
            self._cruise(min(limit - 1, int(limit * BACKOFF)), "overload")
            return
        closed, throughput = self.windows.close(now, climbing=self.phase == "climb")
        if not closed:
            return
        if throughput is None:  # the units' source, not the limit, set the pace: nothing to learn
            self._unfilled()
        elif self.phase == "climb":
            self._climb(throughput)
        else:
            self._step(throughput)

    # -- climb --------------------------------------------------------------------------------------

    def _climb(self, throughput: float) -> None:
        """A climb window closed: measure the next limit, or cruise where the climb ends."""
        climb = self._climbing
        if not climb.settles(throughput, SETTLED):  # after a change: climb once throughput settles
            return
        may_rise = self.windows.closed >= self._calm_until
        step = climb.step(self._limiter.target, throughput, low=self.low, high=self.high, may_rise=may_rise)
        if step is None:
            self._cruise(climb.pick(), "climbed", climb)
        else:
            self._move(*step)

    def _restart_climb(self, why: str) -> None:
        logger.debug("auto limit: climbing again from %d (%s)", self._home, why)
        self.phase, self._climbing = "climb", Climb(self._home, settle=SETTLE_WINDOWS)
        self._move(self._home, why)

    # -- cruise ---------------------------------------------------------------------------------------

    def _cruise(self, home: int, why: str, climbed: Climb | None = None) -> None:
        """
        Hold ``home`` and compare it with its neighbours, from scratch.

        A side whose neighbour ``climbed``, the climb that ends here, shows not to pay is looked at
        later.
        """
        self.phase = "cruise"
        self._home = home = max(self.low, min(self.high, home))
        self._before, self._looking, self._looked = None, None, None
        step = max(1, home // 4)
        self._sides = {"up": Evidence(step, FIRST_WAIT_UP), "down": Evidence(step, FIRST_WAIT_DOWN)}
        if climbed is not None:
            for side, bar in BARS.items():
                ratio = climbed.ratio(home, self._neighbour(side))
                if ratio is not None and ratio < bar - SEED_MARGIN:
                    self._sides[side] = Evidence(step, SEEDED_WAIT)
        self._level, self._off = None, 0
        self._move(home, why)

    def _neighbour(self, side: Side) -> int:
        home, step = self._home, self._sides[side].step
        return min(self.high, home + step) if side == "up" else max(self.low, home - step)

    def _unfilled(self) -> None:
        """A window the units did not fill: a comparison under way is void, and a look goes home."""
        self._before, self._looked = None, None
        if self._looking is not None:
            self._looking = None
            self._move(self._home, "back from a look (the units did not fill it)")

    def _step(self, throughput: float) -> None:
        """A cruise window closed, at a neighbour or at the limit: compare, decide, maybe look again."""
        if self._looking is not None:
            self._looked, self._looking = (self._looking, throughput), None
            self._move(self._home, "back from a look")
            return
        if self._changed(throughput):
            self._restart_climb(f"throughput {math.exp(self._level or 0):.0f}/s -> {throughput:.0f}/s")
            return
        looked, before = self._looked, self._before
        self._before, self._looked = throughput, None
        if looked is not None and before is not None:
            side, there = looked
            if self._weigh(side, math.log(there / math.sqrt(before * throughput))):
                return
        self._look()

    def _changed(self, throughput: float) -> bool:
        """Whether the throughput at the limit left its recent level for a second window in a row."""
        log = math.log(throughput)
        level = self._level
        if level is None or abs(log - level) <= math.log(CHANGE):
            self._off = 0
            self._level = log if level is None else level + LEVEL_WEIGHT * (log - level)
            return False
        self._off += 1
        return self._off >= 2

    def _weigh(self, side: Side, ratio: float) -> bool:
        """Add a comparison to ``side``'s evidence and move the limit if that is shown to pay: did it move?"""
        evidence = self._sides[side]
        evidence.add(ratio)
        low, high = evidence.bounds()
        bar = math.log(BARS[side])
        if low > bar and not (side == "up" and self.windows.closed < self._calm_until):
            target, mean = self._neighbour(side), sum(evidence.ratios) / len(evidence.ratios)
            why = f"{target} gave {math.exp(mean):.2f}x"
            like_a_doubling = mean > math.log(1 + CLIMB_GAIN * (target / self._home - 1))
            if side == "up" and target < self.high and like_a_doubling:
                self.phase, self._climbing = "climb", Climb(target, halves=False)  # well below the knee
                self._move(target, f"climbing again: {why}")
            else:
                self._cruise(target, why)
            return True
        wait = min(MAX_WAIT, 2 * evidence.wait)  # no move yet: look less often
        if high < bar and evidence.step > 1:  # shown not to pay: look half as far, afresh, as seldom
            self._sides[side] = evidence = Evidence(evidence.step // 2, wait)
        else:
            evidence.wait = wait
        evidence.due = evidence.wait
        return False

    def _look(self) -> None:
        """Spend the next window at a neighbour whose turn it is, if any: the side due longest first."""
        due: list[tuple[int, Side]] = []
        for side in ("down", "up"):
            evidence = self._sides[side]
            evidence.due -= 1
            calm = side == "up" and self.windows.closed < self._calm_until
            if self._neighbour(side) != self._home and evidence.due < 0 and not calm:
                due.append((evidence.due, side))
        if due:
            side = min(due)[1]
            self._looking = side
            self._move(self._neighbour(side), f"a look {side}")

    # -- moving the limit ---------------------------------------------------------------------------

    def _move(self, limit: int, reason: str) -> None:
        """Move the limit. The next window leaves out the units in flight now, which ran at the old one."""
        limit = max(self.low, min(self.high, limit))
        old = self._limiter.target
        if limit == old:
            return
        self._limiter.set_limit(limit)
        self.windows.moved(limit)
        self.trace.add(limit)
        logger.debug("auto limit: %d -> %d (%s)", old, limit, reason)


def limit_figures(limiter: Limiter, controller: LimitController | None, started: float) -> dict[str, Any]:
    """The ``limit_*`` fields of the RunStats of a run that started at ``perf_counter()`` ``started``."""
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
