"""
``journal``: ``map(fn, items, journal=Journal(...))``, what a journal costs and what a rerun saves.

A journalled unit first INSERTs its item's row ``(job, key)`` in its own transaction, and the
runner looks the items' keys up ahead, in chunks of 32 doubling to 500, to skip those done already.
Two goals, each measured on ``SemaphoreRunner`` (asyncpg) and ``ThreadOffloadRunner`` (psycopg,
awaited ``map()``) at the suite's limit L, on engines of ``pool_size=L, max_overflow=0`` whose L
connections are opened before the timed part:

* **overhead**: the post's op sequence (its first ``min(N, 3000)`` ops, as the ``overhead``
  scenario's; half creates, half reads of the post's tables), each op an item ``(i, op)`` of
  ``map()`` keyed by ``i``, with the journal and without it, every side on fresh tables.  Before
  each journalled side the job is forgotten (``journal.forget(engine)``), so that every journalled
  side runs every item.  In a round the four sides run journal, none (``SemaphoreRunner``), then
  none, journal (``ThreadOffloadRunner``), the even rounds in reverse: each runner's two sides are
  neighbours, and each swaps places from round to round.  The goal: a journalled run at least
  :data:`OF_PLAIN` of the same run without a journal (units/s; the median of per-round ratios).
* **resume**: after a full journalled run of M items (:func:`resume_items`: 20 x N, 10,000 to
  200,000; 100,000 at the default N), the same ``map()`` again: every item is skipped and its unit
  never called.  The goal: at least :data:`SKIPS_PER_S` skipped items per second.

The resume job is kept in a table of its own whose autovacuum is off, so that its statistics are
what the test says they are.  First the **fill**: one journalled run of the M items with a no-op
unit (``SemaphoreRunner(limit=L, batch=500)``: each unit's row and its batch's commit are the whole
work), a row of its own: how fast a first run of a large job goes.  Then each runner reruns the
job **right after the run**, before PostgreSQL has statistics of the table (as for a minute or so
after a run, until autovacuum analyzes it; and for long after where the table's rows of other jobs
outnumber the new job's by 10 to 1), stopped after :data:`FRESH_CAP_S` s (the skipped items
counted by ``on_outcome``); then the table is analyzed, and each round reruns the job on both
runners (in alternating order) to the end.  Each rerun times the journal's lookups (SQLAlchemy's
cursor events on its ``SELECT`` statements): how many, and how long they took.

The journal tables live in the suite's schema (its engines' connections set ``search_path`` to
it), so they go with it at the end.  Every measurement checks its rows: a journalled side left one
journal row per item and the post's rows of its creates, a no-journal side the post's rows; a rerun
called no unit and skipped every item.  ``--journal-rounds K`` (:data:`DEFAULT_ROUNDS`, 1 with
``--quick``) sets the rounds.  :mod:`benchmarks.report.journal` turns the rows into the "Journal"
section and its goals.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import anyio
from sqlalchemy import event
from sqlalchemy.ext.asyncio import async_sessionmaker
from sqlalchemy.orm import Session, sessionmaker

from boundeddb import Journal, SemaphoreRunner, ThreadOffloadRunner

from ..db.schema import SCHEMA
from ..harness import Context, Probe
from ..scenario import Scenario
from ..stats import percentile
from ..workload import Op, op_async, op_sync
from ._batching import count_transactions, warm, warm_sync
from ._runner import record
from .overhead import MAX_OPS

GROUP = "journal"
#: The goals: a journalled run's units/s over the same run's without a journal, and skipped items/s.
OF_PLAIN = 0.9
SKIPS_PER_S = 50_000
#: Rounds by default, and with --quick.
DEFAULT_ROUNDS, QUICK_ROUNDS = 3, 1
#: Rough seconds of the warm-up, the fill and the reruns before statistics, and of one round, at N=5,000.
SETUP_S, SECONDS_PER_ROUND = 120, 70
#: The jobs and their tables (in the suite's schema): the overhead sides', and the resumed job's.
JOB, TABLE = "bench-post-ops", "boundeddb_journal"
RESUME_JOB, RESUME_TABLE = "bench-resume", "boundeddb_journal_resume"
#: Units per batch of the fill: its rows are the point, not its speed.
FILL_BATCH = 500
#: The reruns before the table's statistics stop after this many seconds.
FRESH_CAP_S = 10.0
#: Ops per side of the warm-up, not recorded.
WARMUP_OPS = 100
RUNNERS = ("semaphore", "threads")
RUNNER_NAME = {"semaphore": "SemaphoreRunner", "threads": "ThreadOffloadRunner"}
#: The overhead sides of a forward round: (runner, journalled).
OVERHEAD_ORDER = (("semaphore", True), ("semaphore", False), ("threads", False), ("threads", True))


def resume_items(ctx: Context) -> int:
    """The items of the resumed job: 20 x N, at least 10,000 and at most 200,000."""
    return min(200_000, max(10_000, 20 * len(ctx.ops)))


def _key(item: tuple[int, Op]) -> int:
    return item[0]


def _same(i: int) -> int:
    return i


async def _op_async(session: Any, item: tuple[int, Op]) -> int:
    return await op_async(session, item[1])


def _op_sync(session: Session, item: tuple[int, Op]) -> int:
    return op_sync(session, item[1])


def _search_path(sync_engine: Any) -> None:
    """Every connection of ``sync_engine`` finds and creates unqualified tables in the suite's schema."""

    @event.listens_for(sync_engine, "connect", insert=True)
    def set_search_path(dbapi_connection: Any, record: Any) -> None:
        autocommit = dbapi_connection.autocommit
        dbapi_connection.autocommit = True
        cursor = dbapi_connection.cursor()
        cursor.execute(f"SET SESSION search_path TO {SCHEMA}")
        cursor.close()
        dbapi_connection.autocommit = autocommit


