"""
PNG charts (matplotlib, Agg): ops/s of the throughput rows, connections over time, the limit sweep,
/ping latency.

The other sections' charts live beside their sections and take ``plt`` from here, so matplotlib
is set to the Agg backend once.
"""

from __future__ import annotations

import statistics
from pathlib import Path

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt

from ..measurement import Measurement
from ..stats import by_fixed_limit, measured

__all__ = ["connections", "loop_lag", "plt", "sweep", "throughput"]


#: How the charts name the two schemas.
SCHEMA_NAMES = {"faithful": "the post's schema", "index": "with an index on b.a_id"}


def throughput(path: Path, rows: list[Measurement]) -> Path | None:
    """ops/s of each throughput row side by side (one bar per schema that ran), each bar labelled."""
    rows = measured(rows)
    if not rows:
        return None
    names = list(dict.fromkeys(m.label.removesuffix(" [index]") for m in rows))
    schemas = [s for s in SCHEMA_NAMES if any(m.schema == s for m in rows)]
    fig, ax = plt.subplots(figsize=(7.5, 0.5 * len(names) + 1.3))
    height = 0.8 / len(schemas)
    # A bar far beyond the others (raw asyncpg with the index) is cut at the axis's end, its figure kept.
    highest = sorted(m.ops_per_s or 0.0 for m in rows)
    end = 1.15 * (highest[-2] if len(highest) > 1 and highest[-1] > 2 * highest[-2] else highest[-1])
    for k, schema in enumerate(schemas):
        ops = {m.label.removesuffix(" [index]"): m.ops_per_s or 0.0 for m in rows if m.schema == schema}
        ys = [i + (k - (len(schemas) - 1) / 2) * height for i in range(len(names))]
        bars = ax.barh(
            ys, [min(ops.get(name, 0.0), end) for name in names], height, label=SCHEMA_NAMES[schema]
        )
        shown = [f"{ops[n]:,.0f}{' (bar cut)' if ops[n] > end else ''}" if n in ops else "" for n in names]
        ax.bar_label(bars, labels=shown, padding=3, fontsize=8)
    ax.set_yticks(range(len(names)), names, fontsize=9)
    ax.invert_yaxis()
    ax.set_xlim(0, end * 1.12)
    ax.set_xlabel("ops/s (more is better)")
    ax.set_title(f"Throughput per scenario, N={rows[0].n:,} ORM ops (half creates, half reads)", fontsize=10)
    ax.grid(alpha=0.3, axis="x")
    ax.legend(fontsize=8, loc="upper right")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def connections(path: Path, rows: list[Measurement], *, source: str = "pg_stat_activity") -> Path | None:
    """Connections over time per scenario: the post's DBeaver graph, all runs on one chart."""
    rows = [m for m in rows if m.connections]
    if not rows:
        return None
    fig, ax = plt.subplots(figsize=(11, 5.5))
    for m in rows:
        t = [s for s, _ in m.connections]
        c = [c for _, c in m.connections]
        ax.step(t, c, where="post", label=m.label, linestyle="--" if m.schema == "index" else "-")
    ax.set_xlabel("seconds since the scenario started")
    ax.set_ylabel(f"server connections ({source}, every 100 ms)")
    ax.set_title("Connections over time per scenario")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="upper right")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def sweep(path: Path, rows: list[Measurement]) -> Path | None:
    """
    Throughput and p99 latency against the limit, one line per runner and schema; a runner's
    ``limit="auto"`` run is a star at its time-weighted mean limit.
    """
    rows = [m for m in rows if not m.error and m.ops_per_s]
    if not rows:
        return None
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4.5))
    for scenario, schema in sorted({(m.scenario, m.schema) for m in rows}):
        mine = [m for m in rows if m.scenario == scenario and m.schema == schema]
        by_limit = by_fixed_limit(mine)
        limits = sorted(by_limit)  # with --sweep-passes, each limit's mean over the passes
        ops = [statistics.mean(m.ops_per_s or 0.0 for m in by_limit[lim]) for lim in limits]
        p99 = [statistics.mean((m.p99_s or 0.0) * 1e3 for m in by_limit[lim]) for lim in limits]
        name = scenario if schema == "faithful" else f"{scenario} [index]"
        style = "--" if schema == "index" else "-"
        line = left.plot(limits, ops, style, marker="o", label=name)[0]
        right.plot(limits, p99, style, marker="o", label=name)
        for m in mine:
            if m.config.get("limit") == "auto" and m.extra.get("limit_mean"):
                x, color = m.extra["limit_mean"], line.get_color()
                left.plot([x], [m.ops_per_s], "*", color=color, markersize=14, label=f"{name} auto")
                right.plot([x], [(m.p99_s or 0) * 1e3], "*", color=color, markersize=14, label=f"{name} auto")
    for ax, ylabel in ((left, "ops/s"), (right, "p99 unit latency, ms")):
        ax.set_xscale("log")
        ax.set_xlabel("limit L (connections); a star: limit='auto' at its mean limit")
        ax.set_ylabel(ylabel)
        ax.grid(alpha=0.3, which="both")
        ax.legend(fontsize=7)
    right.set_yscale("log")
    fig.suptitle(f"Limit sweep (N={rows[0].n:,} per point)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def loop_lag(path: Path, rows: list[Measurement]) -> Path | None:
    """/ping p50, p99 and max per variant (log scale)."""
    rows = [m for m in rows if not m.error and m.extra.get("ping_p99_s")]
    if not rows:
        return None
    fig, ax = plt.subplots(figsize=(max(9.0, 0.8 * len(rows) + 2), 5.5))
    names = [m.label.removeprefix("loop-lag ") for m in rows]
    width = 0.27
    for k, (key, label) in enumerate((("ping_p50_s", "p50"), ("ping_p99_s", "p99"), ("ping_max_s", "max"))):
        xs = [i + (k - 1) * width for i in range(len(rows))]
        ax.bar(xs, [(m.extra.get(key) or 0) * 1e3 for m in rows], width, label=label)
    ax.axhline(100, color="grey", linestyle=":", label="100 ms")
    ax.set_xticks(range(len(rows)), names, rotation=35, ha="right", fontsize=8)
    ax.set_yscale("log")
    ax.set_ylabel("/ping latency, ms")
    ax.set_title("/ping latency while the app serves DB requests")
    ax.grid(alpha=0.3, axis="y")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
