"""
``python -m benchmarks``: run the suite, print the report, write JSON, Markdown and charts.

The default suite (N=5,000) took about 8 minutes on 2 cores; ``--n 35000`` is the post's full
reproduction (and then ``memory`` streams 1,000,000 units): about 35 minutes on 2 cores, and about
45 with ``--index --sweep-n 3500``.  Those times predate the ``overhead`` scenario's four pairs and
5 rounds: on its own it now takes about 2 minutes a round per schema at N >= 3,000 (10 runs of 3,000 ops).

``--database mysql`` runs the post's workload on MySQL/MariaDB instead (the scenarios in
:data:`MYSQL_SCENARIOS`, among them ``post-002``).
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime as dt
import json
import os
import platform
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from importlib import metadata
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from . import (
    _charts,
    _db_mysql,
    _report,
    _report_auto,
    _report_fleet,
    _report_mixed,
    _report_post002,
    async_unbounded,
    auto_limit,
    chunked,
    fleet,
    gevent_pool,
    hand_rolled,
    instructions,
    limit_sweep,
    loop_lag,
    memory,
    mixed,
    overhead,
    post002,
    post004,
    raw_asyncpg,
    semaphore,
    sync,
    threads,
)
from ._db import Database, resolve
from ._db_mysql import MySQLDatabase
from ._harness import Context, Measurement, SuiteProgress
from ._workload import make_ops

SCENARIOS: dict[str, Callable[[Context], None]] = {
    "sync": sync.run,
    "async-unbounded": async_unbounded.run,
    "chunked": chunked.run,
    "semaphore": semaphore.run,
    "semaphore-asyncmy": semaphore.run_asyncmy,
    "threads": threads.run,
    "threads-psycopg2": threads.run_psycopg2,
    "threads-mysqldb": threads.run_mysqldb,
    "gevent": gevent_pool.run,
    "hand-rolled": hand_rolled.run,
    "raw-asyncpg": raw_asyncpg.run,
    "overhead": overhead.run,
    "instructions": instructions.run,
    "limit-sweep": limit_sweep.run,
    "auto-limit": auto_limit.run,
    "mixed": mixed.run,
    "fleet": fleet.run,
    "loop-lag": loop_lag.run,
    "post-004": post004.run,
    "post-002": post002.run,
    "memory": memory.run,
}
#: What ``--database mysql`` runs (on aiomysql, asyncmy, pymysql, mysqlclient), and only there.
MYSQL_SCENARIOS = (
    "sync",
    "chunked",
    "semaphore",
    "semaphore-asyncmy",
    "threads",
    "threads-mysqldb",
    "hand-rolled",
    "post-002",
)
#: Scenarios of MySQL drivers, which the PostgreSQL suite does not run.
MYSQL_ONLY = ("semaphore-asyncmy", "threads-mysqldb", "post-002")
#: Scenarios that run the op sequence once and give a row of the throughput table.
THROUGHPUT = (
    "sync",
    "async-unbounded",
    "chunked",
    "semaphore",
    "semaphore-asyncmy",
    "threads",
    "threads-psycopg2",
    "threads-mysqldb",
    "gevent",
    "hand-rolled",
    "raw-asyncpg",
)
#: Scenarios that ``--index`` runs a second time, on the indexed schema.
INDEX_PASS = (*THROUGHPUT, "overhead", "instructions", "limit-sweep", "auto-limit")
PACKAGES = (
    "boundeddb", "sqlalchemy", "asyncpg", "psycopg", "psycopg-binary", "psycopg2-binary", "greenlet",
    "anyio", "aiometer", "starlette", "uvicorn", "httpx", "pgserver", "matplotlib", "rich", "psutil",
    "gevent", "psycogreen", "aiomysql", "asyncmy", "pymysql", "mysqlclient",
)  # fmt: skip
RESULTS = Path(__file__).with_name("results")
#: Default DB requests per loop-lag variant: N/2, at most this (the scenario has 15 variants).
LOOP_LAG_REQUESTS_CAP = 5_000


def parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m benchmarks",
        description="boundeddb benchmark suite: the workload of 'Soft touch to SQLAlchemy async I/O'.",
    )
    p.add_argument("--n", type=int, help="ops per scenario (default 5,000; the post used 35,000)")
    p.add_argument("--seed", type=int, default=2022, help="seed of the op sequence (default 2022)")
    p.add_argument("--limit", type=int, default=20, metavar="L", help="runner limit L (default 20)")
    p.add_argument(
        "--scenario",
        action="append",
        choices=list(SCENARIOS),
        help="scenario to run (repeatable; default: all of them)",
    )
    p.add_argument(
        "--index",
        action="store_true",
        help="also run the throughput scenarios with an index on b.a_id, and compare",
    )
    p.add_argument("--out", type=Path, help="output directory (default benchmarks/results/<time>-n<N>)")
    p.add_argument("--quick", action="store_true", help="a smoke run: N=1,000 and small side scenarios")
    p.add_argument("--sweep-n", type=int, help="ops per limit-sweep point (default N/5)")
    p.add_argument(
        "--memory-units",
        type=int,
        help="units for the memory scenario (default 50,000; 1,000,000 when N >= 35,000)",
    )
    p.add_argument(
        "--loop-lag-requests",
        type=int,
        help=f"DB requests per loop-lag variant (default N/2, at most {LOOP_LAG_REQUESTS_CAP:,})",
    )
    p.add_argument(
        "--overhead-rounds",
        type=int,
        default=overhead.DEFAULT_ROUNDS,
        metavar="K",
        help=f"rounds of the overhead scenario, order alternating (default {overhead.DEFAULT_ROUNDS})",
    )
    p.add_argument(
        "--auto-rounds",
        type=int,
        default=3,
        metavar="K",
        help="rounds of the auto-limit scenario's comparisons, order alternating (default 3)",
    )
    p.add_argument(
        "--sweep-passes",
        type=int,
        default=1,
        metavar="K",
        help="passes of the limit sweep, order of the limits alternating; auto-limit's best fixed "
        "limit is the one with the most ops/s on average over them (default 1)",
    )
    p.add_argument(
        "--instructions-pair",
        action="append",
        choices=list(overhead.PAIRS),
        help="pair the instructions scenario counts (repeatable; default: all; ~10 min per pair and schema)",
    )
    p.add_argument("--embedded", action="store_true", help="use an embedded pgserver even if one answers")
    p.add_argument(
        "--render",
        type=Path,
        metavar="DIR",
        help="run nothing: write DIR's report.md and charts again from DIR/results.json",
    )
    p.add_argument(
        "--database",
        choices=("postgresql", "mysql"),
        default="postgresql",
        help="run on PostgreSQL (default) or on MySQL/MariaDB ($BOUNDEDDB_BENCH_MYSQL_URL, "
        f"default {_db_mysql.DEFAULT_URL}): the throughput scenarios and post-002",
    )
    p.add_argument(
        "--post-002-rounds",
        type=int,
        default=post002.DEFAULT_ROUNDS,
        metavar="K",
        help=f"rounds of the post-002 scenario, order alternating (default {post002.DEFAULT_ROUNDS})",
    )
    p.add_argument(
        "--rounds",
        type=int,
        default=1,
        metavar="K",
        help="run the throughput scenarios K times, order alternating; the report gives medians (default 1)",
    )
    args = p.parse_args(argv)
    n = args.n or (1_000 if args.quick else 5_000)
    args.n = n
    args.sweep_n = args.sweep_n or max(100, n // 5)
    default_memory = 1_000_000 if n >= 35_000 else (5_000 if args.quick else 50_000)
    args.memory_units = args.memory_units or default_memory
    args.loop_lag_requests = args.loop_lag_requests or max(200, min(n // 2, LOOP_LAG_REQUESTS_CAP))
    if args.database == "mysql":
        args.scenario = args.scenario or list(MYSQL_SCENARIOS)
        if elsewhere := [name for name in args.scenario if name not in MYSQL_SCENARIOS]:
            p.error(
                f"--database mysql runs {', '.join(MYSQL_SCENARIOS)}; not {', '.join(elsewhere)} "
                "(PostgreSQL only: drop --database mysql)"
            )
        if args.embedded:
            p.error("--embedded starts a PostgreSQL: it does not go with --database mysql")
    else:
        args.scenario = args.scenario or [name for name in SCENARIOS if name not in MYSQL_ONLY]
        if mysql_only := [name for name in args.scenario if name in MYSQL_ONLY]:
            p.error(f"{', '.join(mysql_only)} run(s) on MySQL/MariaDB: add --database mysql")
    if (
        args.limit < 1
        or n < 2
        or args.overhead_rounds < 1
        or args.auto_rounds < 1
        or args.sweep_passes < 1
        or args.post_002_rounds < 1
        or args.rounds < 1
    ):
        p.error("--limit, --rounds and each scenario's rounds must be >= 1, and --n >= 2")
    return args


def environment(args: argparse.Namespace, db: Database | MySQLDatabase) -> dict[str, Any]:
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
        "rounds": args.rounds,
        "overhead_n": min(args.n, overhead.MAX_OPS),
        "index": args.index,
        "scenarios": args.scenario,
        "pool_settings": "per result: config (pool_size, max_overflow=0, pool_timeout=60 s unless noted)",
    }


@contextmanager
def progress_bars() -> Iterator[Progress | None]:
    """Progress bars on a terminal (stderr), nothing otherwise."""
    if not sys.stderr.isatty():
        yield None
        return
    columns = (TextColumn("{task.description:<36}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    with SuiteProgress(*columns, console=Console(stderr=True), refresh_per_second=5) as progress:
        yield progress


def run_suite(ctx: Context, names: list[str], *, index: bool, rounds: int = 1) -> None:
    """
    Run the scenarios in a fixed order, ``memory`` first: memory that other scenarios freed but
    the allocator kept would otherwise hide the RSS growth it measures.

    With ``rounds`` above 1 the throughput scenarios of each pass run again in rounds 2 to
    ``rounds``, in the reverse order in even rounds (each of their measurements records its round
    and order; the report gives each row's median); the other scenarios run once, in round 1.
    """
    names = sorted(set(names), key=lambda name: (name != "memory", list(SCENARIOS).index(name)))
    passes = [False, True] if index else [False]
    for use_index in passes:
        ctx.index = use_index
        for round_no in range(1, rounds + 1):
            todo = [name for name in names if not (ctx.index and name not in INDEX_PASS)]
            if round_no > 1:
                todo = [name for name in todo if name in THROUGHPUT]
            order = "forward" if round_no % 2 else "reverse"
            if order == "reverse":
                todo.reverse()
            if rounds > 1:
                ctx.log(
                    f"round {round_no}/{rounds} ({order}){' [index]' if ctx.index else ''}: {', '.join(todo)}"
                )
            run_scenarios(ctx, todo, round_no=round_no if rounds > 1 else None, order=order)


def run_scenarios(ctx: Context, names: list[str], *, round_no: int | None, order: str) -> None:
    """Run ``names`` one after the other; a failing scenario becomes an error row, never an exception."""
    for name in names:
        before = len(ctx.results)
        started = time.perf_counter()
        try:
            SCENARIOS[name](ctx)
        except Exception as exc:
            error = f"{type(exc).__name__}: {exc}".splitlines()[0][:300]
            ctx.results.append(Measurement(scenario=name, label=name, schema=ctx.schema, error=error))
            ctx.log(f"{name}: FAILED: {error}")
        took = time.perf_counter() - started
        for m in ctx.results[before:]:
            if round_no is not None and name in THROUGHPUT:
                m.config.update(round=round_no, order=order)
            if not m.error:
                ctx.log(f"done: {m.label:<40} {m.wall_s or 0:8.1f} s {m.ops_per_s or 0:8.0f} ops/s")
        if ctx.progress is None:
            print(f"[{name}{' [index]' if ctx.index else ''}: {took:.1f} s]", file=sys.stderr, flush=True)


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    if args.render:
        return render_again(args.render)
    db: Database | MySQLDatabase
    if args.database == "mysql":
        try:
            db = _db_mysql.resolve()
        except _db_mysql.ServerUnavailable as exc:
            print(f"python -m benchmarks --database mysql: {exc}", file=sys.stderr)
            return 2
    else:
        db = resolve(embedded=args.embedded)
    print(f"Database: {db.shown} ({db.source}), {db.product} {db.server_version}", file=sys.stderr)
    out = args.out or RESULTS / f"{dt.datetime.now():%Y%m%d-%H%M%S}-n{args.n}"
    out.mkdir(parents=True, exist_ok=True)
    env = environment(args, db)
    started = time.perf_counter()
    with progress_bars() as progress:
        ctx = Context(
            db=db,
            ops=make_ops(args.n, args.seed),
            seed=args.seed,
            limit=args.limit,
            sweep_n=min(args.sweep_n, args.n),
            memory_units=args.memory_units,
            loop_lag_requests=args.loop_lag_requests,
            overhead_rounds=args.overhead_rounds,
            auto_rounds=args.auto_rounds,
            sweep_passes=args.sweep_passes,
            post_002_rounds=args.post_002_rounds,
            instructions_pairs=tuple(args.instructions_pair or overhead.PAIRS),
            progress=progress,
        )
        try:
            run_suite(ctx, args.scenario, index=args.index, rounds=args.rounds)
        finally:
            try:
                db.drop_schema()
            except Exception as exc:
                print(f"could not drop the benchmark schema: {exc}", file=sys.stderr)
    env["suite_wall_s"] = round(time.perf_counter() - started, 1)
    env["loadavg_end"] = [round(x, 2) for x in os.getloadavg()]
    _report.write_json(out / "results.json", env, ctx.results, {})  # kept should the report fail
    write_report(out, env, ctx.results)
    return 0


def write_report(out: Path, env: dict[str, Any], results: list[Measurement]) -> None:
    """The report, the charts and the JSON of a run, from its environment and measurements."""
    text, data = _report.render(env, results)
    source = "information_schema.processlist" if env.get("database_kind") == "mysql" else "pg_stat_activity"
    charts = [
        _charts.connections(
            out / "connections.png",
            [m for m in results if m.group == "main" and m.config.get("round", 1) == 1],
            source=source,
        ),
        _charts.sweep(out / "limit_sweep.png", [m for m in results if m.group == "sweep"]),
        _charts.loop_lag(out / "loop_lag.png", [m for m in results if m.group == "loop-lag"]),
        _report_auto.chart(out / "auto_limit.png", [m for m in results if m.group == "auto"]),
        _report_mixed.chart(out / "mixed.png", [m for m in results if m.group == mixed.GROUP]),
        _report_fleet.chart(out / "fleet.png", [m for m in results if m.group == fleet.GROUP]),
        _report_post002.chart(out / "post002.png", [m for m in results if m.group == post002.GROUP]),
    ]
    (out / "report.md").write_text(text)
    _report.write_json(out / "results.json", env, results, data)
    print(text)
    written = ["report.md", "results.json", *(p.name for p in charts if p is not None)]
    print(f"Suite took {env['suite_wall_s']} s. Wrote {', '.join(written)} to {out}")


def render_again(directory: Path) -> int:
    """``--render DIR``: write DIR's report and charts again from its results.json (no database needed)."""
    doc = json.loads((directory / "results.json").read_text())
    fields = {f.name for f in dataclasses.fields(Measurement)}
    results = [Measurement(**{k: v for k, v in row.items() if k in fields}) for row in doc["results"]]
    for m in results:  # JSON made the (seconds, connections) pairs lists
        m.connections = [(float(t), int(c)) for t, c in m.connections]
    write_report(directory, doc["environment"], results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