def time_lookups(sync_engine: Any, table: str) -> list[float]:
    """The duration of each ``SELECT`` on ``table`` on ``sync_engine`` from now on: the journal's lookups."""
    started: dict[int, float] = {}
    durations: list[float] = []

    def before(conn: Any, cursor: Any, statement: str, parameters: Any, context: Any, many: bool) -> None:
        named = f"FROM {table} " in statement or f'FROM "{table}" ' in statement
        if statement.startswith("SELECT") and named:
            started[id(context)] = time.perf_counter()

    def after(conn: Any, cursor: Any, statement: str, parameters: Any, context: Any, many: bool) -> None:
        if (start := started.pop(id(context), None)) is not None:
            durations.append(time.perf_counter() - start)

    event.listen(sync_engine, "before_cursor_execute", before)
    event.listen(sync_engine, "after_cursor_execute", after)
    return durations


def lookup_figures(durations: list[float]) -> dict[str, Any]:
    return {
        "lookups": len(durations),
        "lookup_total_s": sum(durations),
        "lookup_p50_s": percentile(durations, 0.5),
        "lookup_max_s": max(durations, default=None),
    }


def _suffix(ctx: Context, round_no: int) -> str:
    return f" round {round_no}" if ctx.journal_rounds > 1 else ""


@contextlib.asynccontextmanager
async def _engine(
    ctx: Context, runner: str, label: str, pool_size: int
) -> AsyncIterator[tuple[Any, Any, str]]:
    """
    ``runner``'s engine (asyncpg for ``semaphore``, psycopg for ``threads``) of ``pool_size``
    connections in the suite's schema, opened before the timed part; its sessions; its app name.
    """
    app = ctx.app_name(label)
    engine: Any
    if runner == "semaphore":
        engine = ctx.db.async_engine(app, pool_size=pool_size)
        _search_path(engine.sync_engine)
        sessions: Any = async_sessionmaker(engine, expire_on_commit=False)
    else:
        engine = ctx.db.sync_engine(app, pool_size=pool_size, driver=ctx.db.thread_driver)
        _search_path(engine)
        sessions = sessionmaker(engine, expire_on_commit=False)
    try:
        if runner == "semaphore":
            await warm(engine, pool_size)
        else:
            await asyncio.to_thread(warm_sync, engine, pool_size)
        yield engine, sessions, app
    finally:
        if runner == "semaphore":
            await engine.dispose()
        else:
            engine.dispose()


