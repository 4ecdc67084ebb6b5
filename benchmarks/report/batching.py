"""
The report's "Batches" section and its goals (the ``batching`` and ``batching-sizes`` scenarios).

Every ratio is of two rows of one round: a side at ``batch=B`` over the same side at ``batch=None``
(the hand-written loop at B=1), a runner over its hand-written loop at the same size
(``SemaphoreRunner`` over ``hand``, asyncpg; ``ThreadOffloadRunner`` over ``hand-threads``,
psycopg), a run with 1% failing units over the clean run at the same size, and the web path with
``linger`` over ``batch=None``.  With several rounds (``--batching-rounds``) a row shows the
median of its rounds' figures, and a ratio the median of the rounds' ratios with their range; the
goals take those medians.  A row whose rows in the tables afterwards are not every good unit's
exactly once, in any round, is a FAIL, whatever its speed.
"""

from __future__ import annotations

import dataclasses
import operator
from collections.abc import Callable
from typing import Any

from ..measurement import Measurement
from ..scenarios import batching as sc
from ..scenarios._batching import FAIL_SHARE, LIMIT, WORKLOADS
from ..stats import median_of
from .tables import MACHINE_LIMIT, fmt, rounds, rows_ok, table, verdict

#: The issue's goals: ``batch=B`` over one transaction per unit, per workload (B: its goal size). Set
#: from a hand-written loop on an earlier day: a run whose own hand-written loop misses one shows it as
#: the machine's limit, and the goal that decides is the speed-up against that loop's (:data:`OF_HAND`).
SPEEDUP = {"log": 8.0, "creates": 2.3, "mix": 1.5}
#: A runner's batches over the hand-written loop at the same size, and its speed-up over the loop's.
OF_HAND = 0.95
#: Good units/s with 1% failing units over the clean run at the same size; the goal holds where the
#: hand-written twin, which reruns a failed batch's units one by one, keeps at least HAND_KEEPS.
OF_CLEAN, HAND_KEEPS = 0.7, 0.75
#: The web path's rows/s with ``linger`` over one transaction per request (closed loop).
WEB_SPEEDUP = 5.0
#: Each runner side and its hand-written twin.
TWIN = {"semaphore": "hand", "threads": "hand-threads"}
RUNNER_NAME = {"semaphore": "SemaphoreRunner", "threads": "ThreadOffloadRunner"}
#: Every side's name in the tables.
SIDE_NAME = {**RUNNER_NAME, "hand": "hand-written loop", "hand-threads": "hand-written threads"}
#: A row's measurements, by round.
Rounds = dict[int, Measurement]
FIELDS = frozenset(f.name for f in dataclasses.fields(Measurement))


def _value(m: Measurement, key: str) -> Any:
    """A figure of ``m``: a field, ``units_rerun`` (RunStats; a hand-written side: 0), ``bound``,
    ``per_commit``, else from its extra or config."""
    if key == "units_rerun":
        stats = m.extra.get("runner_stats") or {}
        return stats.get(key, 0 if m.config.get("side", "").startswith("hand") else m.extra.get(key))
    if key == "bound":
        return _bound(m)
    if key == "per_commit":
        return m.succeeded / m.extra["commits"] if m.extra.get("commits") else None
    return getattr(m, key) if key in FIELDS else m.extra.get(key, m.config.get(key))


def _ratios(a: Rounds, b: Rounds, x: str = "ops_per_s", y: str | None = None,
            op: Callable[[float, float], float] = operator.truediv) -> list[float]:  # fmt: skip
    """Per round in which both ran: figure ``x`` of ``a``'s side over (``op``) figure ``y`` of ``b``'s."""
    pairs = [(m, b[r]) for r, m in sorted(a.items()) if r in b and not (m.error or b[r].error)]
    return [op(vx, vy) for m, n in pairs if (vx := _value(m, x)) is not None and (vy := _value(n, y or x))]


def _med(ms: Rounds, key: str) -> float | None:
    """The median of figure ``key`` over the rounds that ran."""
    return median_of(_value(m, key) for m in ms.values() if not m.error)


def _fig(ms: Rounds, key: str, scale: float = 1.0, digits: int = 1) -> str:
    return fmt(_med(ms, key), scale, digits)


