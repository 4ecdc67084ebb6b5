"""
``load``: ``runner.load(target, rows)`` (the bulk path) against hand-written bulk loops on the same
driver and connections, against ``batch=500`` ORM units and one transaction per row.

The rows are :data:`~benchmarks.scenarios._batching.LogRow` request-log rows given as dicts (``--load-rows``,
200,000 by default; 20,000 with ``--quick``), written into the suite's ``request_log`` table (a
unique ``request_id``, a serial key), and the post's creates as rows of ``a`` (``{"data": ...}``, three a
create, ``create_date`` its server default).  Every side runs on fresh tables, on an engine of
:data:`LIMIT` (8) connections opened before the timed part:

* **PostgreSQL, asyncpg** (``SemaphoreRunner(limit=8).load``): the hand-written loop puts chunks of
  :data:`BATCH` records (tuples, turned from the dicts as it goes) on a queue that 8 coroutines take
  from, each chunk ``copy_records_to_table()`` on a pooled connection in a transaction of its own;
  ``batch=500`` ORM units (``SemaphoreRunner(batch=500).run``, a ``session.add(LogRow(**row))`` a unit,
  on :data:`ORM_ROWS` rows) and one transaction per row (:data:`SINGLE_ROWS` rows).  Beside them:
  ``load()`` with a journal (``Journal(job)``, its job forgotten before the side); ``load()`` with 1%
  duplicate keys (every hundredth row or so, at seeded places spread through the input, repeats an
  earlier row's ``request_id``: refused, each alone); the hand-written alternative for duplicates,
  each chunk ``COPY``'d into a temporary staging table and moved with ``INSERT ... ON CONFLICT DO
  NOTHING`` (the duplicates dropped, not reported); ``load()`` at ``batch=`` 1,000 and 20,000
  (:data:`SIZES`) beside the default; the creates' rows: ``load(A, rows)``, the hand loop, ``batch=500``
  ORM units.  And the **row preparation**: the time ``load()`` spends turning the rows into chunks of
  records (its chunk units built from the rows alone, no database), against the whole load's.
* **PostgreSQL, psycopg 3** (``ThreadOffloadRunner(limit=8).load_sync``): 8 threads taking chunks
  from one iterator, each ``cursor.copy()`` ``write_row()`` a record at a time; ``batch=500`` ORM units.
* **MariaDB, aiomysql** (``SemaphoreRunner(limit=8).load``, ``$BOUNDEDDB_BENCH_MYSQL_URL`` or the
  local default; skipped with a note if none answers): 8 coroutines, each chunk one
  ``cursor.executemany()`` (aiomysql sends it as multi-row ``INSERT`` statements) and a commit;
  ``batch=500`` ORM units, one transaction per row.
* **SQLite, pysqlite** (``ThreadOffloadRunner(limit=1).load_sync``: one writer): a file in a
  temporary directory (WAL), one thread, each chunk ``cursor.executemany()`` and a commit, and the
  same thread with multi-row ``INSERT`` statements of :data:`HAND_VALUES` rows, as ``load()`` sends
  them; ``batch=500`` ORM units, one transaction per row.

rows/s is input rows (loaded or rejected) per second of wall time.  Every side's rows are counted
afterwards: each good row exactly once, no duplicate (``rows``).  ``--load-rounds K``
(:data:`DEFAULT_ROUNDS`, 1 with ``--quick``) runs every group K times, each in the opposite order
of the round before; :mod:`benchmarks.report.load` turns the rows into the "Load" section and its
goals (medians of per-round ratios).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import gc
import itertools
import operator
import random
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from sqlalchemy import create_engine, event, insert, text
from sqlalchemy.engine import Connection, Engine
from sqlalchemy.ext.asyncio import AsyncEngine, async_sessionmaker
from sqlalchemy.orm import sessionmaker
from sqlalchemy.pool import NullPool

from boundeddb import Journal, SemaphoreRunner, ThreadOffloadRunner

from ..db import mysql as mysql_db
from ..db.schema import SCHEMA, A, Base
from ..harness import Context, Probe
from ..scenario import Scenario
from ._batching import LogBase, LogRow, count_transactions, warm, warm_sync
from .journal import _in_schema, _search_path

GROUP = "load"
#: Connections (so chunks in flight) on PostgreSQL and MariaDB; SQLite has one writer.
LIMIT = 8
SQLITE_LIMIT = 1
#: Rows a statement of the hand-written multi-row INSERT loop on SQLite: load()'s own size.
HAND_VALUES = 1000
#: load()'s default rows per transaction, and the other sizes measured beside it (asyncpg).
BATCH = 5000
SIZES = (1000, 20000)
#: The ORM sides' rows: batch=500 units, and one transaction per row (their rows/s does not need 200,000).
ORM_BATCH = 500
ORM_ROWS = 40_000
SINGLE_ROWS = 3_000
#: The share of rows that repeat an earlier row's key.
DUP_SHARE = 0.01
#: The rows by default and with --quick; rounds by default and with --quick.
DEFAULT_ROWS, QUICK_ROWS = 200_000, 20_000
DEFAULT_ROUNDS, QUICK_ROUNDS = 3, 1
#: Rough seconds of one round at the default rows on 2 quiet cores, and of the set-up.
SECONDS_PER_ROUND, SETUP_S = 32, 5
JOB = "bench-load"
LOG_COLUMNS = ("request_id", "path", "status", "duration_ms")
CREATE_COLUMNS = ("data",)


# -- the rows -----------------------------------------------------------------------------------------


def log_rows(n: int) -> list[dict[str, Any]]:
    """``n`` request-log rows as dicts, each ``request_id`` its index."""
    return [
        {
            "request_id": i,
            "path": f"/items/{i % 997}",
            "status": 404 if i % 10 == 0 else 200,
            "duration_ms": (i % 50) / 10,
        }
        for i in range(n)
    ]


def with_duplicates(rows: list[dict[str, Any]], seed: int) -> tuple[list[dict[str, Any]], int]:
    """
    A copy of ``rows`` in which :data:`DUP_SHARE` of them, at seeded places spread through the input,
    carry a key already in the table (-1, -2, ...: :func:`seed_rows`, written before the side); and how
    many.  Keys already committed, not keys of other rows of the input: two chunks in flight that
    insert each other's keys wait for each other, and PostgreSQL ends one with a deadlock.
    """
    rng = random.Random(seed)
    out = [dict(r) for r in rows]
    places = sorted(rng.sample(range(len(rows)), max(1, round(len(rows) * DUP_SHARE))))
    for j, p in enumerate(places):
        out[p]["request_id"] = -(j + 1)
    return out, len(places)


def seed_rows(k: int) -> list[dict[str, Any]]:
    """The rows whose keys the duplicates repeat, in the table before a side with duplicates."""
    return [{"request_id": -(j + 1), "path": "/seed", "status": 200, "duration_ms": 0.0} for j in range(k)]


def create_rows(n: int, seed: int) -> list[dict[str, Any]]:
    """The post's creates as ``n`` rows of ``a``: three a create, ``data`` as the post makes it."""
    rng = random.Random(seed)
    out: list[dict[str, Any]] = []
    while len(out) < n:
        data = rng.randint(1, 100_000)
        out += [{"data": str(data + k)} for k in (1, 2, 3)]
    return out[:n]


