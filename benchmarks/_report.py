"""The report: Markdown tables shaped like the post's, ratios, targets, JSON and PNG charts."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from . import (
    _report_auto,
    _report_fleet,
    _report_mixed,
    _report_post002,
    fleet,
    instructions,
    mixed,
    overhead,
    post002,
    post004,
)
from ._figures import median_of
from ._harness import Measurement
from ._report_loop import INLINE, best_boundeddb, loop_table, ping_paragraph

#: What hand-written scripts measured on this machine at N=35,000 (for orientation only).
PREVIOUS_35K = {
    "sync": "88 s",
    "async-unbounded": "88 s",
    "chunked-40": "74 s",
    "async sliding window (L=10-40)": "82-100 s",
    "psycopg2 threads": "52-61 s",
}
RUNNERS = ("semaphore", "threads", "threads-psycopg2", "semaphore-asyncmy", "threads-mysqldb")
ORM_RUNNERS = (*RUNNERS, "chunked")
#: The MySQL/MariaDB pass's ratios: each runner against its hand-written twin, and driver against driver.
MYSQL_PAIRS = (
    ("semaphore", "hand-window", "semaphore / hand-written window"),
    ("semaphore", "hand-rolled", "semaphore / hand-rolled gather+Semaphore"),
    ("chunked", "hand-chunks", "chunked-40 / hand-written chunks of 40"),
    ("threads", "hand-rolled-threads", "threads / hand-rolled threads"),
    ("semaphore-asyncmy", "semaphore", "semaphore on asyncmy / on aiomysql"),
    ("threads-mysqldb", "threads", "threads on mysqlclient / on pymysql"),
    ("threads", "semaphore", "threads / semaphore"),
    ("semaphore", "sync", "semaphore / sync"),
)


def _f(value: float | None, scale: float = 1.0, digits: int = 1) -> str:
    return "-" if value is None else f"{value * scale:,.{digits}f}"


def _row(cells: Iterable[str]) -> str:
    return "| " + " | ".join(cells) + " |"


def _table(header: list[str], rows: list[list[str]], *, text_columns: int = 1) -> list[str]:
    align = ["---"] * text_columns + ["---:"] * (len(header) - 1 - text_columns) + ["---"]
    return [_row(header), _row(align), *(_row(r) for r in rows)]


def _status(m: Measurement) -> str:
    if m.error:
        return m.error.splitlines()[0][:80]
    return f"{m.failed} failed" if m.failed else ""


def main_table(rows: list[Measurement], *, driver_column: bool = False) -> list[str]:
    rounds = any("ops_per_s_range" in m.extra for m in rows)
    header = [
        "scenario",
        *(["driver"] if driver_column else []),
        "time, s",
        "ops/s",
        *(["ops/s min-max", "rounds"] if rounds else []),
        "p50, ms",
        "p99, ms",
        "peak conns",
        "client CPU, s",
        "server CPU, s",
        "loop lag p99, ms",
        "notes",
    ]
    body = [
        [
            m.label,
            *([str(m.config.get("driver", "-"))] if driver_column else []),
            _f(m.wall_s),
            _f(m.ops_per_s, digits=0),
            *([_range_of(m), str(m.extra.get("rounds", 1))] if rounds else []),
            _f(m.p50_s, 1e3),
            _f(m.p99_s, 1e3),
            str(m.peak_connections) if m.peak_connections is not None else "-",
            _f(m.client_cpu_s),
            _f(m.server_cpu_s),
            _f(m.loop_lag_p99_s, 1e3),
            _status(m),
        ]
        for m in rows
    ]
    return _table(header, body, text_columns=2 if driver_column else 1)


def _range_of(m: Measurement) -> str:
    low_high = m.extra.get("ops_per_s_range")
    return f"{low_high[0]:,.0f}-{low_high[1]:,.0f}" if low_high else "-"


def median_rows(rows: list[Measurement]) -> list[Measurement]:
    """
    One row per label for a run with ``--rounds`` above 1: the median of each figure over the rounds
    that ran without error, the round count and the ops/s range in ``extra``; rows of one round pass.
    """
    by_label: dict[str, list[Measurement]] = {}
    for m in rows:
        by_label.setdefault(m.label, []).append(m)
    out = []
    for label, ms in by_label.items():
        ok = [m for m in ms if not m.error and m.ops_per_s]
        if len(ms) == 1 or not ok:
            out.append(ms[0])
            continue

        def med(attr: str, ok: list[Measurement] = ok) -> float | None:
            return median_of([getattr(m, attr) for m in ok])

        first = ok[0]
        out.append(
            dataclasses.replace(
                first,
                label=label,
                wall_s=med("wall_s"),
                ops_per_s=med("ops_per_s"),
                p50_s=med("p50_s"),
                p99_s=med("p99_s"),
                max_s=max((m.max_s or 0.0) for m in ok),
                peak_connections=max((m.peak_connections or 0) for m in ok),
                client_cpu_s=med("client_cpu_s"),
                server_cpu_s=med("server_cpu_s"),
                loop_lag_p99_s=med("loop_lag_p99_s"),
                failed=sum(m.failed for m in ms),
                config={k: v for k, v in first.config.items() if k not in ("round", "order")},
                extra={
                    **first.extra,
                    "rounds": len(ok),
                    "rounds_failed": len(ms) - len(ok),
                    "ops_per_s_range": [
                        min(m.ops_per_s or 0.0 for m in ok),
                        max(m.ops_per_s or 0.0 for m in ok),
                    ],
                    "ops_per_s_rounds": [round(m.ops_per_s or 0.0, 1) for m in ok],
                },
                error=None,
            )
        )
    return out


def _pick_label(rows: list[Measurement], prefix: str, schema: str) -> Measurement | None:
    return _ok(next((m for m in rows if m.label.startswith(prefix) and m.schema == schema), None))


def mysql_ratios(
    main: list[Measurement], schema: str, source: str = "single run"
) -> dict[str, dict[str, Any]]:
    """The MySQL/MariaDB pass's within-run ratios of ops/s (of single runs, or of medians: see render)."""
    out: dict[str, dict[str, Any]] = {}
    best, chunks = _best(main, RUNNERS, schema), _pick(main, "chunked", schema)
    pairs = [("best runner / chunked", best, chunks)]
    for num, den, name in MYSQL_PAIRS:
        by_label = den in ("hand-window", "hand-chunks")
        pairs.append(
            (
                name,
                _pick(main, num, schema),
                _pick_label(main, den, schema) if by_label else _pick(main, den, schema),
            )
        )
    for name, n, d in pairs:
        value = n.ops_per_s / d.ops_per_s if n and d and n.ops_per_s and d.ops_per_s else None
        out[name] = {
            "value": value,
            "numerator": n.label if n else None,
            "denominator": d.label if d else None,
            "source": source,
        }
    return out


