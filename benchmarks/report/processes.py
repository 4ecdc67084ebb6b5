"""
The report's "Processes" section, its goals and its chart (the scenario:
:mod:`benchmarks.scenarios.processes`).

Per schema: each side's medians over the rounds (ops/s with start-up and shutdown, start-up, shutdown,
client and server CPU per op, peak server connections); per-round ratios of ops/s with their
geometric mean, 95% interval and median; and :mod:`.hosts`' model of how throughput would grow with
a bigger client host until the server saturates.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ..measurement import Measurement
from ..scenarios import processes as sc
from ..stats import geometric_mean, measured, median_of, per_round
from .charts import plt
from .hosts import PROCESS_SIDES, model, model_lines
from .tables import fmt, rounds, table, verdict

#: The goals: ProcessRunner(2) / one SemaphoreRunner on the indexed schema, ProcessRunner(2) / the
#: hand-written pool, the Dask LocalCluster / ProcessRunner(2); each the geometric mean of the rounds.
SPEEDUP, OF_HAND, DASK_OF_RUNNER = 1.4, 0.95, 0.8
#: The ratios the section gives: (numerator side, denominator side).
RATIOS = (
    ("process-2", "semaphore"),
    ("process-1", "semaphore"),
    ("process-4", "semaphore"),
    ("threads", "semaphore"),
    ("hand-written-2", "semaphore"),
    ("process-2", "hand-written-2"),
    ("dask-2", "process-2"),
)
SCHEMAS = ("faithful", "index")


def _map_ops(m: Measurement) -> float | None:
    """ops/s until map() returned: start-up included, shutdown left out."""
    until = (m.extra.get("startup_s") or 0.0) + (m.extra.get("run_s") or 0.0)
    return m.succeeded / until if until > 0 else None


def _per_op(m: Measurement, seconds: float | None) -> float | None:
    return None if seconds is None or not m.succeeded else seconds / m.succeeded * 1e3


def side_summary(rows: list[Measurement]) -> dict[str, Any]:
    """One side's medians over its rounds (CPU per op in ms), its worst peak and its failures."""
    ok = measured(rows)
    ops = [m.ops_per_s or 0.0 for m in ok]

    def med(get: Any) -> float | None:
        return median_of([get(m) for m in ok])

    return {
        "rounds": len(ok),
        "n": max((m.n for m in ok), default=0),
        "ops_per_s": median_of(ops),
        "ops_min": min(ops, default=None),
        "ops_max": max(ops, default=None),
        "map_ops_per_s": med(_map_ops),
        "steady_ops_per_s": med(lambda m: m.succeeded / m.extra["run_s"] if m.extra.get("run_s") else None),
        "startup_s": med(lambda m: m.extra.get("startup_s")),
        "all_started_s": med(lambda m: m.extra.get("all_started_s")),
        "shutdown_s": med(lambda m: m.extra.get("shutdown_s")),
        "client_cpu_s": med(lambda m: m.client_cpu_s),
        "client_ms_per_op": med(lambda m: _per_op(m, m.client_cpu_s)),
        "parent_ms_per_op": med(lambda m: _per_op(m, m.extra.get("parent_cpu_s"))),
        "workers_ms_per_op": med(lambda m: _per_op(m, m.extra.get("workers_cpu_s"))),
        "server_ms_per_op": med(lambda m: _per_op(m, m.server_cpu_s)),
        "peak_connections": max((m.peak_connections or 0 for m in ok), default=None),
        "units_per_process": [m.extra.get("units_per_process") for m in ok],
        "failed": sum(m.failed for m in rows),
        "errors": [f"{m.label}: {m.error}" for m in rows if m.error],
        "loadavg_1m": [m.extra["loadavg_1m"] for m in ok if "loadavg_1m" in m.extra],
    }


def ratio_summary(rows: list[Measurement], a: str, b: str) -> dict[str, Any]:
    """
    Per round ``a / b`` of ops/s (start-up and shutdown included), their geometric mean, its 95%
    interval and their median; and the geometric mean of the ratios of ops/s to map()'s return.
    """
    ratios = per_round(rows, a, b, lambda m: m.ops_per_s if not m.error else None)
    geomean, low, high = geometric_mean(ratios)
    before = per_round(rows, a, b, lambda m: _map_ops(m) if not m.error else None)
    return {
        "name": f"{a} / {b}",
        "ratios": [round(r, 3) for r in ratios],
        "geomean": geomean,
        "ci": None if low is None else [round(low, 3), round(high or 0.0, 3)],
        "median": median_of(ratios),
        "without_shutdown": geometric_mean(before)[0],
    }


