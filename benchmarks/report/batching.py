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

The tables, and the figures and per-round ratios they and the goals are made of, are in
:mod:`._batching_tables`; here, the goals and the section.
"""

from __future__ import annotations

from typing import Any

from ..measurement import Measurement
from ..scenarios import batching as sc
from ..scenarios._batching import FAIL_SHARE, LIMIT, WORKLOADS
from ..stats import median_of
from ._batching_tables import (
    NOTES,
    ROUNDS_NOTE,
    RUNNER_NAME,
    TWIN,
    Grid,
    _closed,
    _failing_table,
    _grid_table,
    _open,
    _ratios,
    _shown,
)
from .tables import MACHINE_LIMIT, fmt, rounds, rows_ok, verdict

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