@dataclasses.dataclass(frozen=True)
class Input:
    """The rows of one side: what they are, the table, and what they should leave."""

    workload: str  # "log" or "creates"
    rows: list[dict[str, Any]]
    duplicates: int = 0

    @property
    def columns(self) -> tuple[str, ...]:
        return LOG_COLUMNS if self.workload == "log" else CREATE_COLUMNS

    @property
    def target(self) -> Any:
        return LogRow if self.workload == "log" else A

    @property
    def table(self) -> str:
        return "request_log" if self.workload == "log" else "a"

    def records(self, rows: list[dict[str, Any]]) -> list[tuple[Any, ...]]:
        """What a hand-written loop sends: each dict's values in the columns' order."""
        if len(self.columns) == 1:
            key = self.columns[0]
            return [(r[key],) for r in rows]
        get = operator.itemgetter(*self.columns)
        return [get(r) for r in rows]

    def orm(self, row: dict[str, Any]) -> Any:
        return LogRow(**row) if self.workload == "log" else A(**row)


# -- the databases ------------------------------------------------------------------------------------


def _recreate(conn: Connection, seeded: list[dict[str, Any]]) -> None:
    """The scenario's tables dropped and made again, the ``seeded`` request-log rows in them."""
    LogBase.metadata.drop_all(conn)
    Base.metadata.drop_all(conn)
    Base.metadata.create_all(conn)
    LogBase.metadata.create_all(conn)
    if seeded:
        conn.execute(insert(LogRow), seeded)


