"""
``python -m benchmarks``'s options: what they mean, their defaults, and which scenarios a run takes.

A run without ``--scenario`` takes the default set (each scenario's record says whether it is in
it): about 10 minutes on the 2-core development machine.  ``--full`` takes every scenario of the
database with the long studies' settings; ``--scenario NAME`` (repeatable) takes just those.
``--help`` lists every scenario with its rough time.
"""

from __future__ import annotations

import argparse
import textwrap
from pathlib import Path

from .db import mysql as mysql_db
from .scenario import MYSQL, POSTGRESQL
from .scenarios import batching, journal, load, overhead, post002_mysql_sync_vs_async, processes
from .scenarios.catalog import BY_NAME, default_set, on
from .suite import about

#: Default DB requests per loop-lag variant: N/2, at most this (the scenario has 18 variants).
LOOP_LAG_REQUESTS_CAP = 5_000
#: The post's full size: from here the memory scenario streams a million units.
POST_N = 35_000
#: The width of --help's scenario list.
WIDTH = 100


def _minutes(seconds: float) -> str:
    return f"{seconds / 60:.0f} min" if seconds >= 90 else f"{seconds:.0f} s"


def scenario_list() -> str:
    """The ``--help`` epilog: every scenario with its rough time, and what each kind of run takes."""
    lines = ["scenarios (rough time at the defaults, N=5,000, on 2 cores; * = in the default set):"]
    for s in BY_NAME.values():
        where = "" if s.databases == (POSTGRESQL,) else f" [{', '.join(s.databases)}]"
        mark = "*" if s.default else " "
        first = f"  {mark} {s.name:<18} {_minutes(s.seconds):>6}  "
        lines += textwrap.wrap(
            s.what + where, WIDTH, initial_indent=first, subsequent_indent=" " * len(first)
        )
    default = sum(s.seconds for s in default_set(POSTGRESQL))
    full = sum(s.seconds for s in on(POSTGRESQL)) + overhead.SECONDS_PER_ROUND * (
        overhead.FULL_ROUNDS - overhead.DEFAULT_ROUNDS
    )
    mysql = sum(s.seconds for s in default_set(MYSQL))
    notes = (
        f"A plain run takes the * scenarios: {about(default)}.  --full takes all of them with "
        f"{overhead.FULL_ROUNDS} overhead rounds: {about(full)} (with pgbouncer and valgrind installed).  "
        f"--database mysql: {about(mysql)}.  --index runs the throughput scenarios, overhead, "
        "instructions, limit-sweep, auto-limit and processes again on the indexed schema (about twice "
        "as long).  "
        f"--n {POST_N} (the post's size; memory then streams 1,000,000 units, about 8 min) makes the "
        "throughput rows about 10 times as long.  A machine shared with other work takes longer."
    )
    return "\n".join([*lines, "", *textwrap.wrap(notes, WIDTH)])


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m benchmarks",
        description="boundeddb benchmark suite: the workload of 'Soft touch to SQLAlchemy async I/O'.",
        epilog=scenario_list(),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--n", type=int, help="ops per scenario (default 5,000; the post used 35,000)")
    p.add_argument("--seed", type=int, default=2022, help="seed of the op sequence (default 2022)")
    p.add_argument("--limit", type=int, default=20, metavar="L", help="runner limit L (default 20)")
    p.add_argument(
        "--scenario",
        action="append",
        choices=list(BY_NAME),
        help="scenario to run (repeatable; default: the default set, see below)",
    )
    p.add_argument(
        "--full",
        action="store_true",
        help=f"every scenario of the database, and {overhead.FULL_ROUNDS} overhead rounds: the long studies",
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
        help=f"units for the memory scenario (default 50,000; 1,000,000 when N >= {POST_N:,})",
    )
    p.add_argument(
        "--loop-lag-requests",
        type=int,
        help=f"DB requests per loop-lag variant (default N/2, at most {LOOP_LAG_REQUESTS_CAP:,})",
    )
    p.add_argument(
        "--overhead-rounds",
        type=int,
        metavar="K",
        help="rounds of the overhead scenario, order alternating "
        f"(default {overhead.DEFAULT_ROUNDS}; {overhead.FULL_ROUNDS} with --full)",
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
        "--processes-rounds",
        type=int,
        metavar="K",
        help="rounds of the processes scenario's 7 sides, order alternating "
        f"(default {processes.DEFAULT_ROUNDS}; {processes.QUICK_ROUNDS} with --quick; "
        f"~{processes.SECONDS_PER_ROUND} s a round and schema)",
    )
    p.add_argument(
        "--batching-rounds",
        type=int,
        metavar="K",
        help="rounds of the batching scenario, every group's sides in alternating order "
        f"(default {batching.DEFAULT_ROUNDS}; {batching.QUICK_ROUNDS} with --quick; "
        f"~{batching.SECONDS_PER_ROUND} s a round)",
    )
    p.add_argument(
        "--journal-rounds",
        type=int,
        metavar="K",
        help="rounds of the journal scenario, its sides in alternating order "
        f"(default {journal.DEFAULT_ROUNDS}; {journal.QUICK_ROUNDS} with --quick; "
        f"~{journal.SECONDS_PER_ROUND} s a round)",
    )
    p.add_argument(
        "--load-rows",
        type=int,
        metavar="N",
        help=f"rows of the load scenario (default {load.DEFAULT_ROWS:,}; {load.QUICK_ROWS:,} with --quick)",
    )
    p.add_argument(
        "--load-rounds",
        type=int,
        metavar="K",
        help="rounds of the load scenario, its groups' sides in alternating order "
        f"(default {load.DEFAULT_ROUNDS}; {load.QUICK_ROUNDS} with --quick; "
        f"~{load.SECONDS_PER_ROUND} s a round)",
    )
    p.add_argument(
        "--instructions-pair",
        action="append",
        choices=list(overhead.PAIRS),
        help="pair the instructions scenario counts (repeatable; default: all; ~8 min per pair and schema)",
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
        choices=(POSTGRESQL, MYSQL),
        default=POSTGRESQL,
        help="run on PostgreSQL (default) or on MySQL/MariaDB ($BOUNDEDDB_BENCH_MYSQL_URL, "
        f"default {mysql_db.DEFAULT_URL}): the throughput scenarios and post-002",
    )
    rounds = post002_mysql_sync_vs_async.DEFAULT_ROUNDS
    p.add_argument(
        "--post-002-rounds",
        type=int,
        default=rounds,
        metavar="K",
        help=f"rounds of the post-002 scenario, order alternating (default {rounds})",
    )
    p.add_argument(
        "--rounds",
        type=int,
        default=1,
        metavar="K",
        help="run the throughput scenarios K times, order alternating; the report gives medians (default 1)",
    )
    return p


