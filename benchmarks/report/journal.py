"""
The report's "Journal" section and its goals (the ``journal`` scenario).

The overhead ratio is of two rows of one round: a runner's journalled ``map()`` over the same
runner's ``map()`` without a journal, on the same ops; with several rounds (``--journal-rounds``) a
row shows the median of its rounds' figures, and the ratio the median of the rounds' ratios with
their range.  The resume goal takes each runner's median skipped items/s over the rounds (the table
analyzed), and the rerun right after the run its one measurement.  A row whose counts afterwards
are wrong (journal rows, the post's rows, units called, items skipped), in any round, is a FAIL.
"""

from __future__ import annotations

from typing import Any

from ..measurement import Measurement
from ..scenarios import journal as sc
from ..stats import median_of
from .tables import NOISE, fmt, rounds, rows_ok, rows_shown, table, verdict

Rounds = dict[int, Measurement]


def _by(rows: list[Measurement], part: str, *keys: str) -> dict[tuple[Any, ...], Rounds]:
    """The rows of ``part`` by the config values of ``keys``, each by round."""
    out: dict[tuple[Any, ...], Rounds] = {}
    for m in rows:
        if m.config.get("part") == part:
            out.setdefault(tuple(m.config.get(k) for k in keys), {})[int(m.config.get("round", 1))] = m
    return out


def _med(ms: Rounds, get: Any) -> float | None:
    return median_of(get(m) for m in ms.values() if not m.error)


def _per_unit(m: Measurement, value: float | None, scale: float) -> float | None:
    done = m.succeeded or 0
    return value * scale / done if value is not None and done else None


def _shown(values: list[float], digits: int = 2) -> str:
    """The median of per-round values, with their range if there are several: ``0.93 (0.90-0.95)``."""
    mid = median_of(values)
    if mid is None or len(values) < 2:
        return fmt(mid, digits=digits)
    return f"{fmt(mid, digits=digits)} ({fmt(min(values), digits=digits)}-{fmt(max(values), digits=digits)})"


def _ratios(a: Rounds, b: Rounds) -> list[float]:
    """Per round in which both ran: ``a``'s units/s over ``b``'s."""
    return [
        m.ops_per_s / b[r].ops_per_s
        for r, m in sorted(a.items())
        if r in b and not (m.error or b[r].error) and m.ops_per_s and b[r].ops_per_s
    ]


def _notes(ms: Rounds) -> str:
    for r, m in sorted(ms.items()):
        note = m.error.splitlines()[0][:80] if m.error else ""
        note = note or (f"{m.failed} failed: {m.extra.get('first_error', '')[:60]}" if m.failed else "")
        if m.extra.get("stopped"):
            note = note or f"stopped after {m.config.get('cap_s'):g} s"
        if note:
            return f"round {r}: {note}" if len(ms) > 1 else note
    return ""


def _overhead(rows: list[Measurement]) -> tuple[list[str], dict[str, list[float]]]:
    header = [
        "runner", "side", "units", "units/s", "journal / no journal", "p50, ms", "p99, ms",
        "client CPU, ms/unit", "server CPU, ms/unit", "commits", "lookups", "peak conns", "rows", "notes",
    ]  # fmt: skip
    by = _by(rows, "overhead", "runner", "journalled")
    body, data = [], {}
    for runner in sc.RUNNERS:
        plain = by.get((runner, False), {})
        for journalled in (False, True):
            ms = by.get((runner, journalled), {})
            if not ms:
                continue
            ratios = _ratios(ms, plain) if journalled else []
            if journalled:
                data[sc.RUNNER_NAME[runner]] = ratios
            first = next(iter(ms.values()))
            body.append([sc.RUNNER_NAME[runner], "journal" if journalled else "no journal"])
            body[-1] += [
                f"{first.config.get('units', first.n):,}",
                fmt(_med(ms, lambda m: m.ops_per_s), digits=0),
            ]
            body[-1] += [_shown(ratios, 3) if journalled else "-"]
            body[-1] += [fmt(_med(ms, lambda m: m.p50_s), 1e3), fmt(_med(ms, lambda m: m.p99_s), 1e3)]
            body[-1] += [fmt(_med(ms, lambda m: _per_unit(m, m.client_cpu_s, 1e3)), digits=2)]
            body[-1] += [fmt(_med(ms, lambda m: _per_unit(m, m.server_cpu_s, 1e3)), digits=2)]
            body[-1] += [fmt(_med(ms, lambda m: m.extra.get("commits")), digits=0)]
            body[-1] += [fmt(_med(ms, lambda m: m.extra.get("lookups")), digits=0) if journalled else "-"]
            body[-1] += [str(max((m.peak_connections or 0 for m in ms.values()), default=0) or "-")]
            body[-1] += [rows_shown(ms, none_wrong="none skipped"), _notes(ms)]
    return table(header, body, text_columns=2), data


