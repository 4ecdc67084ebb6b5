"""
The report's throughput section: the table of the throughput scenarios, where the time went, ratios.

One row per throughput scenario (the median of its rounds with ``--rounds``); the ratios compare
rows of the same run, and each runner's ratio to its hand-written equivalent comes from the
``overhead`` scenario's rounds (:mod:`benchmarks.report.overhead`) when it ran.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from ..measurement import Measurement
from ..scenarios.overhead import PAIRS
from .tables import fmt, main_table, rounds

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
        # The same goal's reference: the hand-written sliding windows, async and in threads.
        "best hand-written / chunked": (
            _best(main, ("hand-rolled", "hand-rolled-threads"), schema),
            _pick(main, "chunked", schema),
        ),
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
    for pair in PAIRS.values():
        s = medians.get(pair.name)
        if s is None and pair.study != "overhead":
            continue  # a study run by name (parity) that did not run
        lines = [(pair.ratio_name, s, "overhead")]
        lines += [
            (pair.peer_ratio_name(peer), s["peers"][peer.key] if s else None, "overhead peer")
            for peer in pair.peers
        ]
        for name, got, kind in lines:
            if got and got.get("ratio_median"):
                out[name] = {
                    "value": got["ratio_median"],
                    "source": f"{kind}: median of {rounds(len(got['ratios']))}",
                    "min": got["ratio_min"],
                    "max": got["ratio_max"],
                    "cpu_ratio": got.get("cpu_ratio_median"),
                }
            else:
                ran = "no round completed" if s else "the overhead scenario did not run"
                out[name] = {"value": None, "source": f"{kind}: {ran}"}
    return out


def _ratio_line(name: str, r: dict[str, Any]) -> str:
    line = f"- {name}: {fmt(r['value'], digits=3)}"
    if r["source"] == "single run":
        return line
    if r["value"] is None:
        return f"{line} ({r['source']})"
    if "min" not in r:  # a ratio of medians (--rounds): the section's heading says so
        return line
    line += f" ({r['source']}, min {fmt(r['min'], digits=3)}, max {fmt(r['max'], digits=3)}"
    if r.get("cpu_ratio") is not None:
        line += f"; CPU ratio {fmt(r['cpu_ratio'], digits=3)}"
    return line + ")"


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


def section(main: list[Measurement], *, mysql: bool) -> list[str]:
    """The throughput table and its notes (PostgreSQL's, or with each row's driver on MySQL/MariaDB)."""
    if mysql:
        return mysql_throughput(main)
    out = ["## Throughput", "", *main_table(main), ""]
    out += [f"- {m.label}: {m.extra['note']}" for m in main if m.extra.get("note")]
    out += [""] if any(m.extra.get("note") for m in main) else []
    return [
        *out,
        "Latency is per unit, from opening its session to closing it.  Peak connections are sampled "
        "from pg_stat_activity every 100 ms on a separate connection.  Client CPU is this process's; "
        "server CPU is utime+stime of the scenario's own PostgreSQL backends, read from /proc.",
        "",
        "Where the time goes:",
        "",
        *schema_note(main),
        "",
    ]


def ratio_lines(
    main: list[Measurement],
    over_rows: list[Measurement],
    data: dict[str, Any],
    *,
    mysql: bool,
    rounds_run: int,
) -> list[str]:
    """
    The "Ratios of ops/s" lines of each schema that ran; each schema's ratios go into
    ``data["ratios"]`` (the overhead pairs' from ``data["overhead"]``, when that scenario ran).
    """
    out: list[str] = []
    for schema in ("faithful", "index"):
        if not any(m.schema == schema for m in main + over_rows):
            continue
        if mysql:
            source = "single run" if rounds_run == 1 else f"ratio of medians of {rounds_run} rounds"
            data["ratios"][schema] = mysql_ratios(main, schema, source)
            runs = "single runs" if rounds_run == 1 else f"medians of {rounds_run} rounds"
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
    return out