def _n(ms: Rounds, key: str) -> str:
    return "-" if (value := _med(ms, key)) is None else f"{value:,.0f}"


def _shown(values: list[float], scale: float = 1.0, digits: int = 2, unit: str = "") -> str:
    """The median of per-round values, with their range if there are several: ``1.30x (1.21-1.38)``."""
    mid = median_of(values)
    if mid is None or len(values) < 2:
        return fmt(mid, scale, digits) + (unit if mid is not None else "")
    low, high = fmt(min(values), scale, digits), fmt(max(values), scale, digits)
    return f"{fmt(mid, scale, digits)}{unit} ({low}{' to ' if min(values) < 0 else '-'}{high})"


def _rows_shown(ms: Rounds) -> str:
    """``ok`` if every round left every good unit's rows exactly once; else the first wrong round's."""
    for r, m in sorted(ms.items()):
        check = m.extra.get("rows")
        if not check:
            return "-"
        if check["ok"]:
            continue
        found, expected = check["found"], check["expected"]
        wrong = [f"{k} {found[k]:,}/{v:,}" for k, v in expected.items() if found[k] != v]
        if found["log_distinct"] != found["log"]:
            wrong.append(f"log distinct {found['log_distinct']:,}")
        return f"FAIL{f' (round {r})' if len(ms) > 1 else ''}: " + ", ".join(wrong)
    return "ok"


def _notes(ms: Rounds, extra: Callable[[Measurement], str] = lambda m: "") -> str:
    """The first round's error (its first line) or ``extra`` note, with its round if there are several."""
    for r, m in sorted(ms.items()):
        if note := (m.error.splitlines()[0][:80] if m.error else extra(m)):
            return f"round {r}: {note}" if len(ms) > 1 else note
    return ""


def _key(m: Measurement) -> tuple[Any, ...]:
    c = m.config
    return (c.get("workload"), c.get("side"), c.get("batch"), bool(c.get("failing")), c.get("concurrency"),
            c.get("linger"))  # fmt: skip


class Grid:
    """The rows of one group by (workload, side, batch, failing, in flight, linger), each by round."""

    def __init__(self, rows: list[Measurement]) -> None:
        self.by: dict[tuple[Any, ...], Rounds] = {}
        for m in rows:
            self.by.setdefault(_key(m), {})[int(m.config.get("round", 1))] = m
        self.rounds = max((len(ms) for ms in self.by.values()), default=0)

    def get(self, workload: str, side: str, batch: int | None, failing: bool = False) -> Rounds:
        return self.by.get((workload, side, batch, failing, None, None), {})

    def items(self, *workloads: str) -> list[tuple[dict[str, Any], Rounds]]:
        """Each row of ``workloads`` (any: the batch workloads), as its first round's config and rounds."""
        return [(next(iter(ms.values())).config, ms) for key, ms in self.by.items()
                if (key[0] in workloads if workloads else key[0] not in ("web", "web-open"))]  # fmt: skip


def _grid_table(grid: Grid) -> list[str]:
    header = [
        "workload", "side", "batch", "units", "units/s", "x one txn/unit", "of hand-written", "commits",
        "rollbacks", "units re-run", "peak conns", "rows", "notes",
    ]  # fmt: skip
    body = []
    for c, ms in grid.items():
        if c.get("failing"):
            continue
        w, side, batch = c["workload"], c["side"], c.get("batch")
        base = grid.get(w, "hand" if side.startswith("hand") else side, None) if batch else {}
        twin = grid.get(w, TWIN[side], batch) if side in TWIN and batch else {}
        body.append([w, side, str(batch or "none"), f"{c['units']:,}", _fig(ms, "ops_per_s", digits=0)])
        body[-1] += [_shown(_ratios(ms, base)), _shown(_ratios(ms, twin), digits=3)]
        body[-1] += [_n(ms, "commits"), _n(ms, "rollbacks"), _n(ms, "units_rerun")]
        body[-1] += [str(max((m.peak_connections or 0 for m in ms.values()), default=0) or "-")]
        body[-1] += [_rows_shown(ms), _notes(ms)]
    return table(header, body, text_columns=3)


