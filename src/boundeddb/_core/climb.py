"""
The auto limit's climb: it finds the region of the best limit, one window at each limit it tries.

The limit doubles while doubling pays, halves while halving costs little, and ends at the fewest
units within :data:`PICK_TOLERANCE` of the most throughput measured. See "The climb" in
``docs/explanation/auto-limit-controller.md``.
"""

from __future__ import annotations

import math

__all__ = ["CLIMB_GAIN", "LEAP", "LEAP_GAIN", "PICK_TOLERANCE", "TOLERANCE", "Climb"]

#: A doubling pays if throughput grew by at least this share of the step, a third.
CLIMB_GAIN = 1 / 3
#: A doubling that paid at least this share of the step makes the next step LEAP times the limit
#: rather than twice. Latency hardly grew there: the units mostly wait.
LEAP_GAIN, LEAP = 0.9, 4
#: Fewer units in flight are worth this much throughput, when halving here or moving down in the cruise.
TOLERANCE = 0.02
#: The climb ends at the fewest units within this of the most throughput it measured.
PICK_TOLERANCE = 0.01


class Climb:
    """One climb's throughput at each limit, and where it goes next. See the module docstring."""

    __slots__ = ("halves", "points", "settled", "settling", "start")

    def __init__(self, start: int, *, settle: int = 0, halves: bool = True) -> None:
        #: The limit it started from.
        self.start = start
        #: Whether it may go below ``start``, looking for a knee under it.
        self.halves = halves
        self.points: dict[int, float] = {}
        #: After a change: windows left to wait for throughput to settle, and the last one's.
        self.settling = settle
        self.settled: float | None = None

    def settles(self, throughput: float, within: float) -> bool:
        """
        After a change, whether throughput at the start has settled: only then does the climb measure.

        It has settled when the last two windows are within ``within`` times of each other, or when
        the wait is over.
        """
        if not self.settling:
            return True
        last, self.settled = self.settled, throughput
        self.settling -= 1
        if self.settling and (last is None or abs(math.log(throughput / last)) > math.log(within)):
            return False
        self.settling = 0
        return True

    def step(
        self, limit: int, throughput: float, *, low: int, high: int, may_rise: bool
    ) -> tuple[int, str] | None:
        """
        Note ``throughput`` at ``limit``: the next limit to measure and why, or ``None`` when the climb
        is over and :meth:`pick` says where it ends. ``may_rise``: False while rising is held off.
        """
        start, points = self.start, self.points
        points[limit] = throughput
        if limit < start:  # going down: halve again while halving costs at most TOLERANCE
            above = points[min(p for p in points if p > limit)]
            if throughput >= (1 - TOLERANCE) * above and limit > low:
                return max(low, limit // 2), "climbing: halving"
            return None
        below = sorted(p for p in points if start <= p < limit)
        step = limit / below[-1] - 1 if below else 1.0
        gain = throughput / points[below[-1]] - 1 if below else 0.0
        pays = not below or gain >= CLIMB_GAIN * step
        if below and not pays and limit > 2 * below[-1]:
            return 2 * below[-1], "climbing: back to the doubling a leap skipped"
        if pays and limit == max(points) < high and may_rise:
            leap = gain >= LEAP_GAIN * step  # latency hardly grew: units that mostly wait
            how = "leaping" if leap else "doubling"
            return min(high, (LEAP if leap else 2) * limit), f"climbing: {how}"
        if self.halves and len(below) <= 1 and start > low and not (pays and below):
            return max(low, start // 2), "climbing: halving"  # the knee may be below the start
        return None

    def pick(self) -> int:
        """The fewest units in flight the climb measured within PICK_TOLERANCE of its most throughput."""
        points = self.points
        best = max(points.values())
        return min(limit for limit, x in points.items() if x >= (1 - PICK_TOLERANCE) * best)

    def ratio(self, home: int, limit: int) -> float | None:
        """
        Throughput at ``limit`` over throughput at ``home`` on the climb's curve.

        It is measured, or interpolated on a log-log scale between the measured limits around it.
        ``None`` if no measured limit lies beyond it.
        """
        points = self.points
        if home not in points:
            return None
        if limit in points:
            return points[limit] / points[home]
        lower = [p for p in points if p < limit]
        upper = [p for p in points if p > limit]
        if not (lower and upper):
            return None
        a, b = max(lower), min(upper)
        w = math.log(limit / a) / math.log(b / a)
        return math.exp((1 - w) * math.log(points[a]) + w * math.log(points[b])) / points[home]