def _runner(runner: str, sessions: Any, limit: int, **options: Any) -> Any:
    kind = SemaphoreRunner if runner == "semaphore" else ThreadOffloadRunner
    return kind(sessions, limit=limit, errors="collect", **options)


async def _in_schema(engine: Any, work: Callable[[Any], Any]) -> Any:
    """``work(engine)`` of a ``Journal`` method that takes an Engine or an AsyncEngine, awaited either way."""
    if hasattr(engine, "sync_engine"):
        return await work(engine)
    return await asyncio.to_thread(work, engine)


def _count(ctx: Context, sql: str, *args: Any) -> int:
    with ctx.db.connect() as conn:
        row = conn.execute(sql, args).fetchone()
    assert row is not None
    return int(row[0])


def count_rows(ctx: Context, ops: list[Op], journalled: bool) -> dict[str, Any]:
    """The post's rows and the job's journal rows the side left, against what its units should leave."""
    creates = sum(1 for op in ops if op.kind == "create")
    expected = {"a": 3 * creates, "b": 5 * creates}
    found = {k: _count(ctx, f"SELECT count(*) FROM {SCHEMA}.{k}") for k in expected}
    if journalled:
        expected["journal"] = len(ops)
        found["journal"] = _count(ctx, f"SELECT count(*) FROM {SCHEMA}.{TABLE} WHERE job = %s", JOB)
    return {"expected": expected, "found": found, "ok": found == expected}


async def measure_side(ctx: Context, runner: str, journalled: bool, ops: list[Op], round_no: int) -> None:
    """One overhead side on fresh tables: ``map()`` of the ops, with a journal (job forgotten) or without."""
    ctx.reset()
    side = "journal" if journalled else "no journal"
    label = f"journal {runner} {side} (L={ctx.limit}){_suffix(ctx, round_no)}"
    config = {"part": "overhead", "runner": runner, "journalled": journalled, "limit": ctx.limit,
              "pool_size": ctx.limit, "max_overflow": 0, "units": len(ops), "round": round_no,
              "driver": "asyncpg" if runner == "semaphore" else ctx.db.thread_driver}  # fmt: skip
    items = list(enumerate(ops))
    journal = Journal(JOB, key=_key) if journalled else None
    async with _engine(ctx, runner, label, ctx.limit) as (engine, sessions, app):
        forgotten = None
        if journal is not None:
            await _in_schema(engine, Journal.create)
            forgotten = await _in_schema(engine, journal.forget)
        sync_engine = engine.sync_engine if runner == "semaphore" else engine
        counts = count_transactions(sync_engine)
        lookups = time_lookups(sync_engine, TABLE)
        fn = _op_async if runner == "semaphore" else _op_sync
        probe = Probe(ctx, GROUP, label, total=len(ops), app_name=app, group=GROUP, config=config, bar=False)
        async with _runner(runner, sessions, ctx.limit) as r, probe as p:
            record(p, await r.map(fn, items, journal=journal, progress=p.runner_progress()))
    probe.m.extra.update(counts, forgotten=forgotten, rows=count_rows(ctx, ops, journalled))
    probe.m.extra.update(lookup_figures(lookups))


