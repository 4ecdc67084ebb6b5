"""The report's "Auto limit" section, its goals, and the neighbour chart (the scenario: ``auto_limit``)."""

from __future__ import annotations

import math
import statistics
from pathlib import Path
from typing import Any

from ..measurement import Measurement
from ..scenarios import auto_limit as al
from ..stats import geometric_mean
from .charts import plt
from .tables import fmt, row, verdict

#: auto >= this fraction of the best fixed limit's ops/s (geometric mean of the rounds' ratios).
TARGET_RATIO = 0.95
#: Under the neighbour: auto's p99 <= this times L=C's, at >= NEIGHBOUR_OPS of its ops/s.
NEIGHBOUR_P99, NEIGHBOUR_OPS = 0.5, 0.9
#: After the neighbour stops, the limit is back within one overload cut of where it was, within this.
RECOVERY_S = 10.0


def _ok(rows: list[Measurement]) -> list[Measurement]:
    return [m for m in rows if not m.error and m.ops_per_s]


def _ratios(rows: list[Measurement], part: str, runner: str, schema: str, other: int) -> list[float]:
    """Per round: auto ops/s / ops/s at the fixed limit ``other``."""
    out = []
    mine = [m for m in rows if m.config.get("part") == part and m.config.get("runner") == runner]
    for k in sorted({m.config["round"] for m in mine}):
        side = {m.config["limit"]: m for m in mine if m.config["round"] == k and m.schema == schema}
        a, b = side.get("auto"), side.get(other)
        if a and b and a.ops_per_s and b.ops_per_s:
            out.append(a.ops_per_s / b.ops_per_s)
    return out


def _median(rows: list[Measurement], key: str) -> float | None:
    values = [getattr(m, key) if hasattr(m, key) else m.extra.get(key) for m in rows]
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def comparisons(rows: list[Measurement]) -> list[dict[str, Any]]:
    """One entry per (part, runner, schema, fixed limit compared with)."""
    out = []
    rows = [m for m in rows if m.config.get("part") in ("vs-best", "latency-bound")]
    keys = sorted({(m.config["part"], m.config["runner"], m.schema) for m in rows})
    for part, runner, schema in keys:
        mine = [m for m in rows if (m.config["part"], m.config["runner"], m.schema) == (part, runner, schema)]
        fixed = sorted({m.config["limit"] for m in mine if m.config["limit"] != "auto"}, reverse=True)
        auto = [m for m in mine if m.config["limit"] == "auto"]
        for other in fixed:
            ratios = _ratios(rows, part, runner, schema, other)
            geomean, low, high = geometric_mean(ratios)
            rest = [m for m in mine if m.config["limit"] == other]
            out.append(
                {
                    "part": part,
                    "runner": runner,
                    "schema": schema,
                    "fixed": other,
                    "goal": other == mine[0].config["best"],  # the sweep's best; C when latency-bound
                    "ratios": [round(r, 3) for r in ratios],
                    "median": statistics.median(ratios) if ratios else None,
                    "geomean": geomean,
                    "ci": None if low is None else [round(low, 3), round(high or 0.0, 3)],
                    "auto_ops": _median(auto, "ops_per_s"),
                    "fixed_ops": _median(rest, "ops_per_s"),
                    "auto_p99_ms": (_median(auto, "p99_s") or 0) * 1e3,
                    "fixed_p99_ms": (_median(rest, "p99_s") or 0) * 1e3,
                    "auto_limit_mean": _median(auto, "limit_mean"),
                }
            )
    return out


def _neighbour_side(m: Measurement) -> dict[str, Any]:
    """One neighbour run's figures per phase, its limit's median before and during, its recovery."""
    side: dict[str, Any] = {"limit": m.config["limit"]}
    for name, figures in m.extra.get("phases", {}).items():
        side[f"{name}_ops"], side[f"{name}_p99_ms"] = figures["ops_s"], figures["p99_ms"]
    limits = m.extra.get("limits", [])
    before = [n for t, n in limits if al.NEIGHBOUR_START_S / 2 <= t < al.NEIGHBOUR_START_S]
    during = [n for t, n in limits if al.NEIGHBOUR_START_S <= t < al.NEIGHBOUR_STOP_S]
    side["limit_before"] = statistics.median(before) if before else None
    side["limit_during"] = statistics.median(during) if during else None
    if m.config["limit"] == "auto" and before:
        # Back where it was, or at the sweep's best fixed limit if lower: a limit that finds after
        # the neighbour that fewer connections give as much is not stuck low.
        floor = min(0.75 * statistics.median(before), m.config.get("best") or math.inf)
        back = next((t for t, n in limits if t >= al.NEIGHBOUR_STOP_S and n >= floor), None)
        side["recovery_s"] = None if back is None else round(back - al.NEIGHBOUR_STOP_S, 2)
    return side


