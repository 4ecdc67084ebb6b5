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
duplicate key, beside the clean run: a failing unit adds a log row whose unique
``request_id`` (-1) was seeded before the run; the post's ops flush it in the unit, which raises,
while a log row fails the flush before the batch's COMMIT, which names no unit, so the runner
finds it in a second pass that flushes each unit. Each runner's hand-written twin runs the same
failing units too, rerunning a failed batch's units one transaction each: the reference that
decides the 1%-failing goal.

Then the web path, on one ``SemaphoreRunner`` whose sessions' transactions are timed (first
statement to COMMIT done, session events), each request ``submit()``-ing one log row:

* **closed loop** (throughput): 64 and 512 coroutines (:data:`WEB_CONCURRENCY`, requests in
  flight; 512 is the busy app) each submit one row after another, with ``batch=None`` (N/2
  requests) and ``BatchPolicy(size=500, linger=5 ms, 2 ms)`` (2 x N).  A closed loop keeps the
  runner saturated: its latency is queueing, and with ``linger`` its rows/s is at most in-flight /
  (linger + transaction time), so it measures only the rows/s against ``batch=None`` at the same
  in-flight count;
* **open loop** (latency): N/2 requests (at most :data:`OPEN_SECONDS`' worth, about 3.5 s at the
  default N) arriving as a seeded Poisson process, each started as a task at its arrival time
  whatever the earlier ones are doing, with ``batch=None`` and the same two policies.  The rate
  is :data:`OPEN_SHARE` (half) of the slower ``batch=None`` closed-loop rows/s measured just
  before in the same round (about 700/s on the 2-core machine): a rate one transaction per
  request sustains with room to spare, as a web app's logging should be, and one that follows
  the machine (a fixed rate would be near capacity on a slow or busy machine and trivial on a
  fast one); all three variants of a round get the same arrival times.  A request's latency is
  its ``submit()`` call (what it spends on logging); how late each started after its arrival
  time is recorded too.