def _reset_resume_table(ctx: Context) -> None:
    """A new, empty resume table in the suite's schema (``Journal.create``), its autovacuum off."""
    with ctx.db.connect() as conn:
        conn.execute(f"CREATE SCHEMA IF NOT EXISTS {SCHEMA}")
        conn.execute(f"DROP TABLE IF EXISTS {SCHEMA}.{RESUME_TABLE}")
    engine = ctx.db.sync_engine(ctx.app_name("journal setup"), pool_size=1, driver=ctx.db.thread_driver)
    _search_path(engine)
    try:
        Journal.create(engine, table=RESUME_TABLE)
    finally:
        engine.dispose()
    with ctx.db.connect() as conn:
        conn.execute(f"ALTER TABLE {SCHEMA}.{RESUME_TABLE} SET (autovacuum_enabled = false)")


def analyze_resume_table(ctx: Context) -> None:
    with ctx.db.connect() as conn:
        conn.execute(f"ANALYZE {SCHEMA}.{RESUME_TABLE}")


async def fill(ctx: Context, m: int) -> None:
    """The resumed job's first run: ``m`` no-op units, journalled, in batches of FILL_BATCH."""
    _reset_resume_table(ctx)
    label = f"journal fill {m:,} items (L={ctx.limit}, batch={FILL_BATCH})"
    config = {"part": "fill", "runner": "semaphore", "limit": ctx.limit, "pool_size": ctx.limit,
              "max_overflow": 0, "batch": FILL_BATCH, "units": m, "driver": "asyncpg"}  # fmt: skip
    calls = [0]

    async def noop(session: Any, item: int) -> None:
        calls[0] += 1

    journal = Journal(RESUME_JOB, key=_same, table=RESUME_TABLE, create_table=False)
    async with _engine(ctx, "semaphore", label, ctx.limit) as (engine, sessions, app):
        lookups = time_lookups(engine.sync_engine, RESUME_TABLE)
        probe = Probe(ctx, GROUP, label, total=m, app_name=app, group=GROUP, config=config, bar=False)
        async with _runner("semaphore", sessions, ctx.limit, batch=FILL_BATCH) as r, probe as p:
            record(p, await r.map(noop, range(m), journal=journal, progress=p.runner_progress()))
    rows = _count(ctx, f"SELECT count(*) FROM {SCHEMA}.{RESUME_TABLE} WHERE job = %s", RESUME_JOB)
    check = {"expected": {"journal": m, "calls": m}, "found": {"journal": rows, "calls": calls[0]}}
    check["ok"] = check["found"] == check["expected"]
    probe.m.extra.update(lookup_figures(lookups), calls=calls[0], rows=check)


