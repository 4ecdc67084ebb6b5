"""
The report's "Batches" section and its goals (the ``batching`` and ``batching-sizes`` scenarios).

Every ratio is of two rows of one run: a side at ``batch=B`` over the same side at ``batch=None``
(the hand-written loop at B=1), a runner over its hand-written loop at the same size
(``SemaphoreRunner`` over ``hand``, asyncpg; ``ThreadOffloadRunner`` over ``hand-threads``,
psycopg), a run with 1% failing units over the clean run at the same size, and the web path with
``linger`` over ``batch=None``.  A row whose rows in the tables afterwards are not every good
unit's exactly once is a FAIL, whatever its speed.
"""

from __future__ import annotations

from typing import Any

from ..measurement import Measurement
from ..scenarios import batching as sc
from ..scenarios._batching import FAIL_SHARE, LIMIT, WORKLOADS
from .tables import fmt, table, verdict

#: The issue's goals: ``batch=B`` over one transaction per unit, per workload (B: its goal size).
SPEEDUP = {"log": 8.0, "creates": 2.3, "mix": 1.5}
#: A runner's batches over the hand-written loop at the same size.
OF_HAND = 0.95
#: Good units/s with 1% failing units over the clean run at the same size.
OF_CLEAN = 0.7
#: The web path's rows/s with ``linger`` over one transaction per request.
WEB_SPEEDUP = 5.0
#: Each runner side and its hand-written twin.
TWIN = {"semaphore": "hand", "threads": "hand-threads"}
RUNNER_NAME = {"semaphore": "SemaphoreRunner", "threads": "ThreadOffloadRunner"}


def _ok(m: Measurement | None) -> float | None:
    return m.ops_per_s if m is not None and not m.error and m.ops_per_s else None


def _ratio(a: Measurement | None, b: Measurement | None) -> float | None:
    x, y = _ok(a), _ok(b)
    return x / y if x and y else None


def _stat(m: Measurement, key: str) -> Any:
    """A RunStats figure of a runner side; for a hand-written side, its commits as batches."""
    stats = m.extra.get("runner_stats") or {}
    if key in stats:
        return stats[key]
    if m.config.get("side", "").startswith("hand"):
        return m.extra.get("commits") if key == "batches_committed" else 0
    return m.extra.get(key)


def rows_ok(m: Measurement) -> bool:
    return bool((m.extra.get("rows") or {}).get("ok")) and not m.error


def _rows_shown(m: Measurement) -> str:
    check = m.extra.get("rows")
    if not check:
        return "-"
    if check["ok"]:
        return "ok"
    found, expected = check["found"], check["expected"]
    wrong = [f"{k} {found[k]:,}/{v:,}" for k, v in expected.items() if found[k] != v]
    if found["log_distinct"] != found["log"]:
        wrong.append(f"log distinct {found['log_distinct']:,}")
    return "FAIL: " + ", ".join(wrong)


def _rerun(m: Measurement) -> str:
    value = _stat(m, "units_rerun")
    return "-" if value is None else f"{value:,}"


def _note(m: Measurement, fallback: str = "") -> str:
    return m.error.splitlines()[0][:80] if m.error else fallback


def _key(m: Measurement) -> tuple[Any, ...]:
    c = m.config
    return c.get("workload"), c.get("side"), c.get("batch"), bool(c.get("failing"))


class Grid:
    """The rows of one group, found by (workload, side, batch, failing)."""

    def __init__(self, rows: list[Measurement]) -> None:
        self.rows = rows
        self.by = {_key(m): m for m in rows}

    def get(self, workload: str, side: str, batch: int | None, failing: bool = False) -> Measurement | None:
        return self.by.get((workload, side, batch, failing))

    def base(self, m: Measurement) -> Measurement | None:
        """The same side at one transaction per unit (a hand-written side: ``hand`` at B=1)."""
        side = "hand" if m.config["side"].startswith("hand") else m.config["side"]
        return self.get(m.config["workload"], side, None)


