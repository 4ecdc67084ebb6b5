"""
``batching``, ``batching-sizes``: ``batch=`` (issue 33), many units in one transaction.

Three workloads (:data:`~benchmarks.scenarios._batching.WORKLOADS`), each unit leaving the commit
to its runner, as every scenario's units do:

* **mix**: the post's op sequence, half creates and half reads (:func:`benchmarks.workload.make_ops`);
* **creates**: the post's creates only (3 ``a`` rows and 5 ``b`` rows a unit, flushed by the unit);
* **log**: request-log rows, one small ORM row a unit (``request_log``, a table of its own in the
  suite's schema), added and not flushed: the batch's COMMIT flushes them together, in the few
  multi-row ``INSERT ... RETURNING`` of SQLAlchemy's insertmanyvalues.

Each runs on ``SemaphoreRunner`` (asyncpg) and ``ThreadOffloadRunner`` (psycopg) at
``limit=LIMIT`` (8) with ``batch=None`` (one transaction per unit) and ``batch=B``, beside the
reference: a hand-written batch loop at the same size and 8 connections, whose 8 workers each
take B units from one shared iterator, run them in one session and commit once (``hand``: asyncpg
``AsyncSession`` coroutines; ``hand-threads``: psycopg ``Session`` threads, the thread runner's
twin; ``hand`` at B=1 is one transaction per unit by hand).  Every side runs the same unit
functions on fresh tables, on an engine of ``pool_size=8, max_overflow=0`` whose 8 connections are
opened before the timed part; each group of sides runs in the opposite order of the group before
it.  Every side of the mix and of the creates runs the same N/2 units (2,500 at the default N: the
mix's reads scan ``b``, which grows with every create, so every side must leave tables of one
size); log rows, whose cost does not grow, run 4 x N at ``batch=B`` and N at ``batch=None``, so
that every side lasts a second or more.

``batching`` (the default set) takes ``batch=None`` and each workload's goal size (50; log: 500,
and 50); at :data:`FAIL_SIZE` (50) the runners also run with 1% of the units failing on a
duplicate key, right after the clean run: a failing unit adds a log row whose unique
``request_id`` (-1) was seeded before the run; the post's ops flush it in the unit, which raises,
while a log row fails the flush before the batch's COMMIT, which names no unit, so the runner
finds it in a second pass that flushes each unit.  Then the web path: 64 and 512 coroutines
(:data:`WEB_CONCURRENCY`, requests in flight) each ``await
runner.submit(unit)`` one log row after another on one ``SemaphoreRunner``, with ``batch=None``
(N/2 requests) and ``BatchPolicy(size=500, linger=...)`` (2 x N); the latency a request adds is
its whole ``submit()`` call.  ``batching-sizes`` (``--full``, or by name) runs every size of
:data:`SIZES` for the three workloads, without failing units or the web path.

Every measurement records the transactions committed and rolled back (SQLAlchemy's engine
``commit`` and ``rollback`` events), the runner's ``RunStats`` (``batches_committed``,
``units_rerun``), and then counts the rows: every good unit's exactly once, a failing unit's
none.  :mod:`benchmarks.report.batching` turns the rows into the "Batches" section and its goals.
"""

from __future__ import annotations

import asyncio
import statistics
import time
from collections.abc import Iterator
from typing import Any

from sqlalchemy.ext.asyncio import async_sessionmaker
from sqlalchemy.orm import Session, sessionmaker

from boundeddb import BatchPolicy, SemaphoreRunner, ThreadOffloadRunner

from ..harness import Context, Probe
from ..scenario import Scenario
from ..stats import percentile
from ._batching import (
    LIMIT,
    WORKLOADS,
    Work,
    async_unit,
    count_rows,
    count_transactions,
    hand_async,
    hand_threads,
    make_work,
    reset,
    sync_unit,
    time_batches,
    warm,
    warm_sync,
)
from ._runner import record

GROUP = "batching"
SIZES_GROUP = "batching-sizes"
SIZES = (10, 50, 200, 500)
FAIL_SIZE = 50
#: Requests in flight on the web path: a busy app's, and enough to fill batches of WEB_SIZE on L=8.
WEB_CONCURRENCY = (64, 512)
WEB_SIZE = 500
WEB_LINGERS = (0.005, 0.002)
#: The sides of a size, in their forward order; ``batch=None`` has no ``hand-threads`` side.
SIDES = ("hand", "semaphore", "threads", "hand-threads")


def label_of(work: Work, side: str, batch: int | None) -> str:
    return f"batching {work.workload} {side} batch={batch or 'none'}" + (
        " 1% failing" if work.failing else ""
    )


async def measure(ctx: Context, work: Work, side: str, batch: int | None, group: str = GROUP) -> None:
    """One side at one size on fresh tables: units/s, transactions, RunStats, the rows left."""
    reset(ctx)
    label = label_of(work, side, batch)
    app = ctx.app_name(label)
    is_async = side in ("hand", "semaphore")
    driver = "asyncpg" if is_async else "psycopg"
    config = {"workload": work.workload, "side": side, "batch": batch, "limit": LIMIT, "pool_size": LIMIT,
              "max_overflow": 0, "driver": driver, "units": work.n, "failing": len(work.failing)}  # fmt: skip
    probe = Probe(ctx, group, label, total=work.n, app_name=app, group=group, config=config,
                  bar=side.startswith("hand"))  # fmt: skip
    if is_async:
        engine: Any = ctx.db.async_engine(app, pool_size=LIMIT)
        sessions: Any = async_sessionmaker(engine, expire_on_commit=False)
    else:
        engine = ctx.db.sync_engine(app, pool_size=LIMIT, driver=driver)
        sessions = sessionmaker(engine, expire_on_commit=False)
    try:
        if is_async:
            await warm(engine)
        else:
            warm_sync(engine)
        counts = count_transactions(engine.sync_engine if is_async else engine)
        if side.startswith("hand"):
            async with probe as p:
                if is_async:
                    p.latencies = await hand_async(sessions, work, batch or 1, p)
                else:
                    p.latencies = await asyncio.to_thread(hand_threads, sessions, work, batch or 1, p)
        else:
            kind: tuple[Any, Any] = (
                (async_unit, SemaphoreRunner) if is_async else (sync_unit, ThreadOffloadRunner)
            )
            make_unit, runner_class = kind
            units = [make_unit(work, i) for i in range(work.n)]
            runner = runner_class(sessions, limit=LIMIT, batch=batch, errors="collect")
            async with runner, probe as p:
                record(p, await runner.run(units, progress=p.runner_progress()))
    finally:
        if is_async:
            await engine.dispose()
        else:
            engine.dispose()
    probe.m.extra.update(counts, rows=count_rows(ctx, work))


