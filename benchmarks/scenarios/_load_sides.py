"""
The ``load`` scenario's sides (:mod:`.load`): a :class:`Side` (a driver, a way of writing, its rows)
and :func:`measure`, which runs one on fresh tables and checks the rows it left.

A side runs on an engine of :data:`~benchmarks.scenarios._load_rows.LIMIT` connections
(:data:`SQLITE_LIMIT` on SQLite) opened and warmed before the timed part: the hand-written loop
(:mod:`._load_hand`), ``load()`` (with a journal: ``Journal(JOB)``, its job forgotten before the
side), or ORM units, ``batch=500`` or one transaction per row, on the first
:data:`~benchmarks.scenarios._load_rows.ORM_ROWS` or
:data:`~benchmarks.scenarios._load_rows.SINGLE_ROWS` rows.  Each records the transactions committed
and rolled back, the garbage collector's runs, the load's report, and then counts the rows: each
good row exactly once, no duplicate (``rows``).
"""

from __future__ import annotations

import asyncio
import dataclasses
import gc
from typing import Any

from sqlalchemy.ext.asyncio import async_sessionmaker
from sqlalchemy.orm import sessionmaker

from boundeddb import Journal, SemaphoreRunner, ThreadOffloadRunner

from ..db.schema import SCHEMA
from ..harness import Probe
from ._batching import count_transactions, warm, warm_sync
from ._load_hand import (
    HAND_VALUES,
    hand_copy_asyncpg,
    hand_copy_psycopg,
    hand_insert_aiomysql,
    hand_insert_sqlite,
)
from ._load_places import Place
from ._load_rows import BATCH, LIMIT, ORM_BATCH, ORM_ROWS, SINGLE_ROWS, Input, seed_rows
from .journal import _in_schema

#: The group of the scenario's measurements.
GROUP = "load"
#: SQLite's connections: one writer.
SQLITE_LIMIT = 1
#: The job of the sides with a journal.
JOB = "bench-load"


@dataclasses.dataclass(frozen=True)
class Side:
    """One measurement: a driver, a way of writing, its rows."""

    driver: str  # asyncpg, psycopg, aiomysql, pysqlite
    kind: str  # load, hand, hand-values, staging, orm-batch, orm-single
    work: Input
    batch: int | None = BATCH
    journal: bool = False

    @property
    def is_async(self) -> bool:
        return self.driver in ("asyncpg", "aiomysql")

    def label(self, round_no: int, rounds: int) -> str:
        parts = [f"load {self.work.workload} {self.driver} {self.kind}"]
        if self.batch is not None:
            parts.append(f"batch={self.batch}")
        if self.journal:
            parts.append("journal")
        if self.work.duplicates:
            parts.append("1% duplicates")
        return " ".join(parts) + (f" round {round_no}" if rounds > 1 else "")


async def measure(place: Place, side: Side, round_no: int, rounds: int) -> None:
    """One side on fresh tables: rows/s, transactions, the load's report, the rows left."""
    ctx, work = place.ctx, side.work
    place.reset(seed_rows(work.duplicates) if work.duplicates else [])
    label = side.label(round_no, rounds)
    app = ctx.app_name(label)
    limit = SQLITE_LIMIT if place.name == "sqlite" else LIMIT
    config = {
        "database": place.name,
        "driver": side.driver,
        "kind": side.kind,
        "workload": work.workload,
        "batch": side.batch,
        "journal": side.journal,
        "duplicates": work.duplicates,
        "rows_in": len(work.rows),
        "limit": limit,
        "pool_size": limit,
        "max_overflow": 0,
        "round": round_no,
    }
    probe = Probe(
        ctx,
        GROUP,
        label,
        total=len(work.rows),
        app_name=app,
        group=GROUP,
        config=config,
        bar=side.kind != "load",
    )
    engine: Any
    if side.is_async:
        assert place.async_engine is not None
        engine = place.async_engine(app, limit)
        await warm(engine, limit)
        sync_engine = engine.sync_engine
    else:
        assert place.sync_engine is not None
        engine = place.sync_engine(app, limit)
        await asyncio.to_thread(warm_sync, engine, limit)
        sync_engine = engine
    report: Any = None
    inserted: int | None = None
    try:
        journal = Journal(JOB) if side.journal else None
        if journal is not None:
            await _in_schema(engine, Journal.create)
            await _in_schema(engine, journal.forget)
        counts = count_transactions(sync_engine)
        collections = _collections()
        if side.kind in ("hand", "hand-values", "staging"):
            async with probe as p:
                if side.driver == "asyncpg":
                    inserted = await hand_copy_asyncpg(engine, work, p, staging=side.kind == "staging")
                elif side.driver == "psycopg":
                    inserted = await asyncio.to_thread(hand_copy_psycopg, engine, work, p)
                elif side.driver == "aiomysql":
                    inserted = await hand_insert_aiomysql(engine, work, p)
                else:
                    values = HAND_VALUES if side.kind == "hand-values" else 1
                    inserted = await asyncio.to_thread(hand_insert_sqlite, engine, work, p, values=values)
                p.succeeded = len(work.rows)
        elif side.kind == "load":
            sessions: Any = (async_sessionmaker if side.is_async else sessionmaker)(
                engine, expire_on_commit=False
            )
            kind: Any = SemaphoreRunner if side.is_async else ThreadOffloadRunner
            async with kind(sessions, limit=limit) as runner, probe as p:
                options = {"batch": side.batch, "journal": journal, "progress": p.runner_progress()}
                try:
                    if side.is_async:
                        report = await runner.load(work.target, work.rows, **options)
                    else:
                        report = await asyncio.to_thread(runner.load_sync, work.target, work.rows, **options)
                except Exception as exc:  # what stopped it: LoadFailed's cause
                    if exc.__cause__ is not None:
                        p.m.extra["cause"] = f"{type(exc.__cause__).__name__}: {exc.__cause__}"[:500]
                    raise
                p.succeeded = report.loaded + len(report.rejected)
        else:
            await _orm(engine, side, limit, probe)
        probe.m.extra["gc_collections"] = [b - a for a, b in zip(collections, _collections(), strict=True)]
    finally:
        if side.is_async:
            await engine.dispose()
        else:
            engine.dispose()
    m = probe.m
    m.extra.update(counts)
    if report is not None:
        m.extra.update(
            loaded=report.loaded,
            rejected=len(report.rejected),
            skipped=report.skipped,
            transactions=report.transactions,
        )
    if inserted is not None:
        m.extra["inserted"] = inserted
    if journal is not None and not m.error:
        m.extra["journal_rows"] = _journal_rows(place)
    m.extra["rows"] = _check(place, side, report, inserted)