def _failing_table(grid: Grid) -> tuple[list[str], dict[str, Any]]:
    header = [
        "workload", "runner", "units", "failing", "good units/s", "clean units/s", "of clean", "failed",
        "units re-run", "commits", "rollbacks", "rows", "notes",
    ]  # fmt: skip
    body, data = [], {}
    for c, ms in grid.items():
        if not c.get("failing"):
            continue
        w, side, failing = c["workload"], c["side"], c["failing"]
        clean = grid.get(w, side, c["batch"])
        ratios = _ratios(ms, clean)
        data[f"{w} {side}"] = {"of_clean_rounds": ratios}

        def note(m: Measurement, failing: int = failing) -> str:
            return f"{m.failed} failed, {failing} meant to" if m.failed != failing else ""

        body.append([w, SIDE_NAME[side], f"{c['units']:,}", f"{failing:,}"])
        body[-1] += [_fig(ms, "ops_per_s", digits=0)]
        body[-1] += [_fig(clean, "ops_per_s", digits=0), _shown(ratios), _n(ms, "failed")]
        body[-1] += [_n(ms, "units_rerun"), _n(ms, "commits"), _n(ms, "rollbacks"), _rows_shown(ms)]
        body[-1].append(_notes(ms, note))
    return table(header, body, text_columns=2), data


def _variant(c: dict[str, Any]) -> str:
    linger = c.get("linger")
    return "batch=none" if linger is None else f"batch={c['batch']} linger={linger * 1e3:g}ms"


def _order(item: tuple[dict[str, Any], Rounds]) -> tuple[int, float]:
    """In flight, then batch=none first and the longer linger before the shorter."""
    c = item[0]
    return c.get("concurrency") or 0, -(c["linger"] if c.get("linger") is not None else 1.0)


def _first_error(m: Measurement) -> str:
    return m.extra.get("first_error") or ""


def _closed(grid: Grid) -> tuple[list[str], dict[str, Any]]:
    """The closed loop's table, and per in-flight count and variant: rows/s over batch=none."""
    header = [
        "in flight", "variant", "requests", "rows/s", "x batch=none", "submit p50, ms", "submit p99, ms",
        "txn time p50, ms", "commits", "rows/commit", "rows", "notes",
    ]  # fmt: skip
    body: list[list[str]] = []
    data: dict[str, dict[str, list[float]]] = {}
    bases = {c["concurrency"]: ms for c, ms in grid.items("web") if c.get("linger") is None}
    for c, ms in sorted(grid.items("web"), key=_order):
        ratios = _ratios(ms, bases.get(c["concurrency"], {})) if c.get("linger") is not None else []
        if c.get("linger") is not None:
            data.setdefault(str(c["concurrency"]), {})[f"linger={c['linger'] * 1e3:g}ms"] = ratios
        body.append([str(c["concurrency"]), _variant(c), f"{c['units']:,}", _fig(ms, "ops_per_s", digits=0)])
        body[-1] += [
            _shown(ratios),
            _fig(ms, "p50_s", 1e3),
            _fig(ms, "p99_s", 1e3),
            _fig(ms, "batch_p50_s", 1e3, 2),
        ]
        body[-1] += [_n(ms, "commits"), _fig(ms, "per_commit"), _rows_shown(ms), _notes(ms, _first_error)]
    return table(header, body, text_columns=2), data


def _bound(m: Measurement) -> float | None:
    """``linger`` + 2 batch transaction times (the p99 of the round's), for a batching variant."""
    txn, linger = m.extra.get("batch_p99_s"), m.config.get("linger")
    return linger + 2 * txn if linger is not None and txn is not None else None


