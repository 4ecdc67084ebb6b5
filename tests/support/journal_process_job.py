"""
A journalled ProcessRunner job, run as a child process by tests/faults/test_journal_process_kill.py,
which SIGKILLs it (its parent alone, or with its workers); that test's in-process case uses the units.

Each item's unit is not idempotent: ``UPDATE jpk_counters SET n = n + 1 WHERE id = :item`` and an
``INSERT INTO jpk_effects (item, pid)`` without a natural key (the test creates both tables). The
job is ``ProcessRunner(url, limit=4, processes=2, errors="collect").map_sync(fn, range(items),
journal=Journal(job, key=int, table=...))``, so a rerun after a kill must skip every item whose
unit committed, and run every other one once.

The units are module-level functions, which the spawned workers import by this module's name
(``tests.support.journal_process_job``): run it as ``python -m tests.support.journal_process_job``
from the repository's root (or with the root on ``PYTHONPATH``).

It prints ``started`` once its runner exists, and as its last line a JSON object: the run's stats
and its failures.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import time
from functools import partial
from typing import Any

import anyio
from sqlalchemy import text
from sqlalchemy.engine import make_url
from sqlalchemy.ext.asyncio import AsyncSession
from sqlalchemy.orm import Session

__all__ = ["COUNTERS", "EFFECTS", "bump", "bump_sync", "engine_options", "main", "summary"]

#: The tables the units write, which the test creates: a counter per item, and effects rows with a
#: surrogate key only (``id``), so a unit that ran twice leaves two rows for its item.
COUNTERS = "jpk_counters"
EFFECTS = "jpk_effects"

BUMP = text(f"UPDATE {COUNTERS} SET n = n + 1 WHERE id = :item")
EFFECT = text(f"INSERT INTO {EFFECTS} (item, pid) VALUES (:item, :pid)")


async def bump(session: AsyncSession, item: int, pause: float = 0.0) -> int:
    """Bump the item's counter, sleep up to ``pause`` seconds (random), add its effects row."""
    await session.execute(BUMP, {"item": item})
    if pause:
        await anyio.sleep(random.uniform(0, pause))
    await session.execute(EFFECT, {"item": item, "pid": os.getpid()})
    return item


def bump_sync(session: Session, item: int, pause: float = 0.0) -> int:
    """As :func:`bump`, for a sync driver, in a worker's thread."""
    session.execute(BUMP, {"item": item})
    if pause:
        time.sleep(random.uniform(0, pause))
    session.execute(EFFECT, {"item": item, "pid": os.getpid()})
    return item


def engine_options(driver: str, schema: str | None, app: str | None) -> dict[str, Any]:
    """The workers' ``engine_options``: the schema and application_name, as the suite's fixtures set them."""
    if driver == "asyncpg":
        settings = {"search_path": schema, "application_name": app}
        return {"connect_args": {"server_settings": {k: v for k, v in settings.items() if v}}}
    connect_args: dict[str, Any] = {}
    if schema:
        connect_args["options"] = f"-c search_path={schema}"
    if app:
        connect_args["application_name"] = app
    return {"connect_args": connect_args}


def summary(report: Any) -> dict[str, Any]:
    """What the test reads of a run's report."""
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
        "indices_in_order": [o.index for o in outcomes] == list(range(len(outcomes))),
        "skipped_outcomes": sum(o.skipped for o in outcomes),
        "ok_outcomes": sum(o.ok for o in outcomes),
        "failures": [
            f"item {o.index} after {o.attempts} attempt(s): {type(o.error).__name__}: {o.error}"[:300]
            for o in outcomes
            if o.error is not None
        ][:20],
    }


def parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--url", required=True, help="a SQLAlchemy URL: asyncpg runs bump, psycopg bump_sync")
    parser.add_argument("--items", type=int, required=True)
    parser.add_argument("--job", required=True)
    parser.add_argument("--table", default="boundeddb_journal", help="the journal's table")
    parser.add_argument("--batch", type=int, default=0, help="BatchPolicy(size); 0: one transaction per unit")
    parser.add_argument("--schema", help="PostgreSQL: the search_path")
    parser.add_argument("--app", help="PostgreSQL: the application_name")
    parser.add_argument("--pause", type=float, default=0.0, help="the most seconds a unit sleeps (random)")
    return parser.parse_args(argv)


def main(argv: list[str]) -> None:
    # By this module's name, not __main__'s: what the workers import.
    from boundeddb import BatchPolicy, Journal, ProcessRunner
    from tests.support import journal_process_job as units

    args = parse(argv)
    url = make_url(args.url)
    driver = url.get_driver_name()
    fn: Any = units.bump if url.get_dialect().is_async else units.bump_sync
    if args.pause:
        fn = partial(fn, pause=args.pause)
    journal: Journal[int] = Journal(args.job, key=int, table=args.table)
    runner = ProcessRunner(
        url,
        limit=4,
        processes=2,
        errors="collect",
        engine_options=engine_options(driver, args.schema, args.app),
        batch=BatchPolicy(args.batch) if args.batch else None,
    )
    with runner:
        print("started", flush=True)
        report = runner.map_sync(fn, range(args.items), journal=journal)
    print(json.dumps(summary(report)), flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