def _collections() -> list[int]:
    """How many times the garbage collector has run, by generation, in this process."""
    return [generation["collections"] for generation in gc.get_stats()]


async def _orm(engine: Any, side: Side, limit: int, probe: Probe) -> None:
    """``batch=500`` ORM units (``session.add(Row(**row))``), or one transaction per row, on the runner."""
    work = side.work
    n = min(len(work.rows), ORM_ROWS if side.kind == "orm-batch" else SINGLE_ROWS)
    rows = work.rows[:n]
    probe.m.n = n
    probe.m.config["rows_in"] = n
    batch = ORM_BATCH if side.kind == "orm-batch" else None
    if side.is_async:

        def async_unit(row: dict[str, Any]) -> Any:
            async def unit(session: Any) -> None:
                session.add(work.orm(row))

            return unit

        sessions: Any = async_sessionmaker(engine, expire_on_commit=False)
        runner = SemaphoreRunner(sessions, limit=limit, batch=batch, errors="collect")
        async with runner, probe as p:
            result = await runner.run([async_unit(r) for r in rows], progress=p.runner_progress())
            p.succeeded = sum(1 for o in result.outcomes if o.error is None)
            p.failed = n - p.succeeded
    else:

        def sync_unit(row: dict[str, Any]) -> Any:
            def unit(session: Any) -> None:
                session.add(work.orm(row))

            return unit

        sessions = sessionmaker(engine, expire_on_commit=False)
        thread_runner = ThreadOffloadRunner(sessions, limit=limit, batch=batch, errors="collect")
        async with thread_runner, probe as p:
            result = await thread_runner.run([sync_unit(r) for r in rows], progress=p.runner_progress())
            p.succeeded = sum(1 for o in result.outcomes if o.error is None)
            p.failed = n - p.succeeded


def _journal_rows(place: Place) -> int | None:
    if place.name != "postgresql":
        return None
    with place.ctx.db.connect() as conn:
        row = conn.execute(
            f"SELECT count(*) FROM {SCHEMA}.boundeddb_journal WHERE job = %s", (JOB,)
        ).fetchone()
    return int(row[0]) if row else None


def _check(place: Place, side: Side, report: Any, inserted: int | None) -> dict[str, Any]:
    """The rows left against what the side should leave: every good row once, no duplicate key."""
    work = side.work
    n = (
        len(work.rows)
        if side.kind in ("load", "hand", "hand-values", "staging")
        else min(len(work.rows), ORM_ROWS if side.kind == "orm-batch" else SINGLE_ROWS)
    )
    good = n - work.duplicates
    log = work.workload == "log"
    found, distinct = place.count(work.table, log)
    expected: dict[str, int] = {"rows": good + work.duplicates}  # the seeded rows are there too
    got: dict[str, int] = {"rows": found}
    if log:
        expected["distinct"], got["distinct"] = good + work.duplicates, distinct
    if report is not None:
        expected.update(loaded=good, rejected=work.duplicates)
        got.update(loaded=report.loaded, rejected=len(report.rejected))
    return {"expected": expected, "found": got, "ok": got == expected}
