"""
``python -m benchmarks``: run the suite, then write and print the report, the charts and the headline.

See :mod:`benchmarks.options` for what a run takes (``--help`` lists every scenario with its
time), :mod:`benchmarks.suite` for how it runs them, and :mod:`benchmarks.report` for what it
writes.  ``--render DIR`` writes DIR's report and charts again from its results.json.

Everything but the standard library is imported inside :func:`main`: processes started with
``spawn`` (the ``processes`` scenario's workers, Dask's) import the main module again, and should
not pay for the whole suite (matplotlib, the web stack) before their first unit.
"""

from __future__ import annotations

import datetime as dt
import os
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .db import Server
    from .measurement import Measurement

RESULTS = Path(__file__).with_name("results")


def main(argv: list[str] | None = None) -> int:
    from .db import mysql as mysql_db
    from .db.postgresql import resolve
    from .harness import Context
    from .options import parse
    from .report.files import read_results, write_json
    from .scenario import MYSQL
    from .scenarios import overhead
    from .scenarios.catalog import BY_NAME
    from .suite import about, environment, progress_bars, run_suite
    from .workload import make_ops

    # Lines must reach a pipe (nox, CI, tee) as they are printed, not when a buffer fills.
    for stream in (sys.stdout, sys.stderr):
        if hasattr(stream, "reconfigure"):
            stream.reconfigure(line_buffering=True)
    args = parse(argv)
    if args.render:
        env, results = read_results(args.render)
        finish(args.render, env, results)
        return 0
    db: Server
    if args.database == MYSQL:
        try:
            db = mysql_db.resolve()
        except mysql_db.ServerUnavailable as exc:
            print(f"python -m benchmarks --database mysql: {exc}", file=sys.stderr)
            return 2
    else:
        db = resolve(embedded=args.embedded)
    print(f"Database: {db.shown} ({db.source}), {db.product} {db.server_version}", file=sys.stderr)
    out = args.out or RESULTS / f"{dt.datetime.now():%Y%m%d-%H%M%S}-n{args.n}"
    out.mkdir(parents=True, exist_ok=True)
    chosen = [BY_NAME[name] for name in args.scenario]
    guess = sum(s.seconds * (2 if args.index and s.index_pass else 1) for s in chosen)
    print(
        f"Running {len(chosen)} scenario(s) at N={args.n:,}, L={args.limit} (at N=5,000: {about(guess)} "
        f"on 2 quiet cores); results go to {out}",
        file=sys.stderr,
    )
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
            processes_rounds=args.processes_rounds,
            batching_rounds=args.batching_rounds,
            journal_rounds=args.journal_rounds,
            load_rows=args.load_rows,
            load_rounds=args.load_rounds,
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
    write_json(out / "results.json", env, ctx.results, {})  # kept should the report fail
    finish(out, env, ctx.results)
    return 0


def finish(out: Path, env: dict[str, Any], results: list[Measurement]) -> None:
    """Write the report, results.json and charts to ``out``; print the report, then the headline."""
    from .report.files import write_report
    from .report.headline import headline

    text, data, written = write_report(out, env, results)
    print(text)
    print("Headline:")
    for line in headline(results, data):
        print(f"- {line}")
    took = f"The suite took {env['suite_wall_s']} s. " if env.get("suite_wall_s") is not None else ""
    print(f"{took}Report: {out / 'report.md'}; also {', '.join(written[1:])} in {out}{os.sep}")


if __name__ == "__main__":
    sys.exit(main())