def _sweep_key(m: Measurement) -> tuple[str, str, int, int]:
    limit = m.config.get("limit", 0)
    return (m.schema, m.scenario, limit if isinstance(limit, int) else 1_000_000, m.config.get("pass", 1))


def _limit_shown(m: Measurement) -> str:
    limit = m.config.get("limit", "")
    mean = m.extra.get("limit_mean")
    if limit == "auto" and mean:
        return f"auto (mean {mean:.1f})"
    return f"{limit} (pass {m.config['pass']})" if m.config.get("pass", 1) > 1 else str(limit)


def sweep_table(rows: list[Measurement]) -> list[str]:
    header = ["runner", "schema", "L", "time, s", "ops/s", "p50, ms", "p99, ms", "peak conns"]
    header += ["server CPU, s", "notes"]
    body = [
        [
            m.scenario,
            m.schema,
            _limit_shown(m),
            _f(m.wall_s),
            _f(m.ops_per_s, digits=0),
            _f(m.p50_s, 1e3),
            _f(m.p99_s, 1e3),
            str(m.peak_connections or "-"),
            _f(m.server_cpu_s),
            _status(m),
        ]
        for m in sorted(rows, key=_sweep_key)
    ]
    return _table(header, body)


def memory_table(rows: list[Measurement]) -> list[str]:
    header = ["run", "time, s", "units/s", "p50, ms", "p99, ms", "peak conns", "RSS growth, MiB", "notes"]
    body = [
        [
            m.label,
            _f(m.wall_s),
            _f(m.ops_per_s, digits=0),
            _f(m.p50_s, 1e3),
            _f(m.p99_s, 1e3),
            str(m.peak_connections or "-"),
            _f(m.rss_growth_mb),
            _status(m),
        ]
        for m in rows
    ]
    return _table(header, body)


