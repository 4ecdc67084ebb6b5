"""
A run's files: report.md, results.json and the charts, written from its environment and rows.

The same code serves a run and ``--render DIR``, which reads DIR/results.json back and writes
DIR's report and charts again without a database.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

from ..measurement import Measurement
from ..scenarios import fleet, mixed_priorities, post002_mysql_sync_vs_async, processes
from . import auto_limit, charts, post002
from . import fleet as fleet_report
from . import mixed_priorities as mixed_report
from . import processes as processes_report
from .render import render
from .tables import median_rows


def write_json(path: Path, env: dict[str, Any], results: list[Measurement], data: dict[str, Any]) -> None:
    """results.json: the environment, every row, and the report's data (ratios, targets, sections)."""
    doc = {"environment": env, "results": [dataclasses.asdict(m) for m in results], **data}
    path.write_text(json.dumps(doc, indent=2, default=str) + "\n")


def write_report(
    out: Path, env: dict[str, Any], results: list[Measurement]
) -> tuple[str, dict[str, Any], list[str]]:
    """Write report.md, results.json and the charts to ``out``: the report's text, its data, the files."""
    text, data = render(env, results)
    source = "information_schema.processlist" if env.get("database_kind") == "mysql" else "pg_stat_activity"

    def rows(group: str) -> list[Measurement]:
        return [m for m in results if m.group == group]

    drawn = [
        charts.throughput(out / "throughput.png", median_rows(rows("main"))),
        charts.connections(
            out / "connections.png",
            [m for m in rows("main") if m.config.get("round", 1) == 1],
            source=source,
        ),
        charts.sweep(out / "limit_sweep.png", rows("sweep")),
        charts.loop_lag(out / "loop_lag.png", rows("loop-lag")),
        auto_limit.chart(out / "auto_limit.png", rows("auto")),
        mixed_report.chart(out / "mixed.png", rows(mixed_priorities.GROUP)),
        fleet_report.chart(out / "fleet.png", rows(fleet.GROUP)),
        processes_report.chart(out / "processes.png", rows(processes.GROUP)),
        post002.chart(out / "post002.png", rows(post002_mysql_sync_vs_async.GROUP)),
    ]
    (out / "report.md").write_text(text)
    write_json(out / "results.json", env, results, data)
    return text, data, ["report.md", "results.json", *(p.name for p in drawn if p is not None)]


def read_results(directory: Path) -> tuple[dict[str, Any], list[Measurement]]:
    """The environment and rows of the run in ``directory`` (its results.json)."""
    doc = json.loads((directory / "results.json").read_text())
    fields = {f.name for f in dataclasses.fields(Measurement)}
    results = [Measurement(**{k: v for k, v in row.items() if k in fields}) for row in doc["results"]]
    for m in results:  # JSON made the (seconds, connections) pairs lists
        m.connections = [(float(t), int(c)) for t, c in m.connections]
    return doc["environment"], results
