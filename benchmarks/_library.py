"""Helpers shared by the scenarios that drive a boundeddb runner."""

from __future__ import annotations

import dataclasses
from typing import Any

from ._harness import Probe


def record(p: Probe, report: Any) -> None:
    """Put a RunReport's per-unit latencies, failures and RunStats into the probe."""
    outcomes = report.outcomes
    p.latencies = [o.latency_s for o in outcomes if o.error is None]
    p.failed = len(outcomes) - len(p.latencies)
    p.m.extra["runner_stats"] = dataclasses.asdict(report.stats)
    p.m.extra["wait_s_total"] = sum(o.wait_s for o in outcomes)
    first = next((o.error for o in outcomes if o.error is not None), None)
    if first is not None:
        p.m.extra["first_error"] = repr(first)[:300]
