"""
The Markdown report of a run, and the data behind its ratios and targets.

:func:`render` writes the header, then each section whose rows the run has, in a fixed order:
throughput, library overhead, instructions, ratios, limit sweep, auto limit, priorities, fleet,
processes, batches, journal, load, loop lag, post 004, post 002, memory, targets.  Each section's module turns
its rows into lines and data; nothing here measures or prints.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ..measurement import Measurement
from ..scenarios import (
    batching,
    fleet,
    journal,
    load,
    load_parents,
    mixed_priorities,
    post002_mysql_sync_vs_async,
    post004_ping_under_slow_requests,
    processes,
)
from ..scenarios import instructions as instructions_scenario
from ..scenarios import overhead as overhead_scenario
from . import auto_limit, instructions, loop_lag, overhead, post002, post004, targets, throughput
from . import batching as batching_report
from . import fleet as fleet_report
from . import journal as journal_report
from . import load as load_report
from . import load_parents as load_parents_report
from . import mixed_priorities as mixed_report
from . import processes as processes_report
from .tables import median_rows, memory_table, sweep_table


def header(env: dict[str, Any], *, rounds: int, mysql: bool) -> list[str]:
    """The report's title and the lines about the database, the machine and the rounds."""
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
    return out


def _sweep(rows: list[Measurement]) -> list[str]:
    return [f"## Limit sweep (N={rows[0].n:,} per point)", "", *sweep_table(rows), ""]


def _loop_lag(rows: list[Measurement]) -> list[str]:
    return ["## Loop lag under HTTP load", "", *loop_lag.loop_table(rows), "", *loop_lag.ping_paragraph(rows)]


def _memory(rows: list[Measurement]) -> list[str]:
    return ["## Memory", "", *memory_table(rows), ""]


def render(env: dict[str, Any], results: list[Measurement]) -> tuple[str, dict[str, Any]]:
    """The Markdown report and the data of ratios and targets."""
    main = [m for m in results if m.group == "main"]
    rounds = max((int(m.config.get("round", 1)) for m in main), default=1)
    if rounds > 1:
        main = median_rows(main)
    mysql = env.get("database_kind") == "mysql"
    out = header(env, rounds=rounds, mysql=mysql)
    data: dict[str, Any] = {"ratios": {}, "targets": []}

    def rows_of(group: str) -> list[Measurement]:
        return [m for m in results if m.group == group]

    def section(group: str, key: str | None, write: Callable[[list[Measurement]], Any]) -> None:
        """The section of ``group``'s rows, if the run has any; its data under ``key``."""
        if rows := rows_of(group):
            lines = write(rows)
            if key is not None:
                lines, data[key] = lines
            out.extend(lines)

    if main:
        out += throughput.section(main, mysql=mysql)
    section(overhead_scenario.GROUP, "overhead", overhead.section)
    section(instructions_scenario.GROUP, "instructions", instructions.section)
    out += throughput.ratio_lines(
        main, rows_of(overhead_scenario.GROUP), data, mysql=mysql, rounds_run=rounds
    )
    section("sweep", None, _sweep)
    section("auto", "auto_limit", auto_limit.section)
    loop = rows_of("loop-lag")
    section(mixed_priorities.GROUP, "mixed", lambda rows: mixed_report.section(rows, loop))
    section(fleet.GROUP, "fleet", fleet_report.section)
    section(processes.GROUP, "processes", processes_report.section)
    if (batch_rows := rows_of(batching.GROUP)) + (batch_sizes := rows_of(batching.SIZES_GROUP)):
        lines, data["batching"] = batching_report.section(batch_rows, batch_sizes)
        out += lines
    section(journal.GROUP, "journal", journal_report.section)
    section(load.GROUP, "load", load_report.section)
    section(load_parents.GROUP, "load_parents", load_parents_report.section)
    section("loop-lag", None, _loop_lag)
    section(post004_ping_under_slow_requests.GROUP, None, post004.section)
    section(post002_mysql_sync_vs_async.GROUP, "post_002", post002.section)
    section("memory", None, _memory)
    if mysql:  # the suite's other targets are the PostgreSQL suite's
        ratio = data["ratios"].get("faithful") or throughput.mysql_ratios(main, "faithful")
        data["targets"] = targets.mysql_targets(ratio, rounds)
        out += targets.lines(data["targets"])
        return "\n".join(out) + "\n", data
    ratio = data["ratios"].get("faithful") or throughput.ratios(main, "faithful")
    data["targets"] = targets.collect(env, results, ratio, data)
    data["targets"] += batching_report.targets(data.get("batching", {}))
    data["targets"] += journal_report.targets(data.get("journal", {}))
    data["targets"] += load_report.targets(data.get("load", {}))
    data["targets"] += load_parents_report.targets(data.get("load_parents", {}))
    out += targets.lines(data["targets"])
    out += ["", "Measured earlier on this machine with hand-written scripts at N=35,000: "]
    out.append("; ".join(f"{k} {v}" for k, v in targets.PREVIOUS_35K.items()) + ".")
    return "\n".join(out) + "\n", data