def summary(rows: list[Measurement]) -> dict[str, Any]:
    """Per schema: each side's summary, the ratios, and the model."""
    out: dict[str, Any] = {}
    for schema in SCHEMAS:
        mine = [m for m in rows if m.schema == schema]
        if not mine:
            continue
        sides = {}
        for side in sc.SIDES:
            of_side = [m for m in mine if m.config.get("side") == side.key]
            if of_side:
                sides[side.key] = {"name": side.name, "processes": side.processes, **side_summary(of_side)}
        out[schema] = {
            "sides": sides,
            "ratios": {f"{a} / {b}": ratio_summary(mine, a, b) for a, b in RATIOS},
            "model": model(sides),
            "rounds": max((int(m.config.get("round", 0)) for m in mine), default=0),
        }
    return out


def _interval(r: dict[str, Any]) -> str:
    ci = r.get("ci")
    return fmt(r.get("geomean"), digits=3) + ("" if not ci else f" [{ci[0]:.3f}, {ci[1]:.3f}]")


def _sides_table(sides: dict[str, dict[str, Any]]) -> list[str]:
    header = [
        "side", "processes", "ops/s median (min-max)", "ops/s to map() return", "start-up, s",
        "all processes started, s", "shutdown, s", "client CPU ms/op (parent + workers)",
        "server CPU ms/op", "peak server conns", "units per process (round 1)", "notes",
    ]  # fmt: skip
    body = []
    for s in sides.values():
        notes = [e.splitlines()[0][:80] for e in s["errors"]] + (
            [f"{s['failed']} failed"] if s["failed"] else []
        )
        split = (
            f"{fmt(s['client_ms_per_op'], digits=2)} ({fmt(s['parent_ms_per_op'], digits=2)} + "
            f"{fmt(s['workers_ms_per_op'], digits=2)})"
        )
        units = s["units_per_process"][0] if s["units_per_process"] else None
        ops = f"{fmt(s['ops_per_s'], digits=0)} ({fmt(s['ops_min'], digits=0)}-{fmt(s['ops_max'], digits=0)})"
        times = [fmt(s[key], digits=2) for key in ("startup_s", "all_started_s", "shutdown_s")]
        body.append(
            [
                s["name"], str(s["processes"]), ops, fmt(s["map_ops_per_s"], digits=0), *times, split,
                fmt(s["server_ms_per_op"], digits=2), str(s["peak_connections"]),
                ", ".join(map(str, units or [])) or "-", "; ".join(notes),
            ]
        )  # fmt: skip
    return table(header, body, text_columns=2)


def _ratios_table(ratios: dict[str, dict[str, Any]]) -> list[str]:
    header = ["ratio of ops/s", "per round", "geometric mean [95%]", "median", "without shutdown", "notes"]
    body = [
        [
            r["name"],
            ", ".join(f"{x:.3f}" for x in r["ratios"]) or "-",
            _interval(r),
            fmt(r["median"], digits=3),
            fmt(r["without_shutdown"], digits=3),
            "",
        ]
        for r in ratios.values()
    ]
    return table(header, body)


def section(rows: list[Measurement]) -> tuple[list[str], dict[str, Any]]:
    """The section's Markdown lines, and its data: per schema, :func:`summary`."""
    data = summary(rows)
    k = max((s["rounds"] for s in data.values()), default=0)
    n = next((side["n"] for s in data.values() for side in s["sides"].values()), 0)
    out = [f"## Processes ({k} ABBA rounds, N={n:,} ops per side, L={sc.LIMIT} connections in all)", ""]
    for schema, s in data.items():
        out += [f"{schema} schema:", "", *_sides_table(s["sides"]), "", *_ratios_table(s["ratios"]), ""]
        out += model_lines(schema, s["model"])
    out += ["What each side runs (the same unit function, SQLAlchemy's default sessions, fresh tables):", ""]
    out += [f"- {side.name}: {side.what}" for side in sc.SIDES]
    out += [
        "",
        "Each side is timed from creating its runner, pool or engine to the end of its `with` block: "
        "ops/s include start-up and shutdown.  Start-up: until the first unit started; all processes "
        "started: until the last process started its first unit; shutdown: from `map()`'s return to "
        "the end of the block.  Client CPU: this process (the parent, an in-process runner's whole "
        "work, the sampler, Dask's scheduler) + its children that ended during the side + the Dask "
        "workers' processes; server CPU: the side's backends.  The Dask LocalCluster starts before "
        "the rounds, outside their timing.  Rounds run the sides forward, then in reverse; a ratio's "
        "interval is Student's t on the logs of its rounds' ratios; 'without shutdown' is the "
        "geometric mean of the same ratios of ops/s to `map()`'s return.  Chart: processes.png.",
        "",
    ]
    return out, data


