"""
A journalled ``load()``, run as a child process by tests/faults/test_load_kill.py, which SIGKILLs it.

The job loads ``--rows`` rows (:func:`rows`, the same for every run of the same arguments) into
``lk_rows`` with ``Journal(job)`` (no key: the journal names committed runs of input indexes,
``rows:START-STOP``) through a SemaphoreRunner, a ChunkedRunner or a ThreadOffloadRunner
(``load_sync``), ``--batch`` rows per transaction, and ``errors="collect"``. Every
``REFUSE_EVERY``-th row is one the database refuses: in the ``keyed`` table (``id`` its primary key)
a duplicate of a row the test put there before, in the ``unkeyed`` one (no key at all, so a row
loaded twice shows as two) a NULL or negative ``value`` (NOT NULL, CHECK). Each good row's ``idx``
is its input index.

So that kills land inside transactions, the job sleeps half ``--pause`` seconds to all of it around
each journal INSERT, half before it (the chunk's rows written, its journal rows not yet) and half after
it (its COMMIT next). It prints
``started`` once its runner exists and, as its last line, a JSON object: the report.
Run it as ``python -m tests.support.load_job`` from the repository's root.

On SQLite its connections set ``PRAGMA synchronous = OFF``, as tests/support/journal_job.py does.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from collections.abc import AsyncIterator, Iterator
from typing import Any

import anyio
from sqlalchemy import CheckConstraint, Column, Integer, MetaData, String, Table, create_engine, event
from sqlalchemy.engine import Engine, make_url
from sqlalchemy.ext.asyncio import async_sessionmaker, create_async_engine
from sqlalchemy.orm import sessionmaker

from boundeddb import ChunkedRunner, Journal, LoadReport, SemaphoreRunner, ThreadOffloadRunner
from tests.support.journal_job import unsynced_sqlite
from tests.support.journal_kill import engine_options

#: One row in this many is refused by the database: spread through the input, a few per chunk at most.
REFUSE_EVERY = 37
#: The ``keyed`` table's rows put there before the load, whose ids the refused rows repeat.
TAKEN_IDS = range(1_000_000, 1_000_005)

metadata = MetaData()
#: ``id`` its primary key: a refused row repeats one of TAKEN_IDS.
keyed = Table(
    "lk_rows",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=False),
    Column("idx", Integer, nullable=False),
    Column("value", Integer, nullable=False),
    Column("note", String(40), nullable=False),
)
#: No key, no index: a good row loaded twice is there twice. A refused row's value is NULL or negative.
unkeyed = Table(
    "lk_rows",
    MetaData(),
    Column("id", Integer, nullable=False),
    Column("idx", Integer, nullable=False),
    Column("value", Integer, nullable=False),
    Column("note", String(40), nullable=False),
    CheckConstraint("value >= 0", name="lk_rows_value_not_negative"),
)
TABLES = {"keyed": keyed, "unkeyed": unkeyed}


def refused(index: int) -> bool:
    """Whether the row at ``index`` is one the database refuses."""
    return index % REFUSE_EVERY == REFUSE_EVERY // 2


def row(variant: str, index: int) -> dict[str, Any]:
    """The input's row at ``index``: a good one (``id`` and ``idx`` the index), or a :func:`refused` one."""
    if not refused(index):
        return {"id": index, "idx": index, "value": index, "note": f"row {index}"}
    if variant == "keyed":
        taken = TAKEN_IDS[(index // REFUSE_EVERY) % len(TAKEN_IDS)]
        return {"id": taken, "idx": index, "value": index, "note": f"repeats {taken}"}
    value = None if (index // REFUSE_EVERY) % 2 else -index
    return {"id": index, "idx": index, "value": value, "note": f"bad value {value}"}


def rows(variant: str, count: int) -> Iterator[dict[str, Any]]:
    """The job's input: the same rows in the same order for each run."""
    return (row(variant, index) for index in range(count))


async def rows_async(variant: str, count: int) -> AsyncIterator[dict[str, Any]]:
    """:func:`rows` as an async iterable."""
    for index in range(count):
        yield row(variant, index)


def taken_rows() -> list[dict[str, Any]]:
    """The ``keyed`` table's rows before the load (their ``idx`` negative: no input row's)."""
    return [{"id": id_, "idx": -1 - n, "value": 0, "note": "taken"} for n, id_ in enumerate(TAKEN_IDS)]


def parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--url", required=True, help="a SQLAlchemy URL")
    parser.add_argument("--runner", choices=["semaphore", "chunked", "threads"], required=True)
    parser.add_argument("--variant", choices=sorted(TABLES), required=True)
    parser.add_argument("--rows", type=int, required=True)
    parser.add_argument("--job", required=True)
    parser.add_argument("--batch", type=int, required=True)
    parser.add_argument("--limit", type=int, default=4)
    parser.add_argument(
        "--pause", type=float, default=0.0, help="the most seconds to sleep around a journal INSERT"
    )
    parser.add_argument("--schema", help="PostgreSQL: the search_path")
    parser.add_argument("--app", help="PostgreSQL: the application_name")
    return parser.parse_args(argv)


def pause_around_journal(engine: Engine, pause: float) -> None:
    """
    Sleep ``pause`` / 2 to ``pause`` seconds in all around each journal INSERT, half before and half
    after it: inside the chunk's transaction, its rows written and its journal rows not yet, then both.
    """
    if not pause:
        return

    def journal_insert(statement: str) -> bool:
        return statement.lstrip().upper().startswith("INSERT") and "boundeddb_journal" in statement

    def around(_conn: Any, _cursor: Any, statement: str, *_args: Any) -> None:
        if journal_insert(statement):
            time.sleep(random.uniform(pause / 4, pause / 2))

    event.listen(engine, "before_cursor_execute", around)
    event.listen(engine, "after_cursor_execute", around)


def summary(report: LoadReport) -> dict[str, Any]:
    """What the test reads of the load's report."""
    stats = report.stats
    return {
        "loaded": report.loaded,
        "skipped": report.skipped,
        "rejected": [rejected.index for rejected in report.rejected],
        "rejected_errors": sorted({type(rejected.error).__name__ for rejected in report.rejected}),
        "transactions": report.transactions,
        "failed": stats.failed,
        "elapsed_s": round(stats.elapsed_s, 2),
    }


def main(argv: list[str]) -> None:
    args = parse(argv)
    table = TABLES[args.variant]
    journal: Journal[Any] = Journal(args.job)
    driver = make_url(args.url).get_driver_name()
    options = {"pool_size": args.limit, "max_overflow": 0, **engine_options(driver, args.schema, args.app)}

    if args.runner == "threads":
        engine = create_engine(args.url, **options)
        unsynced_sqlite(engine)
        pause_around_journal(engine, args.pause)
        try:
            with ThreadOffloadRunner(sessionmaker(engine), limit=args.limit) as threads:
                print("started", flush=True)
                report = threads.load_sync(
                    table, rows(args.variant, args.rows), batch=args.batch, journal=journal
                )
        finally:
            engine.dispose()
    else:

        async def run() -> LoadReport:
            engine = create_async_engine(args.url, **options)
            unsynced_sqlite(engine.sync_engine)
            pause_around_journal(engine.sync_engine, args.pause)
            try:
                sessions = async_sessionmaker(engine)
                runner: SemaphoreRunner | ChunkedRunner
                if args.runner == "semaphore":
                    runner = SemaphoreRunner(sessions, limit=args.limit)
                else:
                    runner = ChunkedRunner(sessions, chunk_size=args.limit)
                async with runner:
                    print("started", flush=True)
                    return await runner.load(
                        table, rows_async(args.variant, args.rows), batch=args.batch, journal=journal
                    )
            finally:
                await engine.dispose()

        report = anyio.run(run)
    print(json.dumps(summary(report)), flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
