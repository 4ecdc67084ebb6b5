"""
The report's "Load: rows that miss a parent" section and its goal (the ``load-parents`` scenario).

Per driver, per round: ``load()``'s rows/s over the hand-written staging import's, of the same round.
The goal (issue #55) is decided on the median of the rounds; with fewer than 3 rounds within the ±10% a
round moves of it, it is not decided. A side whose rows afterwards are wrong, in any round, is a FAIL.
"""

from __future__ import annotations

from typing import Any

from ..measurement import Measurement
from ..scenarios import load_parents as sc
from ..stats import median_of
from .tables import NOISE, fmt, rounds, rows_ok, table, verdict

#: load() at least this share of the staging import's rows/s (issue #55).
GOAL = 0.7
DRIVERS = {
    "psycopg": "psycopg 3 (`ThreadOffloadRunner.load_sync`)",
    "asyncpg": "asyncpg (`SemaphoreRunner.load`)",
}


def _by(rows: list[Measurement]) -> dict[tuple[str, str], dict[int, Measurement]]:
    out: dict[tuple[str, str], dict[int, Measurement]] = {}
    for m in rows:
        if not m.error:
            key = (str(m.config.get("driver")), str(m.config.get("kind")))
            out.setdefault(key, {})[int(m.config.get("round", 1))] = m
    return out


def section(rows: list[Measurement]) -> tuple[list[str], dict[str, Any]]:
    """The section's Markdown lines and data."""
    by = _by(rows)
    k = max((int(m.config.get("round", 1)) for m in rows), default=1)
    n = next((m.config.get("rows_in") for m in rows), None)
    missing = next((m.config.get("missing") for m in rows), None)
    lines = [
        f"## Load: rows that miss a parent ({n:,} orders, {missing:,} naming a missing customer, {rounds(k)})"
        if n and missing
        else "## Load: rows that miss a parent",
        "",
        f"`load()` on {sc.LIMIT} connections against the staging import a DBA writes on one: `COPY` into a "
        "temporary table, one `INSERT ... SELECT` of the rows whose customer exists. `load()` also "
        "reports each refused row with its reason; the staging import leaves them out unsaid.",
        "",
    ]
    body: list[list[str]] = []
    data: dict[str, Any] = {"ratios": {}, "goals": []}
    for driver, title in DRIVERS.items():
        load, staging = by.get((driver, "load"), {}), by.get((driver, "staging"), {})
        ratios = [
            (load[r].ops_per_s or 0) / (staging[r].ops_per_s or 1)
            for r in sorted(load.keys() & staging.keys())
            if staging[r].ops_per_s
        ]
        data["ratios"][driver] = ratios
        for kind, ms in (("staging import", staging), ("load()", load)):
            speeds = [m.ops_per_s or 0 for m in ms.values()]
            right = all(rows_ok(m) and m.extra.get("rejected_all_right", True) for m in ms.values())
            shown_rows = "rows right" if right else "FAIL: rows"
            body.append([title, kind, fmt(median_of(speeds), digits=0), shown_rows])
        mid = median_of(ratios)
        decided = mid is None or len(ratios) >= 3 or abs(mid / GOAL - 1) > NOISE
        shown = ", ".join(f"{r:.2f}" for r in ratios) or "-"
        data["goals"].append(
            {
                "target": f"load-parents: {driver}, load() >= {GOAL} of the hand-written staging import",
                "value": mid,
                "status": verdict(mid, GOAL, decided=decided),
                "shown": f"median {fmt(mid, digits=2)} (rounds: {shown})",
            }
        )
    lines += table(["driver", "side", "rows/s (median)", "rows"], body, text_columns=2)
    lines += [""] + [f"- {g['status']}: {g['target']} — {g['shown']}" for g in data["goals"]]
    return [*lines, ""], data


def targets(data: dict[str, Any]) -> list[dict[str, Any]]:
    """The section's goals, for the report's targets."""
    return list(data.get("goals", []))