def _open(grid: Grid) -> tuple[list[str], dict[str, Any]]:
    """The open loop's table, and per variant: p99, its bound, their ratio, the p99 added."""
    header = [
        "variant", "arrivals/s", "requests", "start lag p99, ms", "submit p50, ms", "submit p99, ms",
        "p99 added, ms", "txn time p50, ms", "txn time p99, ms", "linger + 2 txn p99, ms", "p99 / bound",
        "commits", "rows/commit", "rows", "notes",
    ]  # fmt: skip
    body, data = [], {}
    base = next((ms for c, ms in grid.items("web-open") if c.get("linger") is None), {})
    for c, ms in sorted(grid.items("web-open"), key=_order):
        batched = c.get("linger") is not None
        added = _ratios(ms, base, "p99_s", op=operator.sub) if batched else []
        over = _ratios(ms, ms, "p99_s", "bound") if batched else []
        if batched:
            data[f"linger={c['linger'] * 1e3:g}ms"] = {"p99_s": _med(ms, "p99_s"),
                "bound_s": _med(ms, "bound"), "of_bound_rounds": over, "added_p99_rounds": added}  # fmt: skip
        body.append([_variant(c), _fig(ms, "rate", digits=0), f"{c['units']:,}"])
        body[-1] += [_fig(ms, k, 1e3, 2) for k in ("start_lag_p99_s", "p50_s", "p99_s")]
        body[-1] += [_shown(added, 1e3) if batched else "-"]
        body[-1] += [_fig(ms, k, 1e3, 2) for k in ("batch_p50_s", "batch_p99_s", "bound")]
        body[-1] += [_shown(over) if batched else "-", _n(ms, "commits"), _fig(ms, "per_commit")]
        body[-1] += [_rows_shown(ms), _notes(ms, _first_error)]
    return table(header, body, text_columns=1), data


def summary(rows: list[Measurement]) -> dict[str, Any]:
    """
    The goals' figures, each the list of its rounds' ratios: speed-ups at the goal sizes (the runners'
    and the hand-written loop's), the runners over their hand-written twins at every size.
    """
    grid = Grid(rows)
    out: dict[str, Any] = {"rounds": grid.rounds, "speedup": {}, "hand_speedup": {}, "of_hand": {}}
    for w in WORKLOADS:
        size = w.goal_size
        out["hand_speedup"][w.name] = _ratios(grid.get(w.name, "hand", size), grid.get(w.name, "hand", None))
        for side in TWIN:
            out["speedup"][f"{w.name} {side}"] = _ratios(
                grid.get(w.name, side, size), grid.get(w.name, side, None)
            )
    for c, ms in grid.items():
        side, batch = c["side"], c.get("batch")
        if side in TWIN and batch and not c.get("failing"):
            out["of_hand"][f"{c['workload']} {side} {batch}"] = _ratios(
                ms, grid.get(c["workload"], TWIN[side], batch)
            )
    out["rows_failed"] = [m.label for m in rows if not rows_ok(m)]
    return out


#: The fewest rounds whose medians decide a goal: one round moves by 10% and more on 2 shared cores.
DECIDING_ROUNDS = 3


def _goal(target: str, got: dict[str, list[float]], goal: float, *, digits: int = 2, unit: str = "",
          at_most: bool = False, extra: str = "") -> dict[str, Any]:  # fmt: skip
    """
    A goal on the medians of ``got``'s per-round ratios (the worst decides), each shown with its
    range; not decided on fewer than :data:`DECIDING_ROUNDS` rounds (a plain run's one).
    """
    medians = [v for v in map(median_of, got.values()) if v is not None]
    worst = (max if at_most else min)(medians, default=None)
    shown = ", ".join(f"{k} {_shown(v, digits=digits, unit=unit)}" for k, v in got.items()) or "-"
    decided = max(map(len, got.values()), default=0) >= DECIDING_ROUNDS
    status = verdict(worst, goal, at_most=at_most, decided=decided)
    if not decided and worst is not None:
        extra += f"; fewer than {DECIDING_ROUNDS} rounds: `--scenario batching` decides"
    return {"target": f"batching: {target}", "value": worst, "status": status, "shown": shown + extra}


def _failing_goal(failing: dict[str, Any]) -> dict[str, Any]:
    """
    Each runner's good units/s with 1% failing units >= OF_CLEAN of its clean run; where it misses
    and its hand-written twin keeps less than HAND_KEEPS in the same rounds, the workload's limit.
    """
    got = {k: v["of_clean_rounds"] for k, v in failing.items() if k.split()[1] in TWIN}
    hand = {
        k: failing.get(f"{k.split()[0]} {TWIN[k.split()[1]]}", {}).get("of_clean_rounds", []) for k in got
    }
    extra = "; the hand-written twins: " + ", ".join(f"{k} {_shown(v)}" for k, v in hand.items() if v)
    target = (
        f"with 1% failing units, good units/s >= {OF_CLEAN} of the clean run at batch={sc.FAIL_SIZE}, "
        f"where the hand-written twin keeps >= {HAND_KEEPS}"
    )
    goal = _goal(target, got, OF_CLEAN, extra=extra if any(hand.values()) else "")
    missed = [k for k, v in got.items() if (median_of(v) or 0.0) < OF_CLEAN]
    if goal["status"] == "MISS" and all(hand[k] and (median_of(hand[k]) or 0.0) < HAND_KEEPS for k in missed):
        goal["status"] = MACHINE_LIMIT  # the hand-written twin keeps less too, in the same rounds
    return goal