def parse(argv: list[str] | None) -> argparse.Namespace:
    """The options, with every default resolved and the scenarios checked against the database."""
    p = parser()
    args = p.parse_args(argv)
    n = args.n or (1_000 if args.quick else 5_000)
    args.n = n
    args.sweep_n = args.sweep_n or max(100, n // 5)
    default_memory = 1_000_000 if n >= POST_N else (5_000 if args.quick else 50_000)
    args.memory_units = args.memory_units or default_memory
    args.loop_lag_requests = args.loop_lag_requests or max(200, min(n // 2, LOOP_LAG_REQUESTS_CAP))
    if args.processes_rounds is None:
        args.processes_rounds = processes.QUICK_ROUNDS if args.quick else processes.DEFAULT_ROUNDS
    if args.batching_rounds is None:  # a plain run takes one round: --scenario batching decides its goals
        plain = args.scenario is None and not args.full
        args.batching_rounds = batching.QUICK_ROUNDS if args.quick or plain else batching.DEFAULT_ROUNDS
    if args.journal_rounds is None:
        args.journal_rounds = journal.QUICK_ROUNDS if args.quick else journal.DEFAULT_ROUNDS
    if args.load_rows is None:
        args.load_rows = load.QUICK_ROWS if args.quick else load.DEFAULT_ROWS
    if args.load_rounds is None:
        args.load_rounds = load.QUICK_ROUNDS if args.quick else load.DEFAULT_ROUNDS
    if args.overhead_rounds is None:
        args.overhead_rounds = overhead.FULL_ROUNDS if args.full else overhead.DEFAULT_ROUNDS
    available = [s.name for s in on(args.database)]
    if args.scenario is None:
        args.scenario = available if args.full else [s.name for s in default_set(args.database)]
    if args.database == MYSQL:
        if elsewhere := [name for name in args.scenario if name not in available]:
            p.error(
                f"--database mysql runs {', '.join(available)}; not {', '.join(elsewhere)} "
                "(PostgreSQL only: drop --database mysql)"
            )
        if args.embedded:
            p.error("--embedded starts a PostgreSQL: it does not go with --database mysql")
    elif mysql_only := [name for name in args.scenario if name not in available]:
        p.error(f"{', '.join(mysql_only)} run(s) on MySQL/MariaDB: add --database mysql")
    if (
        args.limit < 1
        or n < 2
        or args.overhead_rounds < 1
        or args.auto_rounds < 1
        or args.sweep_passes < 1
        or args.post_002_rounds < 1
        or args.processes_rounds < 1
        or args.batching_rounds < 1
        or args.journal_rounds < 1
        or args.load_rounds < 1
        or args.load_rows < 100
        or args.rounds < 1
    ):
        p.error("--limit, --rounds and each scenario's rounds must be >= 1, --n >= 2, --load-rows >= 100")
    return args