def _ok(m: Measurement | None) -> Measurement | None:
    return m if m is not None and not m.error and m.ops_per_s else None


def _pick(rows: list[Measurement], scenario: str, schema: str) -> Measurement | None:
    return _ok(next((m for m in rows if m.scenario == scenario and m.schema == schema), None))


def _best(rows: list[Measurement], names: Iterable[str], schema: str) -> Measurement | None:
    found = [m for m in (_pick(rows, n, schema) for n in names) if m is not None]
    return max(found, key=lambda m: m.ops_per_s or 0.0, default=None)


def ratios(
    main: list[Measurement], schema: str, medians: dict[str, dict[str, Any]] | None = None
) -> dict[str, dict[str, Any]]:
    """
    The within-run ratios of ops/s (numerator / denominator).  The throughput table's ratios come
    from its single runs; each overhead pair's ratio (library / hand-written) and its peers' ratios
    (peer / hand-written) come from the ``overhead`` scenario's medians (``medians``, see
    ``overhead.summary``), and are None when it did not run: single runs cannot resolve 3%.
    ``source`` says which.
    """
    pairs: dict[str, tuple[Measurement | None, Measurement | None]] = {
        "best runner / chunked": (_best(main, RUNNERS, schema), _pick(main, "chunked", schema)),
        "semaphore / hand-rolled": (_pick(main, "semaphore", schema), _pick(main, "hand-rolled", schema)),
        "threads / hand-rolled threads": (
            _pick(main, "threads", schema),
            _pick(main, "hand-rolled-threads", schema),
        ),
        "threads / semaphore": (_pick(main, "threads", schema), _pick(main, "semaphore", schema)),
        "best ORM runner / raw-asyncpg": (
            _best(main, ORM_RUNNERS, schema),
            _pick(main, "raw-asyncpg", schema),
        ),
    }
    out: dict[str, dict[str, Any]] = {}
    for name, (num, den) in pairs.items():
        value = num.ops_per_s / den.ops_per_s if num and den and num.ops_per_s and den.ops_per_s else None
        out[name] = {
            "value": value,
            "numerator": num.label if num else None,
            "denominator": den.label if den else None,
            "source": "single run",
        }
    medians = medians or {}
    for pair in overhead.PAIRS.values():
        s = medians.get(pair.name)
        lines = [(pair.ratio_name, s, "overhead")]
        lines += [
            (pair.peer_ratio_name(peer), s["peers"][peer.key] if s else None, "overhead peer")
            for peer in pair.peers
        ]
        for name, got, kind in lines:
            if got and got.get("ratio_median"):
                out[name] = {
                    "value": got["ratio_median"],
                    "source": f"{kind}: median of {_rounds_n(len(got['ratios']))}",
                    "min": got["ratio_min"],
                    "max": got["ratio_max"],
                    "cpu_ratio": got.get("cpu_ratio_median"),
                }
            else:
                ran = "no round completed" if s else "the overhead scenario did not run"
                out[name] = {"value": None, "source": f"{kind}: {ran}"}
    return out