@dataclasses.dataclass
class Place:
    """Where a part runs: its database's name, its context (sampler), engines, and table resets."""

    name: str
    ctx: Context
    async_engine: Callable[[str, int], AsyncEngine] | None
    sync_engine: Callable[[str, int], Engine] | None
    reset: Callable[[list[dict[str, Any]]], None]
    count: Callable[[str, bool], tuple[int, int]]
    placeholder: str = "%s"


def _pg_place(ctx: Context) -> Place:
    db = ctx.db

    def reset(seeded: list[dict[str, Any]]) -> None:
        engine = create_engine(
            db.driver_url("psycopg"),
            poolclass=NullPool,
            connect_args={"application_name": ctx.app_name("load setup")},
        )
        try:
            with engine.begin() as conn:
                conn.execute(text(f"CREATE SCHEMA IF NOT EXISTS {SCHEMA}"))
                _recreate(conn, seeded)
            with engine.connect() as conn, contextlib.suppress(Exception):
                conn.execute(text("CHECKPOINT"))
        finally:
            engine.dispose()

    def count(table: str, log: bool) -> tuple[int, int]:
        what = "count(*), count(DISTINCT request_id)" if log else "count(*), count(*)"
        with db.connect() as conn:
            row = conn.execute(f"SELECT {what} FROM {SCHEMA}.{table}").fetchone()
        assert row is not None
        return int(row[0]), int(row[1])

    def async_engine(app: str, size: int) -> AsyncEngine:
        engine = db.async_engine(app, pool_size=size)
        _search_path(engine.sync_engine)
        return engine

    def sync_engine(app: str, size: int) -> Engine:
        return db.sync_engine(app, pool_size=size, driver="psycopg")

    return Place("postgresql", ctx, async_engine, sync_engine, reset, count)


def _mysql_place(ctx: Context, db: mysql_db.MySQLDatabase) -> Place:
    def reset(seeded: list[dict[str, Any]]) -> None:
        engine = create_engine(db.driver_url("pymysql", database=None), poolclass=NullPool)
        try:
            with engine.begin() as conn:
                conn.execute(text(f"CREATE DATABASE IF NOT EXISTS {SCHEMA}"))
                _recreate(conn, seeded)
        finally:
            engine.dispose()

    def count(table: str, log: bool) -> tuple[int, int]:
        what = "count(*), count(DISTINCT request_id)" if log else "count(*), count(*)"
        conn = db.connect()
        try:
            with conn.cursor() as cursor:
                cursor.execute(f"SELECT {what} FROM {SCHEMA}.{table}")
                row = cursor.fetchone()
        finally:
            conn.close()
        return int(row[0]), int(row[1])

    here = dataclasses.replace(ctx, db=db)
    here.results = ctx.results  # the same list: rows land in the run's results
    return Place(
        "mariadb" if db.product == "MariaDB" else "mysql",
        here,
        lambda app, size: db.async_engine(app, pool_size=size, driver="aiomysql"),
        lambda app, size: db.sync_engine(app, pool_size=size, driver="pymysql"),
        reset,
        count,
    )


def _sqlite_place(ctx: Context, directory: Path) -> Place:
    """A SQLite file whose tables are in the attached database named as the suite's schema."""
    main, bench = directory / "main.db", directory / f"{SCHEMA}.db"

    def attach(engine: Engine) -> Engine:
        @event.listens_for(engine, "connect")
        def attached(dbapi_connection: Any, record: Any) -> None:
            dbapi_connection.execute(f"ATTACH DATABASE '{bench}' AS {SCHEMA}")
            dbapi_connection.execute(f"PRAGMA {SCHEMA}.journal_mode=WAL")

        return engine

    def engine_of(size: int, **kw: Any) -> Engine:
        return attach(create_engine(f"sqlite:///{main}", pool_size=size, max_overflow=0, **kw))

    def reset(seeded: list[dict[str, Any]]) -> None:
        for f in directory.glob("*"):
            f.unlink()
        engine = engine_of(1)
        try:
            with engine.begin() as conn:
                _recreate(conn, seeded)
        finally:
            engine.dispose()

    def count(table: str, log: bool) -> tuple[int, int]:
        what = "count(*), count(DISTINCT request_id)" if log else "count(*), count(*)"
        engine = engine_of(1)
        try:
            with engine.connect() as conn:
                row = conn.execute(text(f"SELECT {what} FROM {SCHEMA}.{table}")).one()
        finally:
            engine.dispose()
        return int(row[0]), int(row[1])

    return Place("sqlite", ctx, None, lambda app, size: engine_of(size), reset, count, placeholder="?")


