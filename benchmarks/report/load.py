"""
The report's "Load" section and its goals (the ``load`` scenario).

Each ratio is of two rows of one round (rows/s over rows/s); with several rounds (``--load-rounds``)
a row shows the median of its rounds' figures, and a ratio the median of the rounds' ratios with
their range.  A goal is not decided where fewer than 3 rounds land within the ±10% a round moves of
it.  A row whose rows afterwards are wrong (a good row missing or twice, a duplicate loaded, a
report's counts), in any round, is a FAIL.
"""

from __future__ import annotations

from typing import Any

from ..measurement import Measurement
from ..scenarios import load as sc
from ..stats import median_of
from .tables import NOISE, fmt, rounds, rows_ok, rows_shown, table, verdict

Rounds = dict[int, Measurement]
Key = tuple[str, str, str, Any, bool, bool]

#: The tables' groups: (title, driver, workload), and the sides each shows, in order.
GROUPS = (
    ("PostgreSQL, asyncpg (`SemaphoreRunner(limit=8).load`)", "asyncpg", "log"),
    ("PostgreSQL, asyncpg: the post's creates as rows of `a`", "asyncpg", "creates"),
    ("PostgreSQL, psycopg 3 (`ThreadOffloadRunner(limit=8).load_sync`)", "psycopg", "log"),
    ("MariaDB, aiomysql (`SemaphoreRunner(limit=8).load`)", "aiomysql", "log"),
    ("SQLite, pysqlite (`ThreadOffloadRunner(limit=1).load_sync`)", "pysqlite", "log"),
)
WHAT = {
    "hand": "hand-written loop",
    "hand-values": "hand-written multi-row INSERT loop",
    "staging": "hand-written staging table + ON CONFLICT DO NOTHING",
    "load": "load()",
    "orm-batch": "ORM units, batch=500",
    "orm-single": "ORM units, one transaction per row",
}


def key_of(m: Measurement) -> Key:
    c = m.config
    return (
        c.get("driver"),
        c.get("workload"),
        c.get("kind"),
        c.get("batch"),
        bool(c.get("journal")),
        bool(c.get("duplicates")),
    )


def _by(rows: list[Measurement]) -> dict[Key, Rounds]:
    out: dict[Key, Rounds] = {}
    for m in rows:
        if m.config.get("kind") not in (None, "prep"):
            out.setdefault(key_of(m), {})[int(m.config.get("round", 1))] = m
    return out


def _med(ms: Rounds, get: Any) -> float | None:
    return median_of(get(m) for m in ms.values() if not m.error)


def _ratios(a: Rounds, b: Rounds) -> list[float]:
    """Per round in which both ran: ``a``'s rows/s over ``b``'s."""
    return [
        m.ops_per_s / b[r].ops_per_s
        for r, m in sorted(a.items())
        if r in b and not (m.error or b[r].error) and m.ops_per_s and b[r].ops_per_s
    ]


def _shown(values: list[float], digits: int = 2, unit: str = "") -> str:
    mid = median_of(values)
    if mid is None or len(values) < 2:
        return fmt(mid, digits=digits) + (unit if mid is not None else "")
    low, high = fmt(min(values), digits=digits), fmt(max(values), digits=digits)
    return f"{fmt(mid, digits=digits)}{unit} ({low}-{high})"


def _notes(ms: Rounds) -> str:
    for r, m in sorted(ms.items()):
        note = m.error.splitlines()[0][:80] if m.error else ""
        if note:
            return f"round {r}: {note}" if len(ms) > 1 else note
    return ""


def _per_row(m: Measurement, value: float | None) -> float | None:
    done = m.succeeded or 0
    return value * 1e6 / done if value is not None and done else None


def _gc_runs(m: Measurement) -> int | None:
    """How many times the garbage collector ran while the side ran, if the run recorded it."""
    runs = m.extra.get("gc_collections")
    return None if runs is None else sum(runs)


def _side_name(key: Key) -> str:
    _, _, kind, batch, journal, dups = key
    name = WHAT.get(kind, kind)
    if kind in ("load", "hand", "staging") and batch != sc.BATCH:
        name += f" batch={batch:,}"
    if journal:
        name += " + journal"
    if dups:
        name += ", 1% duplicate keys"
    return name