def _ratio_line(name: str, r: dict[str, Any]) -> str:
    line = f"- {name}: {_f(r['value'], digits=3)}"
    if r["source"] == "single run":
        return line
    if r["value"] is None:
        return f"{line} ({r['source']})"
    if "min" not in r:  # a ratio of medians (--rounds): the section's heading says so
        return line
    line += f" ({r['source']}, min {_f(r['min'], digits=3)}, max {_f(r['max'], digits=3)}"
    if r.get("cpu_ratio") is not None:
        line += f"; CPU ratio {_f(r['cpu_ratio'], digits=3)}"
    return line + ")"


def _rounds_n(n: int) -> str:
    return f"{n} round" if n == 1 else f"{n} rounds"


def _range(s: dict[str, Any], prefix: str) -> str:
    low, high = s[f"{prefix}_min"], s[f"{prefix}_max"]
    return "-" if low is None else f"{low:.3f}-{high:.3f}"


def _rounds(values: list[float], orders: list[str] | None = None) -> str:
    if orders is None:
        return ", ".join(f"{r:.3f}" for r in values) or "-"
    return ", ".join(f"{r:.3f} ({o})" for r, o in zip(values, orders, strict=True)) or "-"


def overhead_table(rows: list[Measurement]) -> tuple[list[str], list[str], dict[str, Any]]:
    """
    The overhead scenario's pairs per schema (library against hand-written), the peers' table
    (each peer against the same hand-written side), and the data behind them.
    """
    header = [
        "pair (library / hand-written)", "schema", "N", "rounds", "library median ops/s",
        "hand-written median ops/s", "ratio median", "min", "max", "per-round ratios (order)",
        "CPU ms/op, library / hand-written", "CPU ratio median (min-max)", "load avg, 1 min", "notes",
    ]  # fmt: skip
    peer_header = [
        "peer / hand-written", "schema", "peer median ops/s", "hand-written median ops/s",
        "ratio median", "min-max", "per-round ratios", "CPU ms/op, peer",
    ]  # fmt: skip
    body, peer_body, data = [], [], {}
    for schema in ("faithful", "index"):
        medians = overhead.summary(rows, schema)
        if medians:
            data[schema] = medians
        for s in medians.values():
            notes = [e.splitlines()[0][:80] for e in s["errors"]]
            if s["failed_units"]:
                notes.append(f"{s['failed_units']} units failed")
            body.append(
                [
                    s["ratio_name"],
                    schema,
                    f"{s['n']:,}",
                    str(s["rounds"]),
                    _f(s["library_median_ops_s"], digits=0),
                    _f(s["hand_written_median_ops_s"], digits=0),
                    _f(s["ratio_median"], digits=3),
                    _f(s["ratio_min"], digits=3),
                    _f(s["ratio_max"], digits=3),
                    _rounds(s["ratios"], s["orders"]),
                    f"{_f(s['library_cpu_ms_per_op'], digits=3)} / "
                    f"{_f(s['hand_written_cpu_ms_per_op'], digits=3)}",
                    f"{_f(s['cpu_ratio_median'], digits=3)} ({_range(s, 'cpu_ratio')})",
                    f"{min(load):.1f}-{max(load):.1f}" if (load := s["loadavg_1m"]) else "-",
                    "; ".join(notes),
                ]
            )
            for peer in s["peers"].values():
                peer_body.append(
                    [
                        peer["ratio_name"],
                        schema,
                        _f(peer["median_ops_s"], digits=0),
                        _f(s["hand_written_median_ops_s"], digits=0),
                        _f(peer["ratio_median"], digits=3),
                        _range(peer, "ratio"),
                        _rounds(peer["ratios"]),
                        _f(peer["cpu_ms_per_op"], digits=3),
                    ]
                )
    return _table(header, body), (_table(peer_header, peer_body) if peer_body else []), data