# -- the hand-written loops ---------------------------------------------------------------------------


def _chunks(rows: list[dict[str, Any]], size: int) -> Iterator[list[dict[str, Any]]]:
    for start in range(0, len(rows), size):
        yield rows[start : start + size]


async def hand_copy_asyncpg(engine: AsyncEngine, work: Input, p: Probe, *, staging: bool = False) -> int:
    """
    8 coroutines taking chunks of records from a queue, each ``copy_records_to_table()`` in a
    transaction of its own on a pooled connection; with ``staging``, into a temporary table, then
    ``INSERT ... SELECT ... ON CONFLICT DO NOTHING``.  Returns the rows inserted.
    """
    queue: asyncio.Queue[list[tuple[Any, ...]] | None] = asyncio.Queue(maxsize=2 * LIMIT)
    columns = list(work.columns)
    shown = ", ".join(columns)
    inserted = [0]

    async def produce() -> None:
        for chunk in _chunks(work.rows, BATCH):
            await queue.put(work.records(chunk))
        for _ in range(LIMIT):
            await queue.put(None)

    async def consume() -> None:
        while (records := await queue.get()) is not None:
            async with engine.connect() as conn:
                raw: Any = (await conn.get_raw_connection()).driver_connection
                async with raw.transaction():
                    if staging:
                        await raw.execute(
                            f"CREATE TEMP TABLE IF NOT EXISTS load_stage (LIKE {SCHEMA}.{work.table} "
                            "INCLUDING DEFAULTS) ON COMMIT DELETE ROWS"
                        )
                        await raw.copy_records_to_table("load_stage", records=records, columns=columns)
                        status = await raw.execute(
                            f"INSERT INTO {SCHEMA}.{work.table} ({shown}) SELECT {shown} FROM load_stage "
                            "ON CONFLICT DO NOTHING"
                        )
                        inserted[0] += int(status.rsplit(" ", 1)[-1])
                    else:
                        await raw.copy_records_to_table(
                            work.table, records=records, columns=columns, schema_name=SCHEMA
                        )
                        inserted[0] += len(records)
            p.done += len(records)

    await asyncio.gather(produce(), *(consume() for _ in range(LIMIT)))
    return inserted[0]


def _threads(n: int, worker: Callable[[], None]) -> None:
    with ThreadPoolExecutor(n, thread_name_prefix="hand-load") as pool:
        for future in [pool.submit(worker) for _ in range(n)]:
            future.result()


def hand_copy_psycopg(engine: Engine, work: Input, p: Probe) -> int:
    """8 threads taking chunks from one iterator, each ``cursor.copy()`` a record at a time, and a commit."""
    chunks, lock = _chunks(work.rows, BATCH), threading.Lock()
    statement = f"COPY {SCHEMA}.{work.table} ({', '.join(work.columns)}) FROM STDIN"

    def worker() -> None:
        while True:
            with lock:
                chunk = next(chunks, None)
                if chunk is None:
                    return
                records = work.records(chunk)
            with engine.connect() as conn:
                driver: Any = conn.connection.driver_connection
                with driver.cursor() as cursor, cursor.copy(statement) as copy:
                    write = copy.write_row
                    for record in records:
                        write(record)
                driver.commit()
            with lock:
                p.done += len(records)

    _threads(LIMIT, worker)
    return len(work.rows)


async def hand_insert_aiomysql(engine: AsyncEngine, work: Input, p: Probe) -> int:
    """8 coroutines, each chunk one ``cursor.executemany()`` (multi-row INSERTs) and a commit."""
    chunks = _chunks(work.rows, BATCH)
    marks = ", ".join(["%s"] * len(work.columns))
    statement = f"INSERT INTO {SCHEMA}.{work.table} ({', '.join(work.columns)}) VALUES ({marks})"

    async def worker() -> None:
        for chunk in chunks:  # one iterator: each coroutine takes the next chunk
            records = work.records(chunk)
            async with engine.connect() as conn:
                raw: Any = (await conn.get_raw_connection()).driver_connection
                async with raw.cursor() as cursor:
                    await cursor.executemany(statement, records)
                await raw.commit()
            p.done += len(records)

    await asyncio.gather(*(worker() for _ in range(LIMIT)))
    return len(work.rows)