def _medians(sides: list[dict[str, Any]]) -> dict[str, Any]:
    """The median of each figure over rounds (recovery: the slowest)."""
    out: dict[str, Any] = {"limit": sides[0]["limit"], "rounds": len(sides)}
    for key in sides[0]:
        if key == "limit":
            continue
        values = [s[key] for s in sides if s.get(key) is not None]
        if key == "recovery_s":
            out[key] = None if len(values) < len(sides) else max(values)
        else:
            out[key] = statistics.median(values) if values else None
    return out


def neighbour_summary(rows: list[Measurement], capacity: int | None = None) -> dict[str, Any]:
    """
    Per verb (stream, run) and limit: the median over rounds of each figure; per round, auto's
    during-phase p99 and ops/s over L=C's.
    """
    out: dict[str, Any] = {"sides": {}, "pairs": []}
    modes = sorted({m.config.get("mode", "stream") for m in rows}, reverse=True)
    for mode in modes:
        mine = [m for m in rows if m.config.get("mode", "stream") == mode]
        for limit in sorted({str(m.config["limit"]) for m in mine}, key=lambda x: (x != "auto", x)):
            runs = [_neighbour_side(m) for m in mine if str(m.config["limit"]) == limit]
            out["sides"][f"{mode} {limit}"] = _medians(runs)
        fixed = str(capacity) if capacity is not None else None
        for k in sorted({m.config.get("round", 1) for m in mine}):
            side = {str(m.config["limit"]): _neighbour_side(m) for m in mine if m.config.get("round", 1) == k}
            a, c = side.get("auto"), side.get(fixed) if fixed else None
            if a and c and a["during_p99_ms"] and c["during_p99_ms"] and c["during_ops"]:
                out["pairs"].append(
                    {
                        "mode": mode,
                        "round": k,
                        "p99": a["during_p99_ms"] / c["during_p99_ms"],
                        "ops": (a["during_ops"] or 0) / c["during_ops"],
                        "recovery_s": a.get("recovery_s"),
                    }
                )
    return out


def section(rows: list[Measurement]) -> tuple[list[str], dict[str, Any]]:
    rows = _ok(rows)
    data: dict[str, Any] = {"comparisons": comparisons(rows)}
    lines = ["## Auto limit", ""]
    if data["comparisons"]:
        lines += [
            "| part | runner | schema | fixed L | auto / fixed ops/s per round | geometric mean [95%] | "
            "median | auto ops/s | fixed ops/s | auto p99, ms | fixed p99, ms | auto mean limit |",
            "| --- | --- | --- | ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
        ]
        for c in data["comparisons"]:
            cells = [c["part"], c["runner"], c["schema"], str(c["fixed"])]
            cells += [", ".join(f"{r:.3f}" for r in c["ratios"]), _interval(c), fmt(c["median"], digits=3)]
            cells += [fmt(c[key], digits=0) for key in ("auto_ops", "fixed_ops")]
            cells += [fmt(c[key], digits=1) for key in ("auto_p99_ms", "fixed_p99_ms", "auto_limit_mean")]
            lines.append(row(cells))
        lines += [
            "",
            "vs-best: the fixed limit is this pass's sweep's best (ops/s); auto runs on a pool of --limit "
            "connections with pool_use_lifo=True, as the auto-limit how-to recommends (a fixed limit L "
            "gets a pool of L).  latency-bound: units of pg_sleep(0.02) and a one-row insert, where the "
            "pool's capacity is the best fixed limit.  Rounds alternate which side runs first; the "
            "interval is Student's t on the logs of the rounds' ratios.",
            "",
        ]
    if nb := [m for m in rows if m.config.get("part") == "neighbour"]:
        capacity = max((int(m.config["pool_size"]) for m in nb if m.config["limit"] == "auto"), default=None)
        data["neighbour"] = summary = neighbour_summary(nb, capacity)
        phases = ", ".join(f"{name}: {a:.0f}-{b:.0f} s" for name, (a, b) in al.PHASES.items())
        rounds = max((m.config.get("round", 1) for m in nb), default=1)
        lines += [
            f"Neighbour: a second process with {al.NEIGHBOUR_CONNECTIONS} connections hammers the server "
            "from "
            f"{al.NEIGHBOUR_START_S:.0f} s to {al.NEIGHBOUR_STOP_S:.0f} s of a {al.NEIGHBOUR_TOTAL_S:.0f} s "
            f"run (indexed schema), through stream() and through run(), {rounds} round(s) each, the order "
            "turned around each round; ops/s and unit p99 of the units that finished in each phase "
            f"({phases}), medians over the rounds; the limit's median per phase, and how soon after the "
            "neighbour stopped auto's limit was back at 0.75x its median before (one overload cut), or "
            "at the sweep's best fixed limit if that is lower (the slowest round):",
            "",
            "| verb | L | before ops/s | p99, ms | during ops/s | p99, ms | after ops/s | p99, ms | "
            "limit before | limit during | back up after |",
            "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
        ]
        for name, s in summary["sides"].items():
            mode, limit = name.split(" ", 1)
            back = (
                "-"
                if "recovery_s" not in s
                else (f"{s['recovery_s']} s" if s["recovery_s"] is not None else "no")
            )
            cells = [mode, limit]
            for phase in ("before", "during", "after"):
                cells += [fmt(s[f"{phase}_ops"], digits=0), fmt(s[f"{phase}_p99_ms"], digits=1)]
            cells += [fmt(s["limit_before"], digits=0), fmt(s["limit_during"], digits=0), back]
            lines.append(row(cells))
        if summary["pairs"]:
            lines += [
                "",
                f"While the neighbour ran, auto over L={capacity}, per round: "
                + "; ".join(
                    f"{p['mode']} {p['round']}: p99 {p['p99']:.2f}x, ops/s {p['ops']:.2f}x"
                    for p in summary["pairs"]
                )
                + ".",
            ]
        lines += [
            "",
            "Chart: auto_limit.png (ops/s, unit p99 and the limit, per second; the first round through "
            "stream()).",
            "",
        ]
    return lines, data