def overhead_targets(over: dict[str, dict[str, dict[str, Any]]]) -> list[dict[str, Any]]:
    """One line per pair and schema: library / hand-written, median of the rounds, >= TARGET."""
    out = []
    schemas = ["faithful", *(["index"] if "index" in over else [])]
    for schema in schemas:
        medians = over.get(schema, {})
        for pair in overhead.PAIRS.values():
            s = medians.get(pair.name)
            value = s["ratio_median"] if s else None
            if s and value is not None:
                shown = (
                    f"{value:.4f} (median of {_rounds_n(len(s['ratios']))}, "
                    f"min {_f(s['ratio_min'], digits=3)}, max {_f(s['ratio_max'], digits=3)}; "
                    f"CPU ratio {_f(s['cpu_ratio_median'], digits=3)})"
                )
            else:
                shown = "no round completed" if s else "the overhead scenario did not run"
            status = "n/a" if value is None else ("PASS" if value >= overhead.TARGET else "MISS")
            out.append(
                {
                    "target": f"every runner >= {overhead.TARGET} of its hand-written equivalent: "
                    f"{pair.ratio_name}, {schema}",
                    "value": value,
                    "status": status,
                    "shown": shown,
                    "pair": pair.name,
                    "schema": schema,
                }
            )
    return out


def targets(
    results: list[Measurement],
    ratio: dict[str, dict[str, Any]],
    over: dict[str, dict[str, dict[str, Any]]] | None = None,
) -> list[dict[str, Any]]:
    """The issue's targets, each PASS, MISS or n/a (reported, never asserted)."""

    def check(name: str, value: float | None, ok: Callable[[float], bool], shown: str) -> dict[str, Any]:
        status = "n/a" if value is None else ("PASS" if ok(value) else "MISS")
        return {"target": name, "value": value, "status": status, "shown": shown}

    out = []
    r = ratio["best runner / chunked"]["value"]
    out.append(check("fastest runner >= 1.3x chunked-40 ops/s", r, lambda v: v >= 1.3, f"{_f(r, digits=2)}x"))
    out += overhead_targets(over or {})
    loop = [m for m in results if m.group == "loop-lag"]
    inline = next((m for m in loop if m.label == INLINE and not m.error), None)
    best, rule = best_boundeddb(loop)
    if inline and best and inline.extra.get("ping_p99_s"):
        b, i = best.extra["ping_p99_s"], inline.extra["ping_p99_s"]
        shown = (
            f"{best.label.removeprefix('loop-lag ')} {b * 1e3:.1f} ms at {best.ops_per_s or 0:.0f} DB req/s "
            f"vs inline {i * 1e3:.1f} ms at {inline.ops_per_s or 0:.0f} DB req/s ({rule}, among "
            f"{sum(1 for m in loop if not m.error)} variants)"
        )
        out.append(
            check(
                "loop-lag: best boundeddb variant /ping p99 <= inline / 5 and < 100 ms",
                b,
                lambda v: v * 5 <= i and v < 0.1,
                shown,
            )
        )
    else:
        out.append(
            check("loop-lag: best boundeddb variant /ping p99 <= inline / 5 and < 100 ms", None, bool, "-")
        )
    mem = next((m for m in results if m.group == "memory" and not m.error), None)
    growth = mem.rss_growth_mb if mem else None
    units = mem.config.get("units", 0) if mem else 0
    note = "" if units >= 1_000_000 else f" (at {units:,} units; the target is for 1,000,000)"
    out.append(check("memory: RSS growth < 50 MiB", growth, lambda v: v < 50, f"{_f(growth)} MiB{note}"))
    return out