def _grid_table(grid: Grid) -> list[str]:
    header = [
        "workload", "side", "batch", "units", "units/s", "x one txn/unit", "of hand-written", "commits",
        "rollbacks", "units re-run", "peak conns", "rows", "notes",
    ]  # fmt: skip
    body = []
    for m in grid.rows:
        if m.config.get("failing") or m.config.get("workload") == "web":
            continue
        w, side, batch = m.config["workload"], m.config["side"], m.config.get("batch")
        twin = grid.get(w, TWIN[side], batch) if side in TWIN and batch else None
        base = grid.base(m) if batch else None
        body.append([w, side, str(batch or "none"), f"{m.n:,}", fmt(m.ops_per_s, digits=0)])
        body[-1] += [fmt(_ratio(m, base), digits=2), fmt(_ratio(m, twin), digits=3)]
        body[-1] += [f"{m.extra.get('commits', 0):,}", f"{m.extra.get('rollbacks', 0):,}", _rerun(m)]
        body[-1] += [str(m.peak_connections or "-"), _rows_shown(m), _note(m)]
    return table(header, body, text_columns=3)


def _failing_table(grid: Grid) -> tuple[list[str], dict[str, Any]]:
    header = [
        "workload", "runner", "units", "failing", "good units/s", "clean units/s", "of clean", "failed",
        "units re-run", "commits", "rollbacks", "rows", "notes",
    ]  # fmt: skip
    body, data = [], {}
    for m in grid.rows:
        if not m.config.get("failing"):
            continue
        w, side, failing = m.config["workload"], m.config["side"], m.config["failing"]
        clean = grid.get(w, side, m.config["batch"])
        ratio = _ratio(m, clean)
        data[f"{w} {side}"] = {
            "of_clean": ratio,
            "rows_ok": rows_ok(m),
            "failed": m.failed,
            "failing": failing,
        }
        note = f"{m.failed} failed, {failing} meant to" if m.failed != failing else ""
        body.append([w, RUNNER_NAME[side], f"{m.n:,}", f"{failing:,}", fmt(m.ops_per_s, digits=0)])
        body[-1] += [fmt(_ok(clean), digits=0), fmt(ratio, digits=2), f"{m.failed:,}", _rerun(m)]
        body[-1] += [f"{m.extra.get('commits', 0):,}", f"{m.extra.get('rollbacks', 0):,}", _rows_shown(m)]
        body[-1].append(_note(m, note))
    return table(header, body, text_columns=2), data


def _web(rows: list[Measurement]) -> tuple[list[str], dict[str, Any]]:
    """The web path's table, and per concurrency and linger: the speed-up, p99 and its bound."""
    web = [m for m in rows if m.config.get("workload") == "web"]
    bases = {m.config.get("concurrency"): m for m in web if m.config.get("batch") is None}
    header = [
        "in flight", "variant", "requests", "rows/s", "x batch=none", "submit p50, ms", "submit p99, ms",
        "txn time p50, ms", "linger + 2 txn times, ms", "commits", "rows/commit", "rows", "notes",
    ]  # fmt: skip
    body = []
    data: dict[str, dict[str, Any]] = {}
    for m in sorted(web, key=lambda m: m.config.get("concurrency") or 0):
        c, linger, txn = m.config.get("concurrency"), m.config.get("linger"), m.extra.get("batch_p50_s")
        bound = linger + 2 * txn if linger is not None and txn is not None else None
        commits = m.extra.get("commits") or 0
        ratio = _ratio(m, bases.get(c)) if linger is not None else None
        if linger is not None:
            one = {"speedup": ratio, "p99_s": m.p99_s, "bound_s": bound, "rows_ok": rows_ok(m)}
            data.setdefault(str(c), {})[f"linger={linger * 1e3:g}ms"] = one
        body.append([str(c), m.label.split(" ", 3)[-1], f"{m.n:,}", fmt(m.ops_per_s, digits=0)])
        body[-1] += [fmt(ratio, digits=2), fmt(m.p50_s, 1e3, 2), fmt(m.p99_s, 1e3, 2), fmt(txn, 1e3, 2)]
        body[-1] += [fmt(bound, 1e3, 2), f"{commits:,}", fmt(m.succeeded / commits if commits else None)]
        body[-1] += [_rows_shown(m), _note(m, m.extra.get("first_error") or "")]
    return table(header, body, text_columns=2), data


