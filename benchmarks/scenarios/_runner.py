"""What the scenarios that drive a boundeddb runner share: a RunReport into a probe's row."""

from __future__ import annotations

import dataclasses
from typing import Any

from ..harness import Probe
from ..report.stats import mean_limit


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
