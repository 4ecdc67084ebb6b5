"""
The "Batches" section's tables (:mod:`.batching`): the rows of a group by side and round
(:class:`Grid`), their figures and per-round ratios, the tables of the sides, of the runs with
failing units and of the web path's two loops, and the notes under each.

A row shows the median of its rounds' figures, a ratio the median of its rounds' ratios (each of two
rows of one round) with their range; ``rows`` is ``ok`` only if every round left every good unit's
rows exactly once.
"""

from __future__ import annotations

import dataclasses
import operator
from collections.abc import Callable
from typing import Any

from ..measurement import Measurement
from ..scenarios._batching import LIMIT
from ..stats import median_of
from .tables import fmt, table

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