def summary(rows: list[Measurement]) -> dict[str, Any]:
    """The goals' figures: speed-ups at the goal sizes, the runners over their hand-written twins."""
    grid = Grid(rows)
    out: dict[str, Any] = {"speedup": {}, "hand_speedup": {}, "of_hand": {}}
    for w in WORKLOADS:
        size = w.goal_size
        out["hand_speedup"][w.name] = _ratio(grid.get(w.name, "hand", size), grid.get(w.name, "hand", None))
        for side in TWIN:
            ratio = _ratio(grid.get(w.name, side, size), grid.get(w.name, side, None))
            out["speedup"][f"{w.name} {side}"] = ratio
    for (w, side, batch, failing), m in grid.by.items():
        if side in TWIN and batch and not failing and w != "web":
            out["of_hand"][f"{w} {side} {batch}"] = _ratio(m, grid.get(w, TWIN[side], batch))
    out["rows_failed"] = [m.label for m in rows if not rows_ok(m)]
    return out


def _goal(target: str, value: float | None, status: str, shown: str) -> dict[str, Any]:
    return {"target": f"batching: {target}", "value": value, "status": status, "shown": shown}


def _lowest(values: Any) -> float | None:
    return min((v for v in values if v is not None), default=None)


def _goals(data: dict[str, Any]) -> list[dict[str, Any]]:
    """The issue's goals, each PASS, MISS (FAIL: rows wrong) or n/a."""
    s = data.get("summary", {})
    out = []
    for w in WORKLOADS:
        got = {side: s.get("speedup", {}).get(f"{w.name} {side}") for side in TWIN}
        worst, goal = _lowest(got.values()), SPEEDUP[w.name]
        shown = ", ".join(f"{RUNNER_NAME[k]} {fmt(v, digits=2)}x" for k, v in got.items())
        hand = fmt(s.get("hand_speedup", {}).get(w.name), digits=2)
        target = f"{w.name} at batch={w.goal_size} >= {goal}x one transaction per unit, both runners"
        out.append(_goal(target, worst, verdict(worst, goal), f"{shown} (the hand-written loop: {hand}x)"))
    for side in TWIN:
        got = {k: v for k, v in s.get("of_hand", {}).items() if k.split()[1] == side}
        worst = _lowest(got.values())
        shown = ", ".join(f"{k.replace(f' {side} ', ' batch=')} {fmt(v, digits=3)}" for k, v in got.items())
        target = f"{RUNNER_NAME[side]}'s batches >= {OF_HAND} of the hand-written loop at the same size"
        out.append(_goal(target, worst, verdict(worst, OF_HAND), f"lowest {fmt(worst, digits=3)} ({shown})"))
    failing = data.get("failing", {})
    worst = _lowest(v["of_clean"] for v in failing.values())
    shown = ", ".join(f"{k} {fmt(v['of_clean'], digits=2)}" for k, v in failing.items())
    target = f"with 1% failing units, good units/s >= {OF_CLEAN} of the clean run at batch={sc.FAIL_SIZE}"
    out.append(_goal(target, worst, verdict(worst, OF_CLEAN), f"lowest {fmt(worst, digits=2)} ({shown})"))
    bad = s.get("rows_failed", [])
    status = "FAIL" if bad else ("PASS" if s else "n/a")
    shown = ("wrong in: " + "; ".join(bad)) if bad else "every row count as expected"
    target = "every good unit's rows committed exactly once, a failing unit's not at all, every measurement"
    out.append(_goal(target, len(bad), status, shown))
    for c, web in data.get("web", {}).items():
        worst = _lowest(v["speedup"] for v in web.values())
        shown = ", ".join(f"{k} {fmt(v['speedup'], digits=2)}x" for k, v in web.items())
        target = f"web path, {c} requests in flight: rows/s >= {WEB_SPEEDUP}x one transaction per request"
        out.append(_goal(target, worst, verdict(worst, WEB_SPEEDUP), shown or "-"))
        over = [v["p99_s"] / v["bound_s"] for v in web.values() if v["p99_s"] is not None and v["bound_s"]]
        shown = ", ".join(
            f"{k}: p99 {fmt(v['p99_s'], 1e3, 1)} ms, bound {fmt(v['bound_s'], 1e3, 1)} ms"
            for k, v in web.items()
        )
        worst = max(over, default=None)
        target = f"web path, {c} requests in flight: added latency p99 <= linger + 2 batch commit times"
        out.append(_goal(target, worst, verdict(worst, 1.0, at_most=True), shown or "-"))
    return out