The whole of that is one round; ``--batching-rounds K`` (:data:`DEFAULT_ROUNDS` when the scenario is
named or with ``--full``; 1 in a plain run, which leaves the goals undecided, and with ``--quick``)
runs K rounds, the even ones in reverse (the groups' measurements, then the closed loops, then the
open loops, each part's order mirrored, so every pair of sides swaps places from round to round),
and each row records its round: the report's ratios are the medians of per-round ratios.
``batching-sizes`` (``--full``, or by name) runs every size of :data:`SIZES` for the three
workloads once, without failing units or the web path.

Every measurement records the transactions committed and rolled back (SQLAlchemy's engine
``commit`` and ``rollback`` events), the runner's ``RunStats`` (``batches_committed``,
``units_rerun``), and then counts the rows: every good unit's exactly once, a failing unit's
none.  :mod:`benchmarks.report.batching` turns the rows into the "Batches" section and its goals.
"""

from __future__ import annotations

import asyncio
import statistics
import time
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

from sqlalchemy.ext.asyncio import async_sessionmaker
from sqlalchemy.orm import Session, sessionmaker

from boundeddb import BatchPolicy, SemaphoreRunner, ThreadOffloadRunner

from ..harness import Context, Probe
from ..measurement import Measurement
from ..scenario import Scenario
from ..stats import percentile
from ._batching import (
    LIMIT,
    WORKLOADS,
    Work,
    arrivals,
    async_unit,
    count_rows,
    count_transactions,
    hand_async,
    hand_threads,
    make_work,
    open_loop,
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
#: The web path's variants (linger; None: batch=None) forward, and in reverse.
WEB_ORDERS = ((None, *WEB_LINGERS), (*WEB_LINGERS[::-1], None))
#: The open loop's arrival rate: this share of the slower batch=None closed-loop rows/s of the same
#: round (so one transaction per request keeps up with it at about half its capacity), or this rate
#: if neither ran.
OPEN_SHARE = 0.5
OPEN_FALLBACK_RATE = 500.0
#: An open loop's requests: N/2, at most this many seconds' worth at its rate (a slow machine's
#: lower rate does not stretch it), at least 200.
OPEN_SECONDS = 4.0
#: Rounds by default, and with --quick.
DEFAULT_ROUNDS, QUICK_ROUNDS = 3, 1
#: Rough seconds of one round at N=5,000 on 2 quiet cores.
SECONDS_PER_ROUND = 160
#: The sides of a size, in their forward order; ``batch=None`` has no ``hand-threads`` side.
SIDES = ("hand", "semaphore", "threads", "hand-threads")


def _suffix(ctx: Context, round_no: int) -> str:
    return f" round {round_no}" if ctx.batching_rounds > 1 else ""


def label_of(work: Work, side: str, batch: int | None) -> str:
    return f"batching {work.workload} {side} batch={batch or 'none'}" + (
        " 1% failing" if work.failing else ""
    )


async def measure(
    ctx: Context, work: Work, side: str, batch: int | None, group: str = GROUP, round_no: int = 1
) -> None:
    """One side at one size on fresh tables: units/s, transactions, RunStats, the rows left."""
    reset(ctx)
    label = label_of(work, side, batch) + (_suffix(ctx, round_no) if group == GROUP else "")
    app = ctx.app_name(label)
    is_async = side in ("hand", "semaphore")
    driver = "asyncpg" if is_async else "psycopg"
    config = {"workload": work.workload, "side": side, "batch": batch, "limit": LIMIT, "pool_size": LIMIT,
              "max_overflow": 0, "driver": driver, "units": work.n, "failing": len(work.failing),
              "round": round_no}  # fmt: skip
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


async def _web(ctx: Context, label: str, config: dict[str, Any], policy: BatchPolicy | None,
               drive: Callable[..., Awaitable[dict[str, Any]]]) -> Measurement:  # fmt: skip
    """
    One web-path measurement on fresh tables: a ``SemaphoreRunner`` with ``policy``, its sessions'
    transactions timed, ``drive(runner, work, probe, errors)`` the requests; the rows checked after.
    """
    reset(ctx)
    n = config["units"]
    work = Work("log", n, None)
    app = ctx.app_name(label)
    engine = ctx.db.async_engine(app, pool_size=LIMIT)
    await warm(engine)
    counts = count_transactions(engine.sync_engine)
    session_class = type("TimedSession", (Session,), {})
    durations = time_batches(session_class)
    sessions = async_sessionmaker(engine, expire_on_commit=False, sync_session_class=session_class)
    config = {"side": "semaphore", "batch": None if policy is None else WEB_SIZE, "limit": LIMIT,
              "pool_size": LIMIT, "max_overflow": 0, "driver": "asyncpg", **config}  # fmt: skip
    probe = Probe(ctx, GROUP, label, total=n, app_name=app, group=GROUP, config=config)
    errors: list[str] = []
    extra: dict[str, Any] = {}
    stats: Any = None
    try:
        async with SemaphoreRunner(sessions, limit=LIMIT, batch=policy) as runner, probe as p:
            extra = await drive(runner, work, p, errors)
            p.failed = len(errors)
            stats = runner.statistics()
    finally:
        await engine.dispose()
    m = probe.m
    m.extra.update(counts, rows=count_rows(ctx, work), first_error=errors[0] if errors else None)
    m.extra.update(
        extra,
        batch_p50_s=percentile(durations, 0.5),
        batch_p99_s=percentile(durations, 0.99),
        batch_mean_s=statistics.fmean(durations) if durations else None,
        transactions_timed=len(durations),
    )
    for key in ("batches_committed", "units_rerun"):
        m.extra[key] = getattr(stats, key, None)
    return m


def _policy(linger: float | None) -> tuple[BatchPolicy | None, str]:
    shown = "batch=none" if linger is None else f"batch={WEB_SIZE} linger={linger * 1e3:g}ms"
    return (None if linger is None else BatchPolicy(size=WEB_SIZE, linger=linger)), shown


async def measure_web(
    ctx: Context, n: int, linger: float | None, concurrency: int, round_no: int
) -> Measurement:
    """The web path's throughput: ``concurrency`` coroutines each submitting one log row after another."""
    policy, shown = _policy(linger)

    async def drive(runner: Any, work: Work, p: Probe, errors: list[str]) -> dict[str, Any]:
        todo: Iterator[int] = iter(range(n))
        latencies: list[float] = []

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
        p.latencies = latencies
        return {}

    label = f"batching web c={concurrency} {shown}{_suffix(ctx, round_no)}"
    config = {"workload": "web", "linger": linger, "units": n, "concurrency": concurrency, "round": round_no}
    return await _web(ctx, label, config, policy, drive)


async def measure_open(ctx: Context, n: int, rate: float, linger: float | None, round_no: int) -> Measurement:
    """The web path's latency: ``n`` requests arriving at ``rate``/s (Poisson), one ``submit()`` each."""
    policy, shown = _policy(linger)
    schedule = arrivals(n, rate, ctx.seed + round_no)

    async def drive(runner: Any, work: Work, p: Probe, errors: list[str]) -> dict[str, Any]:
        async def submit(k: int) -> Any:
            return await runner.submit(async_unit(work, k))

        p.latencies, lags = await open_loop(submit, schedule, p, errors)
        return {"start_lag_p99_s": percentile(lags, 0.99), "start_lag_max_s": max(lags, default=None)}

    label = f"batching web open {rate:.0f}/s {shown}{_suffix(ctx, round_no)}"
    config = {"workload": "web-open", "linger": linger, "units": n, "rate": rate, "arrivals": "poisson",
              "round": round_no}  # fmt: skip
    return await _web(ctx, label, config, policy, drive)


