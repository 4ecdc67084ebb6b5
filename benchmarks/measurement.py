"""
One row of the report: the figures of one measured run, as results.json keeps them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class Measurement:
    """The figures of one scenario run (one row of a table)."""

    scenario: str
    label: str
    group: str = "main"
    schema: str = "faithful"
    n: int = 0
    succeeded: int = 0
    failed: int = 0
    wall_s: float | None = None
    ops_per_s: float | None = None
    p50_s: float | None = None
    p99_s: float | None = None
    max_s: float | None = None
    peak_connections: int | None = None
    client_cpu_s: float | None = None
    server_cpu_s: float | None = None
    loop_lag_p99_s: float | None = None
    loop_lag_max_s: float | None = None
    rss_growth_mb: float | None = None
    connections: list[tuple[float, int]] = field(default_factory=list)
    config: dict[str, Any] = field(default_factory=dict)
    extra: dict[str, Any] = field(default_factory=dict)
    error: str | None = None


def done_line(m: Measurement) -> str:
    """A finished measurement in a few figures, for the progress lines."""
    parts = [f"{m.succeeded:,} units in {m.wall_s or 0.0:.1f} s"]
    if m.ops_per_s:
        parts.append(f"{m.ops_per_s:,.0f}/s")
    if m.p99_s is not None:
        parts.append(f"p99 {m.p99_s * 1e3:.1f} ms")
    if m.peak_connections:
        parts.append(f"peak {m.peak_connections} connection{'s' if m.peak_connections > 1 else ''}")
    if m.failed:
        parts.append(f"{m.failed:,} failed")
    return ", ".join(parts)


def error_line(exc: BaseException, limit: int = 300) -> str:
    """An exception in one line for a row's ``error``: its type and its message's first line."""
    return f"{type(exc).__name__}: {exc}".splitlines()[0][:limit]