def mysql_throughput(main: list[Measurement]) -> list[str]:
    """The throughput section of a ``--database mysql`` run: the table with each row's driver, and notes."""
    out = ["## Throughput (MySQL/MariaDB)", "", *main_table(main, driver_column=True), ""]
    out += [f"- {m.label}: {m.extra['note']}" for m in main if m.extra.get("note")]
    out += [""] if any(m.extra.get("note") for m in main) else []
    return [
        *out,
        "Latency is per unit, from opening its session to closing it.  Peak connections are sampled "
        "from information_schema.processlist every 100 ms on a separate connection (the scenario's "
        "connections are those on the suite's database, boundeddb_bench).  Client CPU is this process's; "
        "server CPU is utime+stime of the server threads (processlist TID) of the scenario's connections, "
        "read from /proc/<mariadbd>/task, less what each thread had spent before the scenario.",
        "",
        "Schemas on InnoDB: a foreign key needs an index, and InnoDB makes one on b.a_id by itself; the "
        "faithful pass drops the constraint and that index (so that a read scans b, as on PostgreSQL), the "
        "index pass keeps the post's tables as InnoDB creates them.",
        "",
        "Where the time goes:",
        "",
        *schema_note(main, backends="the server threads of the scenarios' connections"),
        "",
    ]


def _cpu_note(main: list[Measurement], schema: str) -> tuple[float, float] | None:  # (client, server)
    rows = [m for m in main if m.schema == schema and not m.error and m.server_cpu_s is not None]
    if not rows:
        return None
    return sum(m.client_cpu_s or 0.0 for m in rows), sum(m.server_cpu_s or 0.0 for m in rows)


def schema_note(main: list[Measurement], *, backends: str = "the database backends") -> list[str]:
    """Where the time goes, and what the index on b.a_id changes."""
    lines = []
    for schema in ("faithful", "index"):
        split = _cpu_note(main, schema)
        if split is None:
            continue
        client, server = split
        share = server / (client + server) if client + server else 0.0
        what = "the post's, no index on b.a_id" if schema == "faithful" else "with an index on b.a_id"
        lines.append(
            f"- {schema} schema ({what}): {backends} used {server:.1f} CPU-s against "
            f"{client:.1f} CPU-s in this process ({share:.0%} server)."
        )
    faithful_rows = [m for m in main if m.schema == "faithful" and not m.error]
    scenarios = [m.scenario for m in faithful_rows]

    def twin(m: Measurement) -> Measurement | None:
        """The row's index-pass twin: same scenario, or same label where a scenario has several rows."""
        if scenarios.count(m.scenario) == 1:
            return next(
                (x for x in main if x.scenario == m.scenario and x.schema == "index" and not x.error), None
            )
        return next((x for x in main if x.label == f"{m.label} [index]" and not x.error), None)

    pairs = [(m, twin(m)) for m in faithful_rows]
    speedups = [
        (m.scenario if scenarios.count(m.scenario) == 1 else m.label, x.ops_per_s / m.ops_per_s)
        for m, x in pairs
        if x and x.ops_per_s and m.ops_per_s
    ]
    faithful = _cpu_note(main, "faithful")
    if faithful and sum(faithful) and faithful[1] / sum(faithful) >= 0.5:
        lines.append(
            "- Without the index every read scans the whole, growing b table: the database does most "
            "of the work, and concurrency mostly overlaps client work with the server's."
        )
    elif faithful:
        lines.append(
            "- Without the index every read scans b, which grows by 2.5 rows per op, so a read costs "
            "the server more as N grows; at this N the client's Python (ORM) CPU still dominates."
        )
    if speedups:
        shown = ", ".join(f"{s} {v:.2f}x" for s, v in speedups)
        lines.append(f"- ops/s with the index / without: {shown}.")
        lines.append(
            "- With the index a read touches only the rows it returns: what remains is the Python CPU each "
            "strategy spends per op, so the index run ranks the strategies by client overhead."
        )
    elif lines:
        lines.append("- Run with --index to add the indexed schema and compare.")
    return lines


