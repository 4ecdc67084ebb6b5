"""
The suite's statistics helpers, in one place: percentiles, medians, geometric means, sampling.

Measuring code (the probe, the scenarios) and the report sections both use them; of the rest of
the suite, only the :class:`~benchmarks.measurement.Measurement` type.
"""

from __future__ import annotations

import math
import random
import statistics
from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .measurement import Measurement

#: Student's t at 97.5% for 1 to 30 degrees of freedom (a 95% interval); 1.96 beyond.
T_975 = (
    12.71, 4.30, 3.18, 2.78, 2.57, 2.45, 2.36, 2.31, 2.26, 2.23, 2.20, 2.18, 2.16, 2.14, 2.13,
    2.12, 2.11, 2.10, 2.09, 2.09, 2.08, 2.07, 2.07, 2.06, 2.06, 2.06, 2.05, 2.05, 2.05, 2.04,
)  # fmt: skip


def percentile(values: Sequence[float], fraction: float) -> float | None:
    """Nearest-rank percentile, None for no values."""
    if not values:
        return None
    ordered = sorted(values)
    return ordered[max(1, math.ceil(fraction * len(ordered))) - 1]


def median_of(values: Iterable[float | None]) -> float | None:
    """The median of the values that are there, None if none is."""
    present = [v for v in values if v is not None]
    return statistics.median(present) if present else None


def geometric_mean(ratios: list[float]) -> tuple[float | None, float | None, float | None]:
    """The geometric mean of ``ratios`` and its 95% interval (Student's t on their logs); Nones if too few."""
    if not ratios:
        return None, None, None
    logs = [math.log(r) for r in ratios]
    mean = statistics.fmean(logs)
    if len(logs) < 2:
        return math.exp(mean), None, None
    t = T_975[len(logs) - 2] if len(logs) - 1 <= len(T_975) else 1.96
    half = t * statistics.stdev(logs) / math.sqrt(len(logs))
    return math.exp(mean), math.exp(mean - half), math.exp(mean + half)


def per_round(
    rows: Iterable[Measurement], a: str, b: str, value: Callable[[Measurement], float | None]
) -> list[float]:
    """
    Per round (``config["round"]``, in order): ``value`` of side ``a`` over that of side ``b``
    (``config["side"]``), in the rounds where both have one.
    """
    by_round: dict[int, dict[str, Measurement]] = {}
    for m in rows:
        if "round" in m.config:
            by_round.setdefault(int(m.config["round"]), {})[str(m.config.get("side"))] = m
    out = []
    for k in sorted(by_round):
        x, y = by_round[k].get(a), by_round[k].get(b)
        vx, vy = (value(x) if x else None), (value(y) if y else None)
        if vx and vy:
            out.append(vx / vy)
    return out


def mean_limit(trace: Sequence[Sequence[float]], end_s: float) -> float | None:
    """The time-weighted mean of a ``RunStats.limit_trace`` over ``[0, end_s]``."""
    if not trace or end_s <= 0:
        return None
    total = 0.0
    for (t, limit), (t_next, _) in zip(trace, [*trace[1:], (end_s, 0)], strict=True):
        total += limit * max(0.0, min(t_next, end_s) - t)
    return total / end_s


def measured(rows: Iterable[Measurement]) -> list[Measurement]:
    """The rows that ran: no error, and a throughput."""
    return [m for m in rows if not m.error and m.ops_per_s]


def by_fixed_limit(rows: Iterable[Measurement]) -> dict[int, list[Measurement]]:
    """Rows of a fixed (int) limit, grouped by it: a limit sweep's passes of each point."""
    out: dict[int, list[Measurement]] = {}
    for m in rows:
        limit = m.config.get("limit")
        if isinstance(limit, int):
            out.setdefault(limit, []).append(m)
    return out


class Reservoir:
    """A fixed-size uniform sample of latencies, for runs too long to keep them all."""

    def __init__(self, size: int = 10_000, seed: int = 0) -> None:
        self.size, self.seen, self.values = size, 0, []  # type: ignore[var-annotated]
        self._rng = random.Random(seed)

    def add(self, value: float) -> None:
        self.seen += 1
        if len(self.values) < self.size:
            self.values.append(value)
        else:
            slot = self._rng.randrange(self.seen)
            if slot < self.size:
                self.values[slot] = value