async def measure_web(ctx: Context, n: int, linger: float | None, concurrency: int) -> None:
    """The web path: ``concurrency`` coroutines each submitting one log row after another."""
    reset(ctx)
    work = Work("log", n, None)
    policy = None if linger is None else BatchPolicy(size=WEB_SIZE, linger=linger)
    shown = "batch=none" if linger is None else f"batch={WEB_SIZE} linger={linger * 1e3:g}ms"
    label = f"batching web c={concurrency} {shown}"
    app = ctx.app_name(label)
    engine = ctx.db.async_engine(app, pool_size=LIMIT)
    await warm(engine)
    counts = count_transactions(engine.sync_engine)
    session_class = type("TimedSession", (Session,), {})
    durations = time_batches(session_class)
    sessions = async_sessionmaker(engine, expire_on_commit=False, sync_session_class=session_class)
    config = {"workload": "web", "side": "semaphore", "batch": None if policy is None else WEB_SIZE,
              "linger": linger, "limit": LIMIT, "pool_size": LIMIT, "max_overflow": 0, "driver": "asyncpg",
              "units": n, "concurrency": concurrency}  # fmt: skip
    probe = Probe(ctx, GROUP, label, total=n, app_name=app, group=GROUP, config=config)
    latencies: list[float] = []
    errors: list[str] = []
    stats: Any = None
    try:
        async with SemaphoreRunner(sessions, limit=LIMIT, batch=policy) as runner, probe as p:
            todo: Iterator[int] = iter(range(n))

            async def request() -> None:
                for k in todo:
                    start = time.perf_counter()
                    try:
                        await runner.submit(async_unit(work, k))
                    except Exception as exc:
                        errors.append(f"{type(exc).__name__}: {exc}"[:200])
                        continue
                    latencies.append(time.perf_counter() - start)
                    p.tick()

            await asyncio.gather(*(request() for _ in range(concurrency)))
            p.latencies, p.failed = latencies, len(errors)
            stats = runner.statistics()
    finally:
        await engine.dispose()
    m = probe.m
    m.extra.update(counts, rows=count_rows(ctx, work), first_error=errors[0] if errors else None)
    m.extra.update(
        batch_p50_s=percentile(durations, 0.5),
        batch_p99_s=percentile(durations, 0.99),
        batch_mean_s=statistics.fmean(durations) if durations else None,
        transactions_timed=len(durations),
    )
    for key in ("batches_committed", "units_rerun"):
        m.extra[key] = getattr(stats, key, None)


def _groups(ctx: Context, sizes: dict[str, tuple[int | None, ...]], *, group: str) -> None:
    """
    Each workload at each of its sizes, the sides of each group in the opposite order of the last
    group's; in the ``batching`` group, the runners with 1% failing units right after FAIL_SIZE.
    """
    k = 0
    for w in WORKLOADS:
        for batch in sizes[w.name] if k % 2 == 0 else sizes[w.name][::-1]:
            work = make_work(ctx, w, single=batch is None)
            sides = [s for s in SIDES if batch is not None or s != "hand-threads"]
            for side in sides if k % 2 == 0 else sides[::-1]:
                asyncio.run(measure(ctx, work, side, batch, group))
            k += 1
            if group == GROUP and batch == FAIL_SIZE:
                bad = make_work(ctx, w, failing=True)
                for side in ("semaphore", "threads") if k % 2 == 0 else ("threads", "semaphore"):
                    asyncio.run(measure(ctx, bad, side, batch, group))


def run(ctx: Context) -> None:
    _groups(
        ctx, {w.name: tuple(dict.fromkeys((None, FAIL_SIZE, w.goal_size))) for w in WORKLOADS}, group=GROUP
    )
    for k, concurrency in enumerate(WEB_CONCURRENCY):
        lingers = (None, *WEB_LINGERS)
        for linger in lingers if k % 2 == 0 else lingers[::-1]:
            n = max(200, len(ctx.ops) // 2 if linger is None else len(ctx.ops) * 2)
            asyncio.run(measure_web(ctx, n, linger, concurrency))


def run_sizes(ctx: Context) -> None:
    _groups(ctx, {w.name: (None, *SIZES) for w in WORKLOADS}, group=SIZES_GROUP)


SCENARIO = Scenario(
    name="batching",
    run=run,
    what="batch= on SemaphoreRunner and ThreadOffloadRunner (L=8) against one transaction per unit and a "
    "hand-written batch loop: the post's mix and creates, request-log rows; 1% failing; the web path",
    section="Batches",
    seconds=150,
)
SIZES_SCENARIO = Scenario(
    name="batching-sizes",
    run=run_sizes,
    what="the batching scenario's three workloads at batch = none, 10, 50, 200, 500, every side",
    section="Batches",
    seconds=360,
    default=False,
)