def render(env: dict[str, Any], results: list[Measurement]) -> tuple[str, dict[str, Any]]:
    """The Markdown report and the data of ratios and targets."""
    main = [m for m in results if m.group == "main"]
    rounds = max((int(m.config.get("round", 1)) for m in main), default=1)
    if rounds > 1:
        main = median_rows(main)
    mysql = env.get("database_kind") == "mysql"
    out = [f"# boundeddb benchmark — N={env['n']:,}, seed {env['seed']}, L={env['limit']}", ""]
    out.append(
        f"Database: {env['database']} ({env['database_source']}), "
        f"{env.get('server_product', 'PostgreSQL')} {env['server_version']}, "
    )
    out.append(
        f"max_connections={env['max_connections']}; {env['cpu_count']} CPUs; Python {env['python']}; "
        f"SQLAlchemy {env['versions'].get('sqlalchemy')}; boundeddb {env['versions'].get('boundeddb')}."
    )
    if mysql and env.get("server_settings"):
        out.append(
            "Server settings: " + ", ".join(f"{k}={v}" for k, v in env["server_settings"].items()) + "."
        )
    if env.get("loadavg_start"):
        out.append(
            f"Load average (1, 5, 15 min) at the start: {', '.join(map(str, env['loadavg_start']))}; "
            f"at the end: {', '.join(map(str, env.get('loadavg_end') or ['-']))} (the suite's own "
            f"processes included; above {env['cpu_count']} the machine was shared and figures are noisier)."
        )
    if rounds > 1:
        out.append(
            f"The throughput scenarios ran {rounds} times each, forward in odd rounds and in reverse in even "
            "ones: each row of the throughput table is the median of its rounds (ops/s: with its range), "
            "and the ratios are ratios of those medians."
        )
    out.append("")
    data: dict[str, Any] = {"ratios": {}, "targets": []}
    if main and mysql:
        out += mysql_throughput(main)
    elif main:
        out += ["## Throughput", "", *main_table(main), ""]
        out += [f"- {m.label}: {m.extra['note']}" for m in main if m.extra.get("note")]
        out += [""] if any(m.extra.get("note") for m in main) else []
        out += [
            "Latency is per unit, from opening its session to closing it.  Peak connections are sampled "
            "from pg_stat_activity every 100 ms on a separate connection.  Client CPU is this process's; "
            "server CPU is utime+stime of the scenario's own PostgreSQL backends, read from /proc.",
            "",
            "Where the time goes:",
            "",
            *schema_note(main),
            "",
        ]
    over_rows = [m for m in results if m.group == overhead.GROUP]
    if over_rows:
        table, peer_table, data["overhead"] = overhead_table(over_rows)
        k = max((int(m.config.get("round", 0)) for m in over_rows), default=0)
        out += [f"## Library overhead ({k} interleaved rounds)", "", *table, ""]
        if peer_table:
            out += ["Peers, in the same rounds, against the same hand-written side:", "", *peer_table, ""]
        out += ["What each side runs (one session per op, pool_size=L, max_overflow=0):", ""]
        for pair in overhead.PAIRS.values():
            out += [f"- {pair.name}: " + "; ".join(f"{side.name}: {side.what}" for side in pair.sides)]
        out += [
            "",
            "Each round runs every side of a pair back to back on fresh tables: library, hand-written, "
            "then the peers in rounds 1, 3, ... and the reverse order in rounds 2, 4, ..., so the library "
            "and its hand-written equivalent are neighbours, first (AB) or second (BA) in turn.  A round's "
            "ratio is library ops/s / hand-written ops/s (a peer's: peer / hand-written); the target "
            f"lines below use the median of these per-round ratios (>= {overhead.TARGET}).  The CPU ratio "
            "(hand-written CPU per op / library CPU per op, this process, all threads) is a cross-check "
            "that depends less on the machine's load (less so for threads, whose CPU time also moves with "
            "GIL contention): below 1 the library spent more client CPU per op.",
            "",
        ]
    if instr_rows := [m for m in results if m.group == instructions.GROUP]:
        lines, data["instructions"] = instructions.section(instr_rows)
        out += lines
    for schema in ("faithful", "index"):
        if not any(m.schema == schema for m in main + over_rows):
            continue
        if mysql:
            source = "single run" if rounds == 1 else f"ratio of medians of {rounds} rounds"
            data["ratios"][schema] = mysql_ratios(main, schema, source)
            runs = "single runs" if rounds == 1 else f"medians of {rounds} rounds"
            out += [f"Ratios of ops/s ({schema} schema; {runs}):", ""]
            out += [_ratio_line(name, r) for name, r in data["ratios"][schema].items()]
            out.append("")
            continue
        data["ratios"][schema] = ratios(main, schema, data.get("overhead", {}).get(schema))
        out += [f"Ratios of ops/s ({schema} schema):", ""]
        single = any(m.schema == schema for m in main)  # no throughput rows: no single-run lines
        out += [
            _ratio_line(name, r)
            for name, r in data["ratios"][schema].items()
            if single or r["source"] != "single run"
        ]
        out.append("")
    if sweep := [m for m in results if m.group == "sweep"]:
        out += [f"## Limit sweep (N={sweep[0].n:,} per point)", "", *sweep_table(sweep), ""]
    if auto_rows := [m for m in results if m.group == "auto"]:
        lines, data["auto_limit"] = _report_auto.section(auto_rows)
        out += lines
    loop = [m for m in results if m.group == "loop-lag"]
    if mixed_rows := [m for m in results if m.group == mixed.GROUP]:
        lines, data["mixed"] = _report_mixed.section(mixed_rows, loop)
        out += lines
    if fleet_rows := [m for m in results if m.group == fleet.GROUP]:
        lines, data["fleet"] = _report_fleet.section(fleet_rows)
        out += lines
    if loop:
        out += ["## Loop lag under HTTP load", "", *loop_table(loop), "", *ping_paragraph(loop)]
    if p004 := [m for m in results if m.group == post004.GROUP]:
        out += post004.section(p004)
    if p002 := [m for m in results if m.group == post002.GROUP]:
        lines, data["post_002"] = _report_post002.section(p002)
        out += lines
    if mem := [m for m in results if m.group == "memory"]:
        out += ["## Memory", "", *memory_table(mem), ""]
    if mysql:  # the suite's other targets are the PostgreSQL suite's
        r = (data["ratios"].get("faithful") or mysql_ratios(main, "faithful"))["best runner / chunked"][
            "value"
        ]
        status = "n/a" if r is None else ("PASS" if r >= 1.3 else "MISS")
        target = "fastest runner >= 1.3x chunked-40 ops/s (MySQL/MariaDB)"
        data["targets"] = [{"target": target, "value": r, "status": status, "shown": f"{_f(r, digits=2)}x"}]
        out += ["## Targets (reported, not asserted)", ""]
        out += [f"- {t['status']}: {t['target']} — {t['shown']}" for t in data["targets"]]
        return "\n".join(out) + "\n", data
    ratio = data["ratios"].get("faithful") or ratios(main, "faithful")
    data["targets"] = targets(results, ratio, data.get("overhead"))
    data["targets"] += instructions.targets(data.get("instructions", {}))
    if "auto_limit" in data:
        data["targets"] += _report_auto.targets(data["auto_limit"], env["limit"])
    if "mixed" in data:
        data["targets"] += _report_mixed.targets(data["mixed"])
    out += ["## Targets (reported, not asserted)", ""]
    out += [f"- {t['status']}: {t['target']} — {t['shown']}" for t in data["targets"]]
    out += ["", "Measured earlier on this machine with hand-written scripts at N=35,000: "]
    out.append("; ".join(f"{k} {v}" for k, v in PREVIOUS_35K.items()) + ".")
    return "\n".join(out) + "\n", data


def write_json(path: Path, env: dict[str, Any], results: list[Measurement], data: dict[str, Any]) -> None:
    doc = {"environment": env, "results": [dataclasses.asdict(m) for m in results], **data}
    path.write_text(json.dumps(doc, indent=2, default=str) + "\n")