def _goals(data: dict[str, Any]) -> list[dict[str, Any]]:
    """The issue's goals, each PASS, MISS (FAIL: rows wrong) or n/a, on the medians of the rounds."""
    s = data.get("summary", {})
    out = []
    for w in WORKLOADS:
        got = {RUNNER_NAME[k]: s.get("speedup", {}).get(f"{w.name} {k}", []) for k in TWIN}
        hand_rounds = s.get("hand_speedup", {}).get(w.name, [])
        hand = f" (the hand-written loop: {_shown(hand_rounds, unit='x')})"
        of_hand = {k: [r / h for r, h in zip(v, hand_rounds, strict=False) if h] for k, v in got.items()}
        target = (
            f"{w.name} at batch={w.goal_size}: both runners' speed-up over one transaction per unit "
            f">= {OF_HAND} of the hand-written loop's, round by round"
        )
        out.append(_goal(target, of_hand, OF_HAND, digits=3, extra=hand))
        target = (
            f"{w.name} at batch={w.goal_size} >= {SPEEDUP[w.name]}x one transaction per unit, both runners"
        )
        goal = _goal(target, got, SPEEDUP[w.name], unit="x", extra=hand)
        if goal["status"] == "MISS" and (median_of(hand_rounds) or 0.0) < SPEEDUP[w.name]:
            goal["status"] = MACHINE_LIMIT  # the hand-written loop misses it too, in the same rounds
        out.append(goal)
    for side in TWIN:
        got = {
            k.replace(f" {side} ", " batch="): v
            for k, v in s.get("of_hand", {}).items()
            if k.split()[1] == side
        }
        target = f"{RUNNER_NAME[side]}'s batches >= {OF_HAND} of the hand-written loop at the same size"
        out.append(_goal(target, got, OF_HAND, digits=3))
    out.append(_failing_goal(data.get("failing", {})))
    bad = s.get("rows_failed", [])
    shown = ("wrong in: " + "; ".join(bad)) if bad else "every row count as expected"
    target = "batching: every good unit's rows committed exactly once, a failing unit's not at all, "
    target += "every measurement"
    out.append({"target": target, "value": len(bad), "status": "FAIL" if bad else "PASS", "shown": shown})
    for c, web in data.get("web", {}).items():
        target = f"web path, {c} requests in flight: rows/s >= {WEB_SPEEDUP}x one transaction per request"
        out.append(_goal(target, web, WEB_SPEEDUP, unit="x"))
    if web_open := data.get("web_open"):
        figures = "; ".join(
            f"{k}: p99 {fmt(v['p99_s'], 1e3)} ms, bound {fmt(v['bound_s'], 1e3)} ms, "
            f"p99 minus batch=none's {_shown(v['added_p99_rounds'], 1e3, 1, ' ms')}"
            for k, v in web_open.items()
        )
        target = (
            "web path, requests at a steady rate: submit() p99 <= linger + 2 batch transaction times (p99)"
        )
        got = {k: v["of_bound_rounds"] for k, v in web_open.items()}
        out.append(_goal(target, got, 1.0, unit=" of the bound", at_most=True, extra=f" ({figures})"))
    return out