def _interval(c: dict[str, Any]) -> str:
    """A comparison's geometric mean and its 95% interval, e.g. ``0.962 [0.931, 0.994]``."""
    ci = c.get("ci")
    return fmt(c.get("geomean"), digits=3) + ("" if not ci else f" [{ci[0]:.3f}, {ci[1]:.3f}]")


def targets(data: dict[str, Any], capacity: int) -> list[dict[str, Any]]:
    out = []
    for c in data.get("comparisons", []):
        if not c["goal"]:
            continue
        v = c.get("geomean", c["median"])  # runs rendered again from before 0.2's geometric mean
        what = f"{c['part']} {c['runner']} {c['schema']}"
        name = f"auto-limit: auto >= {TARGET_RATIO} of the best fixed limit: {what}"
        shown = (
            f"{_interval(c)} (geometric mean of {len(c['ratios'])} rounds' ratios and its 95% interval; "
            f"median {fmt(c['median'], digits=3)}; against L={c['fixed']})"
        )
        status = verdict(v, TARGET_RATIO)
        out.append({"target": name, "value": v, "status": status, "shown": shown})
    pairs = data.get("neighbour", {}).get("pairs", [])
    name = (
        f"auto-limit: neighbour: auto p99 <= {NEIGHBOUR_P99} x L={capacity}'s "
        f"at >= {NEIGHBOUR_OPS} of its ops/s"
    )
    if pairs:
        p99 = statistics.median(p["p99"] for p in pairs)
        ops = statistics.median(p["ops"] for p in pairs)
        ok = p99 <= NEIGHBOUR_P99 and ops >= NEIGHBOUR_OPS
        shown = (
            f"p99 {p99:.2f}x, ops/s {ops:.2f}x of L={capacity}'s while the neighbour ran "
            f"(medians of {len(pairs)} rounds, stream() and run())"
        )
        out.append({"target": name, "value": p99, "status": "PASS" if ok else "MISS", "shown": shown})
    else:
        out.append({"target": name, "value": None, "status": "n/a", "shown": "-"})
    autos = [s for key, s in data.get("neighbour", {}).get("sides", {}).items() if key.endswith(" auto")]
    name = f"auto-limit: the limit is back up within {RECOVERY_S:.0f} s after the neighbour stops"
    if autos:
        backs = [s.get("recovery_s") for s in autos]
        back = None if None in backs else max(b for b in backs if b is not None)
        status = "PASS" if back is not None and back <= RECOVERY_S else "MISS"
        shown = f"{back} s (the slowest round)" if back is not None else "not within the run"
    else:
        back, status, shown = None, "n/a", "-"
    out.append({"target": name, "value": back, "status": status, "shown": shown})
    return out


def chart(path: Path, rows: list[Measurement]) -> Path | None:
    """The neighbour runs: ops/s, unit p99 and the limit per second, the neighbour's time shaded."""
    rows = [
        m
        for m in _ok(rows)
        if m.config.get("part") == "neighbour" and m.extra.get("series")
        if m.config.get("mode", "stream") == "stream" and m.config.get("round", 1) == 1
    ]
    if not rows:
        return None
    fig, axes = plt.subplots(3, 1, figsize=(10, 9), sharex=True)
    for m in rows:
        name = f"L={m.config['limit']}"
        t = [s["t"] + 0.5 for s in m.extra["series"]]
        axes[0].plot(t, [s["ops"] for s in m.extra["series"]], label=name)
        axes[1].plot(t, [s["p99_ms"] for s in m.extra["series"]], label=name)
        limits = m.extra.get("limits", [])
        axes[2].step([x for x, _ in limits], [n for _, n in limits], where="post", label=name)
    for ax, ylabel in zip(axes, ("ops/s", "unit p99 per second, ms", "limit (every 100 ms)"), strict=True):
        ax.axvspan(al.NEIGHBOUR_START_S, al.NEIGHBOUR_STOP_S, color="grey", alpha=0.15)
        ax.set_ylabel(ylabel)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8, loc="upper right")
    axes[1].set_yscale("log")
    axes[2].set_xlabel("seconds since the stream started (shaded: the neighbour runs)")
    fig.suptitle("limit='auto' against fixed limits while a neighbour loads the server")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
