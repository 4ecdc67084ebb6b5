"""The report's "Many processes through PgBouncer" section and its chart (the scenario: ``fleet``)."""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import Any

from ..measurement import Measurement
from ..scenarios import fleet
from ..stats import measured as _ok
from ..stats import median_of as _median
from .charts import plt
from .tables import fmt


def _per_round(rows: list[Measurement], a: str, b: str, key: str) -> list[float]:
    """Per round: side ``a``'s ``key`` against side ``b``'s (ops/s: a ratio; latency: a difference in ms)."""
    out = []
    for k in sorted({m.config["round"] for m in rows}):
        side = {m.config["side"]: m for m in rows if m.config["round"] == k}
        x, y = side.get(a), side.get(b)
        if not (x and y):
            continue
        if key == "ops_per_s" and x.ops_per_s and y.ops_per_s:
            out.append(x.ops_per_s / y.ops_per_s)
        elif key == "p50_s" and x.p50_s is not None and y.p50_s is not None:
            out.append((x.p50_s - y.p50_s) * 1e3)
    return out


def _per_unit(data: dict[str, Any], a: str, b: str) -> str:
    """The fleet's time per unit on side ``a`` against side ``b`` (1 / ops/s), in ms."""
    x, y = data["sides"].get(a, {}).get("ops_per_s"), data["sides"].get(b, {}).get("ops_per_s")
    if not (x and y):
        return "fleet time per unit -"
    return f"fleet time per unit {1e3 / x:.2f} ms against {1e3 / y:.2f} ms ({1e3 / x - 1e3 / y:+.2f} ms)"