def hand_insert_sqlite(engine: Engine, work: Input, p: Probe, *, values: int = 1) -> int:
    """
    One connection: each chunk one ``cursor.executemany()`` and a commit; or, with ``values`` rows a
    statement, ``cursor.execute()`` of multi-row ``INSERT`` statements of that many rows.
    """
    marks = f"({', '.join(['?'] * len(work.columns))})"
    head = f"INSERT INTO {SCHEMA}.{work.table} ({', '.join(work.columns)}) VALUES "
    with engine.connect() as conn:
        driver: Any = conn.connection.driver_connection
        for chunk in _chunks(work.rows, BATCH):
            records = work.records(chunk)
            cursor = driver.cursor()
            if values == 1:
                cursor.executemany(head + marks, records)
            else:
                for start in range(0, len(records), values):
                    part = records[start : start + values]
                    statement = head + ", ".join([marks] * len(part))
                    cursor.execute(statement, list(itertools.chain.from_iterable(part)))
            cursor.close()
            driver.commit()
            p.done += len(records)
    return len(work.rows)


# -- the sides ----------------------------------------------------------------------------------------


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


# -- the row preparation ------------------------------------------------------------------------------


async def measure_prep(ctx: Context, work: Input, round_no: int, rounds: int) -> None:
    """
    The time ``load()`` spends turning the rows into chunks of records, without the database: its
    chunk units built from the rows (boundeddb's ``LoadCall``, as ``load()`` builds them), and a
    hand-written loop's records (``itemgetter``) for comparison.
    """
    from boundeddb._loads.call import LoadCall

    label = f"load {work.workload} asyncpg prep" + (f" round {round_no}" if rounds > 1 else "")
    engine = ctx.db.async_engine(ctx.app_name(label), pool_size=1)
    try:
        runner = SemaphoreRunner(async_sessionmaker(engine), limit=1)
        call = LoadCall(
            runner._engine,
            runner._dialect,
            work.target,
            work.rows,
            columns=None,
            batch=BATCH,
            errors="collect",
            journal=None,
            async_units=True,
        )
        cpu0, t0 = time.process_time(), time.perf_counter()
        units = await call.units()
        chunks = sum(1 for _ in units)  # type: ignore[union-attr]
        prep_s, prep_cpu = time.perf_counter() - t0, time.process_time() - cpu0
        t0 = time.perf_counter()
        for chunk in _chunks(work.rows, BATCH):
            work.records(chunk)
        hand_s = time.perf_counter() - t0
    finally:
        await engine.dispose()
    from ..measurement import Measurement

    m = Measurement(
        GROUP,
        label,
        group=GROUP,
        schema=ctx.schema,
        n=len(work.rows),
        succeeded=len(work.rows),
        wall_s=prep_s,
        client_cpu_s=prep_cpu,
        ops_per_s=len(work.rows) / prep_s if prep_s else None,
        config={
            "database": "postgresql",
            "driver": "asyncpg",
            "kind": "prep",
            "workload": work.workload,
            "batch": BATCH,
            "rows_in": len(work.rows),
            "round": round_no,
        },
    )
    m.extra.update(chunks=chunks, hand_records_s=hand_s)
    ctx.results.append(m)
    ctx.log(
        f"  {label}: chunks of records from {len(work.rows):,} rows in {prep_s:.2f} s "
        f"(a hand loop's tuples: {hand_s:.2f} s)"
    )


# -- the run ------------------------------------------------------------------------------------------