def _resume_row(what: str, runner: str, ms: Rounds) -> list[str]:
    first = next(iter(ms.values()))
    share = _med(ms, lambda m: m.extra["lookup_total_s"] / m.wall_s if m.wall_s else None)
    row = [what, sc.RUNNER_NAME[runner], f"{first.config.get('units', first.n):,}"]
    row += [fmt(_med(ms, lambda m: m.succeeded), digits=0), fmt(_med(ms, lambda m: m.wall_s), digits=2)]
    row += [fmt(_med(ms, lambda m: m.ops_per_s), digits=0)]
    row += [fmt(_med(ms, lambda m: m.extra.get("lookups")), digits=0)]
    row += [fmt(_med(ms, lambda m: m.extra.get("lookup_p50_s")), 1e3, 2)]
    row += [fmt(_med(ms, lambda m: m.extra.get("lookup_max_s")), 1e3, 0)]
    row += [fmt(share, 100, 0) + ("%" if share is not None else "")]
    row += [fmt(_med(ms, lambda m: _per_unit(m, m.client_cpu_s, 1e6)), digits=1)]
    row += [
        fmt(_med(ms, lambda m: m.extra.get("calls")), digits=0),
        rows_shown(ms, none_wrong="none skipped"),
        _notes(ms),
    ]
    return row


def _resume(rows: list[Measurement]) -> tuple[list[str], dict[str, Any]]:
    header = [
        "run", "runner", "done items", "items", "time, s", "items/s", "lookups", "lookup p50, ms",
        "lookup max, ms", "lookups' share of time", "client CPU, µs/item", "units called", "rows", "notes",
    ]  # fmt: skip
    body: list[list[str]] = []
    data: dict[str, Any] = {"fresh": {}, "analyzed": {}}
    for (runner,), ms in _by(rows, "fill", "runner").items():
        body.append(_resume_row("first run (fill)", runner, ms))
        data["fill_per_s"] = _med(ms, lambda m: m.ops_per_s)
    resumed = _by(rows, "resume", "state", "runner")
    for state, what in (("fresh", "rerun right after the run"), ("analyzed", "rerun, the table analyzed")):
        for runner in sc.RUNNERS:
            if ms := resumed.get((state, runner)):
                body.append(_resume_row(what, runner, ms))
                data[state][sc.RUNNER_NAME[runner]] = [
                    m.ops_per_s for _, m in sorted(ms.items()) if m.ops_per_s
                ]
    return table(header, body, text_columns=2), data


def _goal(target: str, got: dict[str, list[float]], goal: float, *, digits: int, unit: str = "",
          extra: str = "") -> dict[str, Any]:  # fmt: skip
    """A goal on the medians of ``got``'s per-round figures, the worst deciding; not decided where
    fewer than 3 rounds land within the noise of the goal."""
    medians = [v for v in map(median_of, got.values()) if v is not None]
    worst = min(medians, default=None)
    k = min((len(v) for v in got.values() if v), default=0)
    decided = worst is None or k >= 3 or abs(worst / goal - 1) > NOISE
    shown = ", ".join(f"{name} {_shown(v, digits)}{unit}" for name, v in got.items()) or "-"
    if not decided:
        shown += f" (within the ±{NOISE:.0%} a round moves of the goal: decide it with --journal-rounds 3)"
    status = verdict(worst, goal, decided=decided)
    return {"target": f"journal: {target}", "value": worst, "status": status, "shown": shown + extra}


