"""Helpers shared by the scenarios that drive a boundeddb runner."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

from ._harness import Probe


def mean_limit(trace: Sequence[Sequence[float]], end_s: float) -> float | None:
    """The time-weighted mean of a ``RunStats.limit_trace`` over ``[0, end_s]``."""
    if not trace or end_s <= 0:
        return None
    total = 0.0
    for (t, limit), (t_next, _) in zip(trace, [*trace[1:], (end_s, 0)], strict=True):
        total += limit * max(0.0, min(t_next, end_s) - t)
    return total / end_s


def record(p: Probe, report: Any) -> None:
    """Put a RunReport's per-unit latencies, failures and RunStats into the probe."""
    outcomes = report.outcomes
    p.latencies = [o.latency_s for o in outcomes if o.error is None]
    p.failed = len(outcomes) - len(p.latencies)
    stats = dataclasses.asdict(report.stats)
    trace = stats.pop("limit_trace")
    if len(trace) > 1:  # a moving limit: keep its course
        p.m.extra["limit_trace"] = trace
    p.m.extra["limit_mean"] = mean_limit(trace, report.stats.elapsed_s)
    p.m.extra["runner_stats"] = stats
    p.m.extra["wait_s_total"] = sum(o.wait_s for o in outcomes)
    first = next((o.error for o in outcomes if o.error is not None), None)
    if first is not None:
        p.m.extra["first_error"] = repr(first)[:300]