def _groups(ctx: Context) -> list[tuple[str, list[Side]]]:
    """The groups of sides, each a set compared within itself, in their forward order."""
    n = ctx.load_rows
    rows = log_rows(n)
    clean = Input("log", rows)
    dup_rows, k = with_duplicates(rows, ctx.seed)
    dups = Input("log", dup_rows, k)
    creates = Input("creates", create_rows(n, ctx.seed))
    pg = [
        (
            "asyncpg",
            [
                Side("asyncpg", "hand", clean),
                Side("asyncpg", "load", clean),
                Side("asyncpg", "load", clean, journal=True),
                Side("asyncpg", "load", dups),
                Side("asyncpg", "staging", dups),
                Side("asyncpg", "orm-batch", clean, ORM_BATCH),
                Side("asyncpg", "orm-single", clean, None),
            ],
        ),
        ("asyncpg sizes", [Side("asyncpg", "load", clean, size) for size in (SIZES[0], BATCH, SIZES[1])]),
        (
            "asyncpg creates",
            [
                Side("asyncpg", "hand", creates),
                Side("asyncpg", "load", creates),
                Side("asyncpg", "orm-batch", creates, ORM_BATCH),
            ],
        ),
        (
            "psycopg",
            [
                Side("psycopg", "hand", clean),
                Side("psycopg", "load", clean),
                Side("psycopg", "orm-batch", clean, ORM_BATCH),
            ],
        ),
    ]
    others = [
        (
            "aiomysql",
            [
                Side("aiomysql", "hand", clean),
                Side("aiomysql", "load", clean),
                Side("aiomysql", "orm-batch", clean, ORM_BATCH),
                Side("aiomysql", "orm-single", clean, None),
            ],
        ),
        (
            "pysqlite",
            [
                Side("pysqlite", "hand", clean),
                Side("pysqlite", "hand-values", clean),
                Side("pysqlite", "load", clean),
                Side("pysqlite", "orm-batch", clean, ORM_BATCH),
                Side("pysqlite", "orm-single", clean, None),
            ],
        ),
    ]
    return pg + others


def _run_side(place: Place, side: Side, round_no: int, rounds: int) -> None:
    try:
        asyncio.run(measure(place, side, round_no, rounds))
    except Exception as exc:
        place.ctx.failed(
            GROUP,
            side.label(round_no, rounds),
            exc,
            group=GROUP,
            **{
                "database": place.name,
                "driver": side.driver,
                "kind": side.kind,
                "workload": side.work.workload,
                "batch": side.batch,
                "journal": side.journal,
                "duplicates": side.work.duplicates,
                "round": round_no,
            },
        )


def run(ctx: Context) -> None:
    rounds = max(1, ctx.load_rounds)
    groups = _groups(ctx)
    places: dict[str, Place | None] = {"asyncpg": _pg_place(ctx), "psycopg": _pg_place(ctx)}
    try:
        places["aiomysql"] = _mysql_place(ctx, mysql_db.resolve())
    except mysql_db.ServerUnavailable as exc:
        places["aiomysql"] = None
        ctx.failed(
            GROUP, "load aiomysql", f"skipped: {exc}", group=GROUP, database="mariadb", driver="aiomysql"
        )
    with tempfile.TemporaryDirectory(prefix="bdbbench-load-") as directory:
        places["pysqlite"] = _sqlite_place(ctx, Path(directory))
        for round_no in range(1, rounds + 1):
            forward = round_no % 2 == 1
            if rounds > 1:
                ctx.log(f"load round {round_no}/{rounds} ({'forward' if forward else 'reverse'})")
            for k, (name, sides) in enumerate(groups if forward else groups[::-1]):
                place = places[name.split()[0]]
                if place is None:
                    continue
                for side in sides if (k + round_no) % 2 else sides[::-1]:
                    _run_side(place, side, round_no, rounds)
                if name == "asyncpg":
                    clean = sides[0].work
                    try:
                        asyncio.run(measure_prep(ctx, clean, round_no, rounds))
                    except Exception as exc:
                        ctx.failed(GROUP, "load prep", exc, group=GROUP, kind="prep", round=round_no)
        with contextlib.suppress(Exception):
            if (mysql_place := places["aiomysql"]) is not None:
                db = mysql_place.ctx.db
                conn = db.connect()
                with conn.cursor() as cursor:
                    cursor.execute(f"DROP DATABASE IF EXISTS {SCHEMA}")
                conn.close()


SCENARIO = Scenario(
    name="load",
    run=run,
    what="runner.load(rows) (COPY on PostgreSQL, multi-row INSERT elsewhere) against a hand-written bulk "
    "loop, "
    "batch=500 ORM units and one transaction per row: 200,000 request-log rows and the post's creates; 1% "
    "duplicate keys; with a journal; batch= 1,000/5,000/20,000; asyncpg, psycopg 3, MariaDB, SQLite",
    section="Load",
    seconds=SETUP_S + DEFAULT_ROUNDS * SECONDS_PER_ROUND,
    default=False,
)
