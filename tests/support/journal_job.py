"""
A journalled job on one runner, run as a child process by tests/faults/test_journal_kill.py, which kills it.

The job is ``runner.map(fn, range(items), journal=Journal(job, key=int, table=...))`` on a SemaphoreRunner,
a ChunkedRunner or a ThreadOffloadRunner (``map_sync``), its units and what it prints those of
tests/support/journal_kill.py; so a rerun after a kill must skip every item whose unit committed.
Run it as ``python -m tests.support.journal_job`` from the repository's root (or with the root on
``PYTHONPATH``).

On SQLite its connections set ``PRAGMA synchronous = OFF``: a SIGKILL ends the process, not the
operating system, so what SQLite wrote reaches the file without an fsync (and its rollback journal
still undoes a transaction the kill cut short); fsyncs would make the job ten times slower.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

import anyio
from sqlalchemy import create_engine, event
from sqlalchemy.engine import Engine, make_url
from sqlalchemy.ext.asyncio import async_sessionmaker, create_async_engine
from sqlalchemy.orm import sessionmaker

from boundeddb import ChunkedRunner, RunReport, SemaphoreRunner, ThreadOffloadRunner
from tests.support import journal_kill as shared


def parse(argv: list[str]) -> argparse.Namespace:
    parser = shared.job_parser(__doc__)
    parser.add_argument("--runner", choices=["semaphore", "chunked", "threads"], required=True)
    parser.add_argument("--limit", type=int, default=8)
    return parser.parse_args(argv)


def unsynced_sqlite(engine: Engine) -> None:
    """On SQLite, no fsync at COMMIT (see the module's docstring)."""
    if engine.dialect.name != "sqlite":
        return

    def connected(dbapi_connection: Any, _record: Any) -> None:
        cursor = dbapi_connection.cursor()
        cursor.execute("PRAGMA synchronous = OFF")
        cursor.close()

    event.listen(engine, "connect", connected)


def main(argv: list[str]) -> None:
    args = parse(argv)
    fn = shared.unit(args.url, args.pause)
    items = range(args.items)
    journal = shared.journal(args.job, args.table)
    batch = shared.batch_policy(args.batch)
    driver = make_url(args.url).get_driver_name()
    options = {
        "pool_size": args.limit,
        "max_overflow": 0,
        **shared.engine_options(driver, args.schema, args.app),
    }

    if args.runner == "threads":
        engine = create_engine(args.url, **options)
        unsynced_sqlite(engine)
        try:
            runner = ThreadOffloadRunner(
                sessionmaker(engine), limit=args.limit, errors="collect", batch=batch
            )
            with runner:
                shared.say_started()
                report = runner.map_sync(fn, items, journal=journal)
        finally:
            engine.dispose()
    else:

        async def run() -> RunReport[int]:
            engine = create_async_engine(args.url, **options)
            unsynced_sqlite(engine.sync_engine)
            try:
                sessions = async_sessionmaker(engine)
                runner: SemaphoreRunner | ChunkedRunner
                if args.runner == "semaphore":
                    runner = SemaphoreRunner(sessions, limit=args.limit, errors="collect", batch=batch)
                else:
                    runner = ChunkedRunner(sessions, chunk_size=args.limit, errors="collect", batch=batch)
                async with runner:
                    shared.say_started()
                    return await runner.map(fn, items, journal=journal)
            finally:
                await engine.dispose()

        report = anyio.run(run)
    shared.say_report(report)


if __name__ == "__main__":
    main(sys.argv[1:])
