"""
The Markdown report of a run, and the data behind its ratios and targets.

:func:`render` writes the header, then each section whose rows the run has, in a fixed order:
throughput, library overhead, instructions, ratios, limit sweep, auto limit, priorities, fleet,
processes, batches, loop lag, post 004, post 002, memory, targets.  Each section's module turns
its rows into lines and data; nothing here measures or prints.
"""

from __future__ import annotations

from typing import Any

from ..harness import Measurement
from ..scenarios import (
    batching,
    fleet,
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

    if main:
        out += throughput.section(main, mysql=mysql)
    if over_rows := rows_of(overhead_scenario.GROUP):
        lines, data["overhead"] = overhead.section(over_rows)
        out += lines
    if instr_rows := rows_of(instructions_scenario.GROUP):
        lines, data["instructions"] = instructions.section(instr_rows)
        out += lines
    out += throughput.ratio_lines(main, over_rows, data, mysql=mysql, rounds_run=rounds)
    if sweep := rows_of("sweep"):
        out += [f"## Limit sweep (N={sweep[0].n:,} per point)", "", *sweep_table(sweep), ""]
    if auto_rows := rows_of("auto"):
        lines, data["auto_limit"] = auto_limit.section(auto_rows)
        out += lines
    loop = rows_of("loop-lag")
    if mixed_rows := rows_of(mixed_priorities.GROUP):
        lines, data["mixed"] = mixed_report.section(mixed_rows, loop)
        out += lines
    if fleet_rows := rows_of(fleet.GROUP):
        lines, data["fleet"] = fleet_report.section(fleet_rows)
        out += lines
    if processes_rows := rows_of(processes.GROUP):
        lines, data["processes"] = processes_report.section(processes_rows)
        out += lines
    if (batch_rows := rows_of(batching.GROUP)) + (batch_sizes := rows_of(batching.SIZES_GROUP)):
        lines, data["batching"] = batching_report.section(batch_rows, batch_sizes)
        out += lines
    if loop:
        out += [
            "## Loop lag under HTTP load",
            "",
            *loop_lag.loop_table(loop),
            "",
            *loop_lag.ping_paragraph(loop),
        ]
    if p004 := rows_of(post004_ping_under_slow_requests.GROUP):
        out += post004.section(p004)
    if p002 := rows_of(post002_mysql_sync_vs_async.GROUP):
        lines, data["post_002"] = post002.section(p002)
        out += lines
    if mem := rows_of("memory"):
        out += ["## Memory", "", *memory_table(mem), ""]
    if mysql:  # the suite's other targets are the PostgreSQL suite's
        ratio = data["ratios"].get("faithful") or throughput.mysql_ratios(main, "faithful")
        data["targets"] = targets.mysql_targets(ratio)
        out += targets.lines(data["targets"])
        return "\n".join(out) + "\n", data
    ratio = data["ratios"].get("faithful") or throughput.ratios(main, "faithful")
    data["targets"] = targets.collect(env, results, ratio, data)
    data["targets"] += batching_report.targets(data.get("batching", {}))
    out += targets.lines(data["targets"])
    out += ["", "Measured earlier on this machine with hand-written scripts at N=35,000: "]
    out.append("; ".join(f"{k} {v}" for k, v in targets.PREVIOUS_35K.items()) + ".")
    return "\n".join(out) + "\n", data