def _plan(
    ctx: Context, sizes: dict[str, tuple[int | None, ...]], group: str
) -> list[tuple[Work, str, int | None]]:
    """
    The (units, side, batch) of a forward round, in order: each workload at each of its sizes, the
    sides of each group in the opposite order of the last group's; in the ``batching`` group, the
    runners with 1% failing units beside the clean run at FAIL_SIZE.
    """
    steps: list[tuple[Work, str, int | None]] = []
    k = 0
    for w in WORKLOADS:
        for batch in sizes[w.name] if k % 2 == 0 else sizes[w.name][::-1]:
            work = make_work(ctx, w, single=batch is None)
            sides = [s for s in SIDES if batch is not None or s != "hand-threads"]
            steps += [(work, side, batch) for side in (sides if k % 2 == 0 else sides[::-1])]
            k += 1
            if group == GROUP and batch == FAIL_SIZE:
                bad = make_work(ctx, w, failing=True)
                # Each runner beside its hand-written twin (which reruns a failed batch's units alone).
                pair = ("hand", "semaphore", "threads", "hand-threads")
                steps += [(bad, side, batch) for side in (pair if k % 2 == 0 else pair[::-1])]
    return steps


def _groups(ctx: Context, sizes: dict[str, tuple[int | None, ...]], *, group: str, round_no: int = 1) -> None:
    """Every measurement of :func:`_plan`: forward in odd rounds, the whole round reversed in even ones."""
    steps = _plan(ctx, sizes, group)
    for work, side, batch in steps if round_no % 2 else steps[::-1]:
        asyncio.run(measure(ctx, work, side, batch, group, round_no))


def _web_round(ctx: Context, round_no: int) -> None:
    """
    The web path in one round: the closed loops, then the open loops at half the slower of this
    round's ``batch=None`` closed-loop rates; each part in the reverse order of the round before.
    """
    closed = [(c, linger) for k, c in enumerate(WEB_CONCURRENCY) for linger in WEB_ORDERS[k % 2]]
    base: list[float] = []
    for concurrency, linger in closed if round_no % 2 else closed[::-1]:
        n = max(200, len(ctx.ops) // 2 if linger is None else len(ctx.ops) * 2)
        m = asyncio.run(measure_web(ctx, n, linger, concurrency, round_no))
        if linger is None and not m.error and m.ops_per_s:
            base.append(m.ops_per_s)
    rate = OPEN_SHARE * min(base) if base else OPEN_FALLBACK_RATE
    n = max(200, min(len(ctx.ops) // 2, round(rate * OPEN_SECONDS)))
    for linger in WEB_ORDERS[(round_no - 1) % 2]:
        asyncio.run(measure_open(ctx, n, rate, linger, round_no))


def run(ctx: Context) -> None:
    sizes = {w.name: tuple(dict.fromkeys((None, FAIL_SIZE, w.goal_size))) for w in WORKLOADS}
    rounds = max(1, ctx.batching_rounds)
    for round_no in range(1, rounds + 1):
        if rounds > 1:
            ctx.log(f"batching round {round_no}/{rounds} ({'forward' if round_no % 2 else 'reverse'})")
        _groups(ctx, sizes, group=GROUP, round_no=round_no)
        _web_round(ctx, round_no)


def run_sizes(ctx: Context) -> None:
    _groups(ctx, {w.name: (None, *SIZES) for w in WORKLOADS}, group=SIZES_GROUP)


SCENARIO = Scenario(
    name="batching",
    run=run,
    what="batch= on SemaphoreRunner and ThreadOffloadRunner (L=8) against one transaction per unit and a "
    "hand-written batch loop: the post's mix and creates, request-log rows; 1% failing; the web path's "
    f"rows/s (closed loop) and latency (open loop); in alternating rounds, about {SECONDS_PER_ROUND} s each "
    "(one in a plain run)",
    section="Batches",
    seconds=SECONDS_PER_ROUND,
)
SIZES_SCENARIO = Scenario(
    name="batching-sizes",
    run=run_sizes,
    what="the batching scenario's three workloads at batch = none, 10, 50, 200, 500, every side",
    section="Batches",
    seconds=360,
    default=False,
)