def _goals(data: dict[str, Any], rows: list[Measurement]) -> list[dict[str, Any]]:
    m_items = next((m.config["units"] for m in rows if m.config.get("part") == "resume"), None)
    done = f"{m_items:,}" if m_items else "M"
    out = [
        _goal(
            f"a journalled map() >= {sc.OF_PLAIN} of the same map() without one (units/s; the post's ops, "
            "L, both runners)",
            data.get("overhead", {}),
            sc.OF_PLAIN,
            digits=3,
        ),
        _goal(
            f"a rerun of a job of {done} done items skips >= {sc.SKIPS_PER_S:,} items/s (the table analyzed, "
            "both runners)",
            data.get("resume", {}).get("analyzed", {}),
            sc.SKIPS_PER_S,
            digits=0,
            unit="/s",
        ),
        _goal(
            f"the same rerun right after the run, before the table's statistics (stopped after "
            f"{sc.FRESH_CAP_S:g} s), >= {sc.SKIPS_PER_S:,} items/s",
            data.get("resume", {}).get("fresh", {}),
            sc.SKIPS_PER_S,
            digits=0,
            unit="/s",
        ),
    ]
    bad = [m.label for m in rows if not rows_ok(m)]
    shown = ("wrong or failed in: " + "; ".join(bad)) if bad else "every count as expected"
    target = "journal: one journal row per unit run and the post's rows, no unit called on a rerun, every "
    target += "done item skipped; every measurement"
    out.append({"target": target, "value": len(bad), "status": "FAIL" if bad else "PASS", "shown": shown})
    return out


#: What the section's tables show, under each.
NOTES = {
    "overhead": "Each side runs `map(fn, items)` over the post's ops as items `(i, op)` on fresh tables, "
    "with "
    "`journal=Journal(job, key=lambda item: item[0])` (its job forgotten before the side, so that every item "
    "runs) or without; each runner's two sides are neighbours in every round, and swap places from round to "
    "round.  journal / no journal: per round, units/s of the journalled side over the other's.  Server CPU: "
    "the side's backends (/proc).  commits: SQLAlchemy's engine events; lookups: the journal's SELECTs of "
    "keys.  rows: one journal row per item and the post's rows of its creates (counted afterwards).",
    "resume": "The first run journals every item with a no-op unit (`SemaphoreRunner`, `batch=500`); each "
    "rerun runs the same `map()` again, every item done, so no unit is called (units called: 0).  Right "
    "after the run the table has no statistics yet (autovacuum is off on it; it would analyze it within a "
    "minute or so, and not for long where other jobs' rows outnumber the new job's by 10 to 1); that rerun "
    "is "
    "stopped after {cap:g} s, and its items are those skipped by then.  Then the table is analyzed, and each "
    "round reruns the whole job on both runners.  items/s: items run (first run) or skipped (reruns) per "
    "second of wall time; lookups' share: the time in the journal's SELECTs over the wall time; client CPU: "
    "this process's, per item.",
}
ROUNDS_NOTE = (
    "Each row is the median of its {k} rounds' figures; journal / no journal the median of the rounds' "
    "ratios, each of two sides of one round, with their range (min-max) in parentheses.  Every round ran its "
    "sides in the opposite order of the round before.  rows: the counts of every round."
)


def section(rows: list[Measurement]) -> tuple[list[str], dict[str, Any]]:
    """The section's Markdown lines and data."""
    data: dict[str, Any] = {}
    k = max((int(m.config.get("round", 1)) for m in rows if m.config.get("state") != "fresh"), default=1)
    limit = next((m.config["limit"] for m in rows if "limit" in m.config), "L")
    heading = f"## Journal (`map(..., journal=)`, L={limit}{f', {rounds(k)}' if k > 1 else ''})"
    lines = [heading, "", *([ROUNDS_NOTE.format(k=k), ""] if k > 1 else [])]
    overhead_lines, data["overhead"] = _overhead(rows)
    resume_lines, data["resume"] = _resume(rows)
    lines += ["### Overhead: the post's ops with a journal and without", "", *overhead_lines, ""]
    lines += [NOTES["overhead"], ""]
    lines += ["### Resume: a job's rerun, every item done", "", *resume_lines, ""]
    lines += [NOTES["resume"].format(cap=sc.FRESH_CAP_S), ""]
    data["goals"] = _goals(data, rows)
    lines += [f"- {g['status']}: {g['target']} — {g['shown']}" for g in data["goals"]]
    return [*lines, ""], data


def targets(data: dict[str, Any]) -> list[dict[str, Any]]:
    """The section's goals, for the report's targets."""
    return list(data.get("goals", []))