def section(rows: list[Measurement]) -> tuple[list[str], dict[str, Any]]:
    ok = _ok(rows)
    data: dict[str, Any] = {"sides": {}}
    for side in fleet.SIDES:
        mine = [m for m in ok if m.config.get("side") == side.name]
        if not mine:
            continue
        data["sides"][side.name] = {
            "rounds": len(mine),
            "limit": side.limit,
            "ops_per_s": _median([m.ops_per_s for m in mine]),
            "p50_ms": _median([m.p50_s and m.p50_s * 1e3 for m in mine]),
            "p99_ms": _median([m.p99_s and m.p99_s * 1e3 for m in mine]),
            "slot_wait_p99_ms": _median([m.extra.get("slot_wait_p99_ms") for m in mine]),
            "peak_server_connections": max((m.peak_connections or 0 for m in mine), default=None),
            "pooler_wait_per_xact_ms": _median([m.extra.get("pooler_wait_per_xact_ms") for m in mine]),
            "failed": sum(m.failed for m in mine),
        }
    for other in ("direct", "direct, pooler options"):
        ratios = _per_round(ok, "pooler", other, "ops_per_s")
        deltas = _per_round(ok, "pooler", other, "p50_s")
        data[f"pooler_vs_{other}"] = {
            "ops_ratios": [round(r, 3) for r in ratios],
            "ops_ratio": statistics.median(ratios) if ratios else None,
            "p50_delta_ms": statistics.median(deltas) if deltas else None,
        }
    hop = _per_round(ok, "pooler, L=S/P", "direct, pooler options", "ops_per_s")
    data["hop"] = {"ops_ratios": [round(r, 3) for r in hop], "ops_ratio": _median(list(hop))}
    opts = _per_round(ok, "direct, pooler options", "direct", "ops_per_s")
    data["options_vs_direct"] = {"ops_ratios": [round(r, 3) for r in opts], "ops_ratio": _median(list(opts))}
    k = max((int(m.config.get("round", 0)) for m in ok), default=0)
    header = [
        "side", "ops/s", "unit p50, ms", "unit p99, ms", "slot wait p99, ms", "peak server conns",
        "pooler wait per txn, ms", "failed",
    ]  # fmt: skip
    body = []
    for side in fleet.SIDES:
        v = data["sides"].get(side.name)
        if v is None:
            continue
        body.append(
            [
                f"{side.name} ({fleet.PROCESSES} x L={side.limit})",
                fmt(v["ops_per_s"], digits=0),
                fmt(v["p50_ms"], digits=2),
                fmt(v["p99_ms"], digits=2),
                fmt(v["slot_wait_p99_ms"], digits=2),
                str(v["peak_server_connections"]),
                fmt(v["pooler_wait_per_xact_ms"], digits=3) if side.through_pooler else "-",
                str(v["failed"]),
            ]
        )
    align = ["---"] + ["---:"] * (len(header) - 1)
    errors = [f"- {m.label}: {m.error}" for m in rows if m.error]
    cost = data["pooler_vs_direct"]
    opt = data["pooler_vs_direct, pooler options"]
    hop, options = data["hop"], data["options_vs_direct"]
    lines = [
        f"## Many processes through PgBouncer ({k} ABBA rounds, {ok[0].n if ok else '-'} ops per side)",
        "",
        *("| " + " | ".join(r) + " |" for r in [header, align, *body]),
        "",
        *errors,
        *([""] if errors else []),
        f"{fleet.PROCESSES} processes, each a `SemaphoreRunner` on asyncpg over its slice of the op "
        "sequence.  "
        f"pooler: L={fleet.LIMIT} each through PgBouncer in transaction mode with {fleet.POOL} server "
        f"connections and `pgbouncer_engine_options`; direct: L={fleet.POOL // fleet.PROCESSES} each "
        "straight to PostgreSQL (the same server connections, split up front).  Figures are medians of "
        "the rounds; unit latency is `Outcome.latency_s` (the pooler's wait for a server connection "
        "included); server connections from pg_stat_activity every 100 ms.",
        "",
        f"- The pooler's cost: ops/s {fmt(cost['ops_ratio'], digits=3)} of direct (rounds: "
        f"{', '.join(map(str, cost['ops_ratios']))}), {_per_unit(data, 'pooler', 'direct')}; unit p50 "
        f"{fmt(cost['p50_delta_ms'], digits=2)} ms more, most of it queueing at the pooler (the wait per "
        "transaction above): more clients than server connections move the wait from the runner's slot "
        "to PgBouncer.  Against direct with the same engine options: ops/s "
        f"{fmt(opt['ops_ratio'], digits=3)}.",
        f"- The hop alone (pooler at L=S/P, nobody queues, against direct with the same options): ops/s "
        f"{fmt(hop['ops_ratio'], digits=3)} (rounds: {', '.join(map(str, hop['ops_ratios']))}), "
        f"{_per_unit(data, 'pooler, L=S/P', 'direct, pooler options')}.",
        f"- The engine options alone (no prepared statement kept), direct: ops/s "
        f"{fmt(options['ops_ratio'], digits=3)} of asyncpg's defaults (rounds: "
        f"{', '.join(map(str, options['ops_ratios']))}).",
        "",
    ]
    return lines, data


def chart(path: Path, rows: list[Measurement]) -> Path | None:
    """Server connections over time, one line per side (the first round)."""
    rows = [m for m in _ok(rows) if m.config.get("round") == 1 and m.connections]
    if not rows:
        return None
    fig, ax = plt.subplots(figsize=(9, 4.5))
    for m in rows:
        t0 = m.connections[0][0]
        ax.step(
            [t - t0 for t, _ in m.connections], [c for _, c in m.connections], where="post", label=m.label
        )
    ax.axhline(
        fleet.POOL, color="grey", linestyle="--", linewidth=1, label=f"PgBouncer pool size {fleet.POOL}"
    )
    ax.set_xlabel("seconds since the fleet started")
    ax.set_ylabel("server connections (pg_stat_activity)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    ax.set_title(f"{fleet.PROCESSES} processes: through PgBouncer (L={fleet.LIMIT} each) and direct")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
