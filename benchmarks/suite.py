"""
Running the chosen scenarios: their order, passes and rounds, progress lines, the run's environment.

A run takes its scenarios in :data:`benchmarks.scenarios.catalog.ALL`'s order, once on the post's schema
and, with ``--index``, again on the indexed schema (the scenarios whose record says so).  Every
scenario and every measurement prints a line as it happens (to stderr, flushed: nox and CI pipes
show them live); on a terminal, progress bars too.  A failing scenario becomes an error row,
never an exception.
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import platform
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from importlib import metadata
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from .db import Server
from .harness import Context, SuiteProgress
from .scenario import Scenario
from .scenarios import overhead
from .scenarios.catalog import BY_NAME

PACKAGES = (
    "boundeddb", "sqlalchemy", "asyncpg", "psycopg", "psycopg-binary", "psycopg2-binary", "greenlet",
    "anyio", "aiometer", "starlette", "uvicorn", "httpx", "pgserver", "matplotlib", "rich", "psutil",
    "gevent", "psycogreen", "aiomysql", "asyncmy", "pymysql", "mysqlclient",
)  # fmt: skip


def environment(args: argparse.Namespace, db: Server) -> dict[str, Any]:
    """What results.json records about the machine, the versions, the server and the options."""
    versions: dict[str, str | None] = {}
    for name in PACKAGES:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = None
    try:
        commit = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"],
            cwd=Path(__file__).parent,
            capture_output=True,
            text=True,
            check=False,
        ).stdout.strip()
    except OSError:
        commit = ""
    return {
        "timestamp": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "python": platform.python_version(),
        "implementation": platform.python_implementation(),
        "platform": platform.platform(),
        "cpu_count": os.cpu_count(),
        "loadavg_start": [round(x, 2) for x in os.getloadavg()],
        "versions": versions,
        "git_commit": commit or None,
        "database": db.shown,
        "database_kind": db.kind,
        "server_product": db.product,
        "database_source": db.source,
        "server_version": db.server_version,
        "max_connections": db.max_connections,
        "server_local": db.local,
        "server_settings": getattr(db, "settings", {}),
        "n": args.n,
        "seed": args.seed,
        "limit": args.limit,
        "sweep_n": args.sweep_n,
        "memory_units": args.memory_units,
        "loop_lag_requests": args.loop_lag_requests,
        "overhead_rounds": args.overhead_rounds,
        "auto_rounds": args.auto_rounds,
        "sweep_passes": args.sweep_passes,
        "post_002_rounds": args.post_002_rounds,
        "processes_rounds": args.processes_rounds,
        "batching_rounds": args.batching_rounds,
        "journal_rounds": args.journal_rounds,
        "load_rows": args.load_rows,
        "load_rounds": args.load_rounds,
        "rounds": args.rounds,
        "overhead_n": min(args.n, overhead.MAX_OPS),
        "index": args.index,
        "scenarios": args.scenario,
        "full": args.full,
        "pool_settings": "per result: config (pool_size, max_overflow=0, pool_timeout=60 s unless noted)",
    }


@contextmanager
def progress_bars() -> Iterator[Progress | None]:
    """Progress bars on a terminal (stderr), nothing otherwise: the plain lines are enough there."""
    if not sys.stderr.isatty():
        yield None
        return
    columns = (TextColumn("{task.description:<36}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    with SuiteProgress(*columns, console=Console(stderr=True), refresh_per_second=5) as progress:
        yield progress


def about(seconds: float) -> str:
    """A rough duration: ``about 40 s``, ``about 7 min``."""
    return f"about {seconds:.0f} s" if seconds < 90 else f"about {seconds / 60:.0f} min"


def plan(names: list[str], *, index: bool, rounds: int) -> list[tuple[bool, int, list[Scenario]]]:
    """
    The (index pass, round, scenarios) steps of a run: the post's schema, then with ``index`` the
    indexed one (the scenarios whose record says so).  With ``rounds`` above 1 the throughput
    scenarios of each pass run again in rounds 2 to ``rounds``, in the reverse order in even rounds
    (each of their rows records its round and order; the report gives each row's median); the
    other scenarios run once, in round 1.
    """
    chosen = [s for s in BY_NAME.values() if s.name in names]  # ALL's order: memory first
    steps = []
    for use_index in [False, True] if index else [False]:
        for round_no in range(1, rounds + 1):
            todo = [s for s in chosen if s.index_pass or not use_index]
            if round_no > 1:
                todo = [s for s in todo if s.throughput]
            steps.append((use_index, round_no, todo if round_no % 2 else todo[::-1]))
    return steps


def run_suite(ctx: Context, names: list[str], *, index: bool, rounds: int = 1) -> None:
    """Run the scenarios ``names`` (see :func:`plan`), printing a line as each starts and ends."""
    steps = plan(names, index=index, rounds=rounds)
    total = sum(len(todo) for *_, todo in steps)
    k = 0
    for use_index, round_no, todo in steps:
        ctx.index = use_index
        order = "forward" if round_no % 2 else "reverse"
        if rounds > 1:
            names_shown = ", ".join(s.name for s in todo)
            ctx.log(f"round {round_no}/{rounds} ({order}){' [index]' if ctx.index else ''}: {names_shown}")
        for scenario in todo:
            k += 1
            tag = f"[{k}/{total}] {scenario.name}{' [index]' if ctx.index else ''}"
            ctx.log(f"{tag}: {scenario.what} ({about(scenario.seconds)} at N=5,000)")
            took = run_scenario(ctx, scenario, round_no=round_no if rounds > 1 else None, order=order)
            ctx.log(f"{tag}: done in {took:.1f} s")


def run_scenario(ctx: Context, scenario: Scenario, *, round_no: int | None, order: str) -> float:
    """Run one scenario; a failure becomes an error row, never an exception.  Its seconds."""
    before = len(ctx.results)
    started = time.perf_counter()
    try:
        scenario.run(ctx)
    except Exception as exc:
        ctx.failed(scenario.name, scenario.name, exc)
    if round_no is not None and scenario.throughput:
        for m in ctx.results[before:]:
            m.config.update(round=round_no, order=order)
    return time.perf_counter() - started