def _group_table(by: dict[Key, Rounds], driver: str, workload: str) -> tuple[list[str], dict[str, Any]]:
    header = [
        "side",
        "rows",
        "rows/s",
        "/ hand-written",
        "/ load()",
        "client CPU, µs/row",
        "server CPU, µs/row",
        "GC runs",
        "transactions",
        "peak conns",
        "rows",
        "notes",
    ]
    keys = [k for k in by if k[0] == driver and k[1] == workload]
    order = {"hand": 0, "hand-values": 1, "load": 2, "staging": 3, "orm-batch": 4, "orm-single": 5}
    keys.sort(key=lambda k: (order.get(k[2], 9), k[5], k[4], k[3] or 0))
    hand = by.get((driver, workload, "hand", sc.BATCH, False, False), {})
    plain = by.get((driver, workload, "load", sc.BATCH, False, False), {})
    body, data = [], {}
    for k in keys:
        ms = by[k]
        first = next(iter(ms.values()))
        vs_hand = _ratios(ms, hand) if k[2] != "hand" else []
        vs_load = _ratios(ms, plain) if ms is not plain else []
        data[_side_name(k)] = {
            "rows_per_s": [m.ops_per_s for _, m in sorted(ms.items()) if m.ops_per_s and not m.error],
            "vs_hand": vs_hand,
            "vs_load": vs_load,
        }
        body.append(
            [
                _side_name(k),
                f"{first.config.get('rows_in', first.n):,}",
                fmt(_med(ms, lambda m: m.ops_per_s), digits=0),
                _shown(vs_hand, 3) if vs_hand else "-",
                _shown(vs_load, 3) if vs_load else "-",
                fmt(_med(ms, lambda m: _per_row(m, m.client_cpu_s)), digits=1),
                fmt(_med(ms, lambda m: _per_row(m, m.server_cpu_s)), digits=1),
                fmt(_med(ms, _gc_runs), digits=0),
                fmt(_med(ms, lambda m: m.extra.get("transactions", m.extra.get("commits"))), digits=0),
                str(max((m.peak_connections or 0 for m in ms.values()), default=0) or "-"),
                rows_shown(ms),
                _notes(ms),
            ]
        )
    return table(header, body, text_columns=1), data


def _sizes(by: dict[Key, Rounds]) -> tuple[list[str], dict[str, Any]]:
    header = ["batch", "rows/s", f"/ batch={sc.BATCH:,}", "transactions", "rows"]
    base = by.get(("asyncpg", "log", "load", sc.BATCH, False, False), {})
    body, data = [], {}
    for size in sorted({sc.BATCH, *sc.SIZES}):
        ms = by.get(("asyncpg", "log", "load", size, False, False))
        if not ms:
            continue
        ratios = _ratios(ms, base) if size != sc.BATCH else []
        data[size] = {
            "rows_per_s": [m.ops_per_s for _, m in sorted(ms.items()) if m.ops_per_s],
            "vs_default": ratios,
        }
        body.append(
            [
                f"{size:,}",
                fmt(_med(ms, lambda m: m.ops_per_s), digits=0),
                _shown(ratios, 3) if ratios else "-",
                fmt(_med(ms, lambda m: m.extra.get("transactions")), digits=0),
                rows_shown(ms),
            ]
        )
    return table(header, body, text_columns=1), data


def _prep(rows: list[Measurement], by: dict[Key, Rounds]) -> tuple[list[str], dict[str, Any]]:
    preps = {int(m.config.get("round", 1)): m for m in rows if m.config.get("kind") == "prep" and not m.error}
    plain = by.get(("asyncpg", "log", "load", sc.BATCH, False, False), {})
    hand = by.get(("asyncpg", "log", "hand", sc.BATCH, False, False), {})
    shares, cpu_shares, prep_s, hand_s, load_s, load_cpu = [], [], [], [], [], []
    for r, m in sorted(preps.items()):
        prep_s.append(m.wall_s or 0.0)
        hand_s.append(m.extra.get("hand_records_s") or 0.0)
        if (lm := plain.get(r)) is not None and not lm.error and lm.wall_s:
            load_s.append(lm.wall_s)
            shares.append((m.wall_s or 0.0) / lm.wall_s)
            if lm.client_cpu_s:
                load_cpu.append(lm.client_cpu_s)
                cpu_shares.append((m.client_cpu_s or 0.0) / lm.client_cpu_s)
    hand_wall = [m.wall_s for _, m in sorted(hand.items()) if m.wall_s and not m.error]
    data = {
        "prep_s": prep_s,
        "hand_records_s": hand_s,
        "load_s": load_s,
        "share_of_wall": shares,
        "share_of_client_cpu": cpu_shares,
        "hand_wall_s": hand_wall,
    }
    if not prep_s:
        return [], data
    n = next(iter(preps.values())).n
    lines = [
        f"- Turning {n:,} dicts into chunks of COPY records (`load()`'s chunk units, built without a "
        "database): "
        f"{_shown(prep_s, 3, ' s')}; a hand-written loop's tuples (`itemgetter`): {_shown(hand_s, 3, ' s')}.",
        f"- The whole `load()` of the same rows: {_shown(load_s, 3, ' s')} of wall time and "
        f"{_shown(load_cpu, 3, ' s')} of this process's CPU; the hand-written COPY loop: "
        f"{_shown(hand_wall, 3, ' s')}.",
        f"- The row preparation's share: {_shown([s * 100 for s in shares], 0, '%')} of `load()`'s wall "
        "time, "
        f"{_shown([s * 100 for s in cpu_shares], 0, '%')} of its client CPU.",
    ]
    return lines, data


