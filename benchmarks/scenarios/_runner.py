"""What the scenarios that drive a boundeddb runner share: its pool's settings, a RunReport into a row."""

from __future__ import annotations

import dataclasses
from typing import Any, Literal

from ..harness import Probe
from ..stats import mean_limit


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


def pool_config(limit: int | Literal["auto"], capacity: int | None, driver: str) -> dict[str, Any]:
    """
    The settings of a runner of ``limit`` on a pool of ``capacity`` connections (default: the limit;
    ``limit="auto"`` needs it, and gets ``pool_use_lifo=True`` as the auto-limit how-to recommends: a
    fixed limit uses its whole pool), as a row's config records them.
    """
    pool_size = capacity or int(limit)
    lifo = limit == "auto"
    return {
        "driver": driver,
        "limit": limit,
        "pool_size": pool_size,
        "max_overflow": 0,
        "pool_use_lifo": lifo,
    }