#: Under the heading of a run of several rounds.
ROUNDS_NOTE = (
    "Each row is the median of its {k} rounds' figures; each ratio (x one txn/unit, of hand-written, of "
    "clean, x batch=none, p99 added, p99 / bound) the median of the rounds' ratios (differences), each of "
    "two sides of one round, with their range (min-max) in parentheses.  Every group of sides ran in the "
    "opposite order of the round before.  rows: the counts of every round."
)
#: What the section's tables show, under each.
NOTES = {
    "grid": "units/s: good units per second of the side's wall time; x one txn/unit: over the same side "
    "at batch=none (a hand-written side: over `hand` at B=1); of hand-written: a runner over its "
    "hand-written loop at the same size (`SemaphoreRunner` over `hand`, asyncpg; `ThreadOffloadRunner` "
    "over `hand-threads`, psycopg); commits and rollbacks: SQLAlchemy's engine events; units re-run: "
    "`RunStats.units_rerun`; rows: every good unit's rows exactly once (counted afterwards).",
    "failing": "A failing unit adds a request-log row whose unique key was seeded before the run: the "
    "post's ops flush it in the unit (the unit raises), a log row fails the batch's COMMIT (no unit "
    "named: the runner bisects).  The hand-written twins rerun a failed batch's units one transaction "
    "each.  of clean: good units/s over the clean run of the same side, size and workload above.",
    "closed": f"`SemaphoreRunner(limit={LIMIT})` (asyncpg); each of 'in flight' coroutines submits one log "
    "row after another: a closed loop, always saturated, for the rows/s only (with `linger`, rows/s is "
    "at most in-flight / (linger + txn time)); its submit() latencies are queueing behind the other "
    "requests in flight, not the latency goal's.  txn time: a transaction's first statement to its "
    "COMMIT done (session events).",
    "open": "Requests arrive as a Poisson process (seeded; every variant of a round gets the same arrival "
    "times) at half the slower batch=none closed-loop rows/s of the same round, each started as a task at "
    "its arrival time whatever the earlier ones are doing, and each awaiting one `submit()` of one log row: "
    "one transaction per request keeps up with room to spare.  start lag: how late a request started after "
    "its arrival time (the event loop's delay).  submit: the time a request spends on logging.  p99 added: "
    "the variant's p99 minus batch=none's, per round.  The bound is linger + 2 batch transaction times at "
    "the transactions' p99: a request waits at most linger, or for a batch in progress on the slot it needs, "
    "then for its own batch, and at the 99th percentile either transaction may be a slow one; p99 / bound: "
    "per round, at most 1 passes.",
}


def section(rows: list[Measurement], sizes: list[Measurement]) -> tuple[list[str], dict[str, Any]]:
    """The section's Markdown lines and data (``rows``: the ``batching`` group's, ``sizes``: the sweep's)."""
    data: dict[str, Any] = {}
    grid = Grid(rows)
    lines = [f"## Batches (`batch=`, L={LIMIT}{f', {rounds(grid.rounds)}' if grid.rounds > 1 else ''})", ""]
    lines += [ROUNDS_NOTE.format(k=grid.rounds), ""] if grid.rounds > 1 else []
    if rows:
        failing_lines, data["failing"] = _failing_table(grid)
        closed_lines, data["web"] = _closed(grid)
        open_lines, data["web_open"] = _open(grid)
        data["summary"] = summary(rows)
        lines += [*_grid_table(grid), "", NOTES["grid"], ""]
        lines += [f"### With {FAIL_SHARE:.0%} of the units failing on a duplicate key (batch={sc.FAIL_SIZE})"]
        lines += ["", *failing_lines, "", NOTES["failing"], ""]
        lines += ["### The web path, throughput: many requests in flight, each submitting one log row"]
        lines += ["", *closed_lines, "", NOTES["closed"], ""]
        if data["web_open"]:  # (a run before the open loop has none)
            lines += [
                "### The web path, latency: requests arriving at a steady rate, each submitting one log row"
            ]
            lines += ["", *open_lines, "", NOTES["open"], ""]
    if sizes:
        lines += [f"### Batch sizes ({', '.join(str(b) for b in sc.SIZES)})", "", *_grid_table(Grid(sizes))]
        lines += ["", NOTES["grid"], ""]
        data["sizes"] = summary(sizes)
    if rows:
        data["goals"] = _goals(data)
        lines += [f"- {g['status']}: {g['target']} — {g['shown']}" for g in data["goals"]]
        lines.append("")
    return lines, data


def targets(data: dict[str, Any]) -> list[dict[str, Any]]:
    """The section's goals, for the report's targets."""
    return list(data.get("goals", []))