def _goal(target: str, got: list[float], goal: float, *, rounds_run: int) -> dict[str, Any]:
    mid = median_of(got)
    decided = mid is None or rounds_run >= 3 or abs(mid / goal - 1) > NOISE
    shown = _shown(got, 3) if got else "-"
    if not decided:
        shown += f" (within the ±{NOISE:.0%} a round moves of the goal: decide it with --load-rounds 3)"
    return {
        "target": f"load: {target}",
        "value": mid,
        "status": verdict(mid, goal, decided=decided),
        "shown": shown,
    }


def _goals(
    groups: dict[str, dict[str, Any]], rows: list[Measurement], rounds_run: int
) -> list[dict[str, Any]]:
    def ratio(driver: str, side: str, what: str) -> list[float]:
        return list(groups.get(driver, {}).get(side, {}).get(what, []))

    def over(driver: str, a: str, b: str) -> list[float]:
        """Per round: side ``a``'s rows/s over side ``b``'s (``b`` the slower, so the ratio of a speedup)."""
        xs = groups.get(driver, {}).get(b, {}).get("vs_load", [])
        return [1 / x for x in xs if x]

    load, orm = "load()", "ORM units, batch=500"
    out = [
        _goal(
            "asyncpg, 8 connections: load() >= 0.9 of the hand-written COPY loop (rows/s)",
            ratio("asyncpg", load, "vs_hand"),
            0.9,
            rounds_run=rounds_run,
        ),
        _goal(
            "asyncpg: load() >= 12x batch=500 ORM units",
            over("asyncpg", load, orm),
            12,
            rounds_run=rounds_run,
        ),
        _goal(
            "asyncpg: with 1% duplicate keys spread through the input >= 0.7 of the clean load() "
            "(input rows/s; #55, was 0.35)",
            ratio("asyncpg", "load(), 1% duplicate keys", "vs_load"),
            0.7,
            rounds_run=rounds_run,
        ),
        _goal(
            "asyncpg: load() with a journal >= 0.93 of without",
            ratio("asyncpg", "load() + journal", "vs_load"),
            0.93,
            rounds_run=rounds_run,
        ),
        _goal(
            "psycopg 3 (threads): load_sync() >= 0.9 of a hand-written cursor.copy() loop",
            ratio("psycopg", load, "vs_hand"),
            0.9,
            rounds_run=rounds_run,
        ),
        _goal(
            "MariaDB (aiomysql): load() >= 0.9 of a hand-written multi-row INSERT loop",
            ratio("aiomysql", load, "vs_hand"),
            0.9,
            rounds_run=rounds_run,
        ),
        _goal(
            "MariaDB (aiomysql): load() >= 3x batch=500 ORM units",
            over("aiomysql", load, orm),
            3,
            rounds_run=rounds_run,
        ),
        _goal(
            "SQLite (pysqlite): load_sync() >= 0.9 of a hand-written executemany() loop",
            ratio("pysqlite", load, "vs_hand"),
            0.9,
            rounds_run=rounds_run,
        ),
        _goal(
            "SQLite (pysqlite): load_sync() >= 0.9 of a hand-written loop of the same INSERT statements",
            over("pysqlite", load, "hand-written multi-row INSERT loop"),
            0.9,
            rounds_run=rounds_run,
        ),
        _goal(
            "SQLite (pysqlite): load_sync() >= 3x batch=500 ORM units",
            over("pysqlite", load, orm),
            3,
            rounds_run=rounds_run,
        ),
    ]
    checked = [m for m in rows if m.config.get("kind") not in (None, "prep")]
    bad = [m.label for m in checked if not rows_ok(m) and not (m.error or "").startswith("skipped")]
    shown = ("wrong or failed in: " + "; ".join(bad)) if bad else "every count as expected"
    target = "load: every good row exactly once, every duplicate refused (and reported by load()); "
    target += "every measurement"
    out.append({"target": target, "value": len(bad), "status": "FAIL" if bad else "PASS", "shown": shown})
    return out