async def resume(ctx: Context, runner: str, m: int, *, round_no: int, cap: float | None = None) -> None:
    """
    The resumed job's rerun: ``map()`` of the same ``m`` items, every one done; with ``cap``, right
    after the fill (no statistics) and stopped after ``cap`` s, the skipped items counted by ``on_outcome``.
    """
    state = "fresh" if cap is not None else "analyzed"
    shown = "before statistics" if cap is not None else "analyzed"
    suffix = "" if cap is not None else _suffix(ctx, round_no)
    label = f"journal resume {runner} {m:,} done, {shown} (L={ctx.limit}){suffix}"
    config = {"part": "resume", "state": state, "runner": runner, "limit": ctx.limit, "pool_size": ctx.limit,
              "max_overflow": 0, "units": m, "round": round_no, "cap_s": cap,
              "driver": "asyncpg" if runner == "semaphore" else ctx.db.thread_driver}  # fmt: skip
    calls = [0]
    seen = [0]

    async def noop_async(session: Any, item: int) -> None:
        calls[0] += 1

    def noop_sync(session: Any, item: int) -> None:
        calls[0] += 1

    def counted(outcome: Any) -> None:
        seen[0] += outcome.skipped

    journal = Journal(RESUME_JOB, key=_same, table=RESUME_TABLE, create_table=False)
    fn = noop_async if runner == "semaphore" else noop_sync
    options: dict[str, Any] = {"on_outcome": counted} if cap is not None else {}
    report: Any = None
    skipped = 0
    async with _engine(ctx, runner, label, ctx.limit) as (engine, sessions, app):
        sync_engine = engine.sync_engine if runner == "semaphore" else engine
        lookups = time_lookups(sync_engine, RESUME_TABLE)
        probe = Probe(ctx, GROUP, label, total=m, app_name=app, group=GROUP, config=config, bar=False)
        async with _runner(runner, sessions, ctx.limit) as r, probe as p:
            with anyio.move_on_after(cap if cap is not None else float("inf")) as scope:
                report = await r.map(fn, range(m), journal=journal, **options)
            skipped = seen[0] if report is None else report.stats.skipped
            p.succeeded = skipped  # units/s: skipped items per second
    row = probe.m
    row.extra.update(lookup_figures(lookups), calls=calls[0], skipped=skipped, stopped=scope.cancelled_caught)
    if report is not None:
        stats = report.stats
        row.extra["runner_stats"] = {
            k: getattr(stats, k) for k in ("submitted", "succeeded", "failed", "skipped")
        }
    expected = {"calls": 0, "skipped": m if report is not None else skipped}
    row.extra["rows"] = {"expected": expected, "found": {"calls": calls[0], "skipped": skipped},
                        "ok": calls[0] == 0 and skipped == expected["skipped"] and skipped > 0}  # fmt: skip


def _measure(ctx: Context, label: str, work: Callable[[], Any]) -> None:
    """One measurement; an error outside its probe is recorded too, and the scenario goes on."""
    try:
        asyncio.run(work())
    except Exception as exc:
        ctx.failed(GROUP, label, exc, group=GROUP)


def run(ctx: Context) -> None:
    ops = ctx.ops[: min(len(ctx.ops), MAX_OPS)]
    m = resume_items(ctx)
    rounds = max(1, ctx.journal_rounds)
    before = len(ctx.results)
    for runner, journalled in OVERHEAD_ORDER:
        _measure(ctx, "warm-up", lambda r=runner, j=journalled: measure_side(ctx, r, j, ops[:WARMUP_OPS], 0))
    del ctx.results[before:]  # the warm-up is not a result
    ctx.log(f"journal: the resumed job's first run, {m:,} items, then a rerun before the table's statistics")
    _measure(ctx, "journal fill", lambda: fill(ctx, m))
    for runner in RUNNERS:
        _measure(
            ctx,
            f"journal resume {runner} fresh",
            lambda r=runner: resume(ctx, r, m, round_no=1, cap=FRESH_CAP_S),
        )
    analyze_resume_table(ctx)
    for round_no in range(1, rounds + 1):
        forward = round_no % 2 == 1
        if rounds > 1:
            ctx.log(f"journal round {round_no}/{rounds} ({'forward' if forward else 'reverse'})")
        for runner, journalled in OVERHEAD_ORDER if forward else OVERHEAD_ORDER[::-1]:
            label = f"journal {runner} journalled={journalled} round {round_no}"
            _measure(ctx, label, lambda r=runner, j=journalled, k=round_no: measure_side(ctx, r, j, ops, k))
        for runner in RUNNERS if forward else RUNNERS[::-1]:
            label = f"journal resume {runner} round {round_no}"
            _measure(ctx, label, lambda r=runner, k=round_no: resume(ctx, r, m, round_no=k))


SCENARIO = Scenario(
    name="journal",
    run=run,
    what="map(..., journal=) on SemaphoreRunner and ThreadOffloadRunner (L): the post's ops with and "
    "without a journal in alternating rounds, and a rerun of a job of 100,000 done items (skipped/s), "
    "before and after the table's statistics",
    section="Journal",
    seconds=SETUP_S + DEFAULT_ROUNDS * SECONDS_PER_ROUND,
    default=False,
)