#: What the section's tables show, under each.
NOTES = {
    "grid": "units/s: good units per second of the side's wall time; x one txn/unit: over the same side "
    "at batch=none (a hand-written side: over `hand` at B=1); of hand-written: a runner over its "
    "hand-written loop at the same size (`SemaphoreRunner` over `hand`, asyncpg; `ThreadOffloadRunner` "
    "over `hand-threads`, psycopg); commits and rollbacks: SQLAlchemy's engine events; units re-run: "
    "`RunStats.units_rerun`; rows: every good unit's rows exactly once (counted afterwards).",
    "failing": "A failing unit adds a request-log row whose unique key was seeded before the run: the "
    "post's ops flush it in the unit (the unit raises), a log row fails the batch's COMMIT (no unit "
    "named: the runner bisects).  of clean: good units/s over the clean run of the same runner, size "
    "and workload above.",
    "web": f"`SemaphoreRunner(limit={LIMIT})` (asyncpg); each of 'in flight' coroutines submits one log "
    "row after another (a closed loop: at most that many requests wait at once, so with `linger` a "
    "batch holds about that many rows and rows/s is at most in-flight / (linger + txn time)).  The "
    "latency a request adds is its whole `submit()` call; txn time: a transaction's first statement to "
    "its COMMIT done (session events), the median of the variant's.",
}


def section(rows: list[Measurement], sizes: list[Measurement]) -> tuple[list[str], dict[str, Any]]:
    """The section's Markdown lines and data (``rows``: the ``batching`` group's, ``sizes``: the sweep's)."""
    data: dict[str, Any] = {}
    lines = [f"## Batches (`batch=`, L={LIMIT})", ""]
    if rows:
        grid = Grid(rows)
        failing_lines, data["failing"] = _failing_table(grid)
        web_lines, data["web"] = _web(rows)
        data["summary"] = summary(rows)
        lines += [*_grid_table(grid), "", NOTES["grid"], ""]
        lines += [f"### With {FAIL_SHARE:.0%} of the units failing on a duplicate key (batch={sc.FAIL_SIZE})"]
        lines += ["", *failing_lines, "", NOTES["failing"], ""]
        lines += ["### The web path: many requests in flight, each submitting one log row"]
        lines += ["", *web_lines, "", NOTES["web"], ""]
    if sizes:
        lines += [
            f"### Batch sizes ({', '.join(str(b) for b in sc.SIZES)})",
            "",
            *_grid_table(Grid(sizes)),
            "",
        ]
        lines += [NOTES["grid"], ""]
        data["sizes"] = summary(sizes)
    if rows:
        data["goals"] = _goals(data)
        lines += [f"- {g['status']}: {g['target']} — {g['shown']}" for g in data["goals"]]
        lines.append("")
    return lines, data


def targets(data: dict[str, Any]) -> list[dict[str, Any]]:
    """The section's goals, for the report's targets."""
    return list(data.get("goals", []))
