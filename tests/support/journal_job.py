"""
A journalled job, run as a child process by tests/faults/test_journal_kill.py, which SIGKILLs it.

Each item's unit is not idempotent: ``UPDATE jk_counters SET n = n + 1 WHERE id = :item`` and an
``INSERT INTO jk_effects (item)`` without a natural key (the test creates both tables). The job is
``runner.map(fn, range(items), journal=Journal(job, key=int, table=...))``, so a rerun after a kill
must skip every item whose unit committed.

On SQLite its connections set ``PRAGMA synchronous = OFF``: a SIGKILL ends the process, not the
operating system, so what SQLite wrote reaches the file without an fsync (and its rollback journal
still undoes a transaction the kill cut short); fsyncs would make the job ten times slower.

It prints ``started`` once its runner exists, and as its last line a JSON object: the run's stats
and its failures. It imports nothing from the test suite: ``python tests/support/journal_job.py
--help`` runs it by hand.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from typing import Any

import anyio
from sqlalchemy import create_engine, event, text
from sqlalchemy.engine import Engine, make_url
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker, create_async_engine
from sqlalchemy.orm import Session, sessionmaker

from boundeddb import BatchPolicy, ChunkedRunner, Journal, RunReport, SemaphoreRunner, ThreadOffloadRunner

BUMP = text("UPDATE jk_counters SET n = n + 1 WHERE id = :item")
EFFECT = text("INSERT INTO jk_effects (item) VALUES (:item)")


def parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--url", required=True, help="a SQLAlchemy URL with its driver")
    parser.add_argument("--runner", choices=["semaphore", "chunked", "threads"], required=True)
    parser.add_argument("--batch", type=int, default=0, help="BatchPolicy(size); 0: one transaction per unit")
    parser.add_argument("--items", type=int, required=True)
    parser.add_argument("--job", required=True)
    parser.add_argument("--table", default="boundeddb_journal", help="the journal's table")
    parser.add_argument("--schema", help="PostgreSQL: the search_path")
    parser.add_argument("--app", help="PostgreSQL: the application_name")
    parser.add_argument("--limit", type=int, default=8)
    parser.add_argument("--pause", type=float, default=0.0, help="the most seconds a unit sleeps (random)")
    parser.add_argument("--seed", type=int, default=0)
    return parser.parse_args(argv)


def engine_options(args: argparse.Namespace) -> dict[str, Any]:
    """The pool, and for PostgreSQL the schema and application_name, as the suite's fixtures set them."""
    options: dict[str, Any] = {"pool_size": args.limit, "max_overflow": 0}
    driver = make_url(args.url).get_driver_name()
    if driver == "asyncpg":
        settings = {"search_path": args.schema, "application_name": args.app}
        options["connect_args"] = {"server_settings": {k: v for k, v in settings.items() if v}}
    elif driver in ("psycopg", "psycopg2"):
        connect_args: dict[str, Any] = {}
        if args.schema:
            connect_args["options"] = f"-c search_path={args.schema}"
        if args.app:
            connect_args["application_name"] = args.app
        options["connect_args"] = connect_args
    return options


def unsynced_sqlite(engine: Engine) -> None:
    """On SQLite, no fsync at COMMIT (see the module's docstring)."""
    if engine.dialect.name != "sqlite":
        return

    def connected(dbapi_connection: Any, _record: Any) -> None:
        cursor = dbapi_connection.cursor()
        cursor.execute("PRAGMA synchronous = OFF")
        cursor.close()

    event.listen(engine, "connect", connected)


def summary(report: RunReport[Any]) -> dict[str, Any]:
    stats = report.stats
    outcomes = report.outcomes
    return {
        "submitted": stats.submitted,
        "elapsed_s": round(stats.elapsed_s, 2),
        "succeeded": stats.succeeded,
        "failed": stats.failed,
        "skipped": stats.skipped,
        "commit_unknown": sum(o.commit_unknown for o in outcomes),
        "outcomes": len(outcomes),
        "skipped_outcomes": sum(o.skipped for o in outcomes),
        "ok_outcomes": sum(o.ok for o in outcomes),
        "failures": [
            f"item {o.index} after {o.attempts} attempt(s): {type(o.error).__name__}: {o.error}"[:300]
            for o in outcomes
            if o.error is not None
        ][:20],
    }


def main(argv: list[str]) -> None:
    args = parse(argv)
    rng = random.Random(args.seed)
    journal: Journal[int] = Journal(args.job, key=int, table=args.table)
    batch = BatchPolicy(args.batch) if args.batch else None
    items = range(args.items)

    def pause() -> float:
        return rng.uniform(0, args.pause) if args.pause else 0.0

    if args.runner == "threads":

        def bump(session: Session, item: int) -> int:
            session.execute(BUMP, {"item": item})
            if seconds := pause():
                time.sleep(seconds)
            session.execute(EFFECT, {"item": item})
            return item

        engine = create_engine(args.url, **engine_options(args))
        unsynced_sqlite(engine)
        try:
            runner = ThreadOffloadRunner(
                sessionmaker(engine), limit=args.limit, errors="collect", batch=batch
            )
            with runner:
                print("started", flush=True)
                report = runner.map_sync(bump, items, journal=journal)
        finally:
            engine.dispose()
    else:

        async def abump(session: AsyncSession, item: int) -> int:
            await session.execute(BUMP, {"item": item})
            if seconds := pause():
                await anyio.sleep(seconds)
            await session.execute(EFFECT, {"item": item})
            return item

        async def run() -> RunReport[int]:
            engine = create_async_engine(args.url, **engine_options(args))
            unsynced_sqlite(engine.sync_engine)
            try:
                sessions = async_sessionmaker(engine)
                runner: SemaphoreRunner | ChunkedRunner
                if args.runner == "semaphore":
                    runner = SemaphoreRunner(sessions, limit=args.limit, errors="collect", batch=batch)
                else:
                    runner = ChunkedRunner(sessions, chunk_size=args.limit, errors="collect", batch=batch)
                async with runner:
                    print("started", flush=True)
                    return await runner.map(abump, items, journal=journal)
            finally:
                await engine.dispose()

        report = anyio.run(run)
    print(json.dumps(summary(report)), flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