def _goal(name: str, r: dict[str, Any] | None, goal: float) -> dict[str, Any]:
    value = r.get("geomean") if r else None
    if r and value is not None:
        shown = (
            f"{_interval(r)} (geometric mean over {rounds(len(r['ratios']))}"
            f"{' and its 95% interval' if r.get('ci') else ''}; "
            f"median {fmt(r['median'], digits=3)}; without shutdown {fmt(r['without_shutdown'], digits=3)})"
        )
    else:
        shown = "no round completed" if r else "did not run"
    status = verdict(value, goal)
    return {"target": name, "value": value, "status": status, "shown": shown}


def targets(data: dict[str, Any]) -> list[dict[str, Any]]:
    """The goals of issue 25's benchmark, each PASS, MISS or n/a."""
    index = data.get("index", {}).get("ratios", {})
    out = [
        _goal(
            f"processes: ProcessRunner(2) >= {SPEEDUP}x one SemaphoreRunner at L={sc.LIMIT}, start-up "
            "included, index schema",
            index.get("process-2 / semaphore") if "index" in data else None,
            SPEEDUP,
        )
    ]
    if "index" not in data:
        out[-1]["shown"] = "the index pass did not run (add --index)"
    for schema, s in data.items():
        ratios = s["ratios"]
        out.append(
            _goal(
                f"processes: ProcessRunner(2) >= {OF_HAND} of the hand-written pool of 2, {schema}",
                ratios.get("process-2 / hand-written-2"),
                OF_HAND,
            )
        )
        out.append(
            _goal(
                f"processes: Dask LocalCluster (2 workers) >= {DASK_OF_RUNNER} of ProcessRunner(2), {schema}",
                ratios.get("dask-2 / process-2"),
                DASK_OF_RUNNER,
            )
        )
    peaks = [(side["peak_connections"], key) for s in data.values() for key, side in s["sides"].items()]
    peaks = [(p, key) for p, key in peaks if p is not None]
    worst = max(peaks, default=None)
    name = f"processes: peak server connections <= limit ({sc.LIMIT}), every side and round"
    if worst is None:
        out.append({"target": name, "value": None, "status": "n/a", "shown": "-"})
    else:
        status = "PASS" if worst[0] <= sc.LIMIT else "MISS"
        shown = f"at most {worst[0]} ({worst[1]}), pg_stat_activity every 100 ms"
        out.append({"target": name, "value": worst[0], "status": status, "shown": shown})
    return out


def chart(path: Path, rows: list[Measurement]) -> Path | None:
    """ops/s against processes, one panel per schema; the in-process runners and the pools as references."""
    data = summary(measured(rows))
    if not data:
        return None
    fig, axes = plt.subplots(1, len(data), figsize=(6 * len(data), 4.5), squeeze=False)
    for ax, (schema, s) in zip(axes[0], data.items(), strict=True):
        sides = s["sides"]
        runs = [sides[k] for k in PROCESS_SIDES if k in sides]
        mid = [r["ops_per_s"] for r in runs]
        ax.errorbar(
            [r["processes"] for r in runs],
            mid,
            yerr=[
                [m - r["ops_min"] for m, r in zip(mid, runs, strict=True)],
                [r["ops_max"] - m for m, r in zip(mid, runs, strict=True)],
            ],
            marker="o",
            capsize=4,
            label="ProcessRunner(P)",
        )
        for key, style in (("semaphore", "--"), ("threads", ":")):
            if key in sides:
                ax.axhline(
                    sides[key]["ops_per_s"],
                    linestyle=style,
                    color="grey",
                    label=f"{sides[key]['name']} (in this process)",
                )
        for key, marker, dx in (("hand-written-2", "s", -0.06), ("dask-2", "^", 0.06)):
            if key in sides:
                ax.plot([2 + dx], [sides[key]["ops_per_s"]], marker, markersize=9, label=sides[key]["name"])
        ax.set_xticks([1, 2, 4])
        ax.set_xlabel("processes")
        ax.set_ylabel("ops/s, start-up and shutdown included (median, min-max)")
        ax.set_title(f"{schema} schema, L={sc.LIMIT} in all")
        ax.set_ylim(bottom=0)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8, loc="best")
    fig.suptitle(f"ops/s against processes ({rounds(s['rounds'])})")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