NOTES = (
    "rows/s: input rows (loaded or rejected) per second of wall time.  / hand-written and / load(): per "
    "round, "
    "this side's rows/s over the hand-written loop's (on the same driver and connections, {batch:,} rows a "
    "transaction) or over the clean `load()`'s.  Client CPU: this process's; server CPU: the side's backends "
    "(/proc; SQLite has none).  GC runs: the garbage collector's runs in this process while the side ran, "
    "all generations.  transactions: `load()`'s report, else SQLAlchemy's commit events (the "
    "hand-written loops commit on the driver: 0).  The ORM sides run the first {orm:,} rows (batch=500) and "
    "{single:,} rows (one transaction per row).  The staging side drops the duplicates without reporting "
    "them."
)


def section(rows: list[Measurement]) -> tuple[list[str], dict[str, Any]]:
    """The section's Markdown lines and data."""
    by = _by(rows)
    k = max((int(m.config.get("round", 1)) for m in rows), default=1)
    n = next((m.config["rows_in"] for m in rows if m.config.get("kind") == "load"), None)
    heading = f"## Load (`runner.load()`, {n:,} rows" if n else "## Load (`runner.load()`"
    lines = [heading + (f", {rounds(k)})" if k > 1 else ")"), ""]
    if k > 1:
        lines += [
            "Each row is the median of its rounds' figures; each ratio the median of the rounds' ratios "
            "(two sides of one round), with their range.  Each group's sides ran in the opposite order "
            "of the round before.",
            "",
        ]
    data: dict[str, Any] = {"groups": {}}
    for title, driver, workload in GROUPS:
        if not any(key[0] == driver and key[1] == workload for key in by):
            skipped = next(
                (
                    m.error
                    for m in rows
                    if m.config.get("driver") == driver and (m.error or "").startswith("skipped")
                ),
                None,
            )
            if skipped:
                lines += [f"### {title}", "", skipped, ""]
            continue
        body, group = _group_table(by, driver, workload)
        data["groups"][driver if workload == "log" else f"{driver} {workload}"] = group
        lines += [f"### {title}", "", *body, ""]
    lines += [NOTES.format(batch=sc.BATCH, orm=sc.ORM_ROWS, single=sc.SINGLE_ROWS), ""]
    size_lines, data["sizes"] = _sizes(by)
    if len(data["sizes"]) > 1:
        lines += ["### batch= (asyncpg, 8 connections, clean rows)", "", *size_lines, ""]
    prep_lines, data["prep"] = _prep(rows, by)
    if prep_lines:
        lines += ["### Row preparation (asyncpg, clean rows)", "", *prep_lines, ""]
    staging = (
        data["groups"]
        .get("asyncpg", {})
        .get("hand-written staging table + ON CONFLICT DO NOTHING, 1% duplicate keys")
    )
    dups = data["groups"].get("asyncpg", {}).get("load(), 1% duplicate keys")
    if staging and dups:
        per_round = [s / d for s, d in zip(staging["vs_load"], dups["vs_load"], strict=False) if d]
        data["staging_over_dups"] = per_round
        lines += [
            "- Duplicates: the staging table + `ON CONFLICT DO NOTHING` did "
            f"{_shown(per_round, 2, 'x')} the rows/s "
            "of `load()` with the same 1% duplicate keys (it drops them without saying which).",
            "",
        ]
    data["goals"] = _goals(data["groups"], rows, k)
    lines += [f"- {g['status']}: {g['target']} — {g['shown']}" for g in data["goals"]]
    return [*lines, ""], data


def targets(data: dict[str, Any]) -> list[dict[str, Any]]:
    """The section's goals, for the report's targets."""
    return list(data.get("goals", []))
