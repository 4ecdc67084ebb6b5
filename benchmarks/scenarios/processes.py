"""
``processes``: ``ProcessRunner`` with 1, 2 and 4 processes against one ``SemaphoreRunner`` and one
``ThreadOffloadRunner`` at the same total limit, a hand-written process pool, and a Dask
LocalCluster (issue 25).

One Python process does one core's worth of ORM work; this scenario measures what spreading the
post's ops over processes gives on this machine, and what it costs.  Seven sides, each on fresh
tables, with the same unit function (:mod:`benchmarks.workers.processes`: the post's op, returning
when it started and in which process), ``limit=`` :data:`LIMIT` connections in all, and sessions
with SQLAlchemy's defaults, as ProcessRunner's workers make them:

* ``semaphore``: one ``SemaphoreRunner(limit=L)`` in this process (asyncpg), ``map(fn, ops)``;
* ``threads``: one ``ThreadOffloadRunner(limit=L)`` in this process (psycopg), ``map(fn, ops)``;
* ``process-1``, ``process-2``, ``process-4``: ``ProcessRunner(url, limit=L, processes=P)``
  (asyncpg, an ``async def`` fn: a ``SemaphoreRunner`` of L/P in each worker);
* ``hand-written-2``: the overhead reference, a ``ProcessPoolExecutor(2)`` (``spawn``) whose
  processes each build an engine of L/2 connections and run a ``SemaphoreRunner(limit=L/2)`` over
  their half of the ops (the first half and the second);
* ``dask-2``: ``ProcessRunner(url, limit=L, processes=2, cluster=client)`` on a
  ``LocalCluster(n_workers=2, threads_per_worker=1, processes=True)`` started once per pass,
  before the rounds and outside their timing.

Each side is timed from creating its runner (or pool, or engine) to the end of its ``with`` block:
start-up and shutdown included.  From the units' values it also gets the start-up alone (until the
first unit started), until every process had started a unit, the shutdown (from ``map()``'s
return to the end of the block), and the units each process ran.  Client CPU is this process's
(``process_time``: the parent, the probe's sampler, an in-process runner's whole work, Dask's
scheduler) plus its children's that ended during the side (``getrusage(RUSAGE_CHILDREN)``: the
workers, joined when the runner closes) plus, for ``dask-2``, the CPU of the cluster's worker
processes (``/proc``); server CPU and peak server connections come from the probe's sampler (the
side's backends by application_name, which every worker's engine sets).

A warm-up of every side on :data:`WARMUP_OPS` ops comes first, not recorded.  Then
``--processes-rounds`` rounds (:data:`DEFAULT_ROUNDS`; 1 with ``--quick``) of every side on the first
``min(N, MAX_OPS)`` ops, in :data:`SIDES`' order in rounds 1, 3, ... and reversed in rounds 2, 4, ...
(ABBA for every pair).  :mod:`benchmarks.report.processes` turns the rows into medians, per-round
ratios with their geometric mean and 95% interval, the goals, a model of bigger hosts, and a chart.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import multiprocessing
import os
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Iterator
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from typing import Any

from sqlalchemy.ext.asyncio import async_sessionmaker
from sqlalchemy.orm import sessionmaker

from boundeddb import ProcessRunner, RunReport, SemaphoreRunner, ThreadOffloadRunner

from ..db.proc import children_cpu_s, proc_cpu_s
from ..harness import Context, Probe
from ..scenario import Scenario
from ..workers.processes import Started, hand_written_share, summary, timed_async, timed_sync
from ..workload import Op

GROUP = "processes"
#: The connection budget of every side (the earlier study's L).
LIMIT = 8
#: Ops per measurement: the first min(N, this) of the sequence.
MAX_OPS = 4_000
WARMUP_OPS = 200
#: Rounds by default, and with --quick.
DEFAULT_ROUNDS, QUICK_ROUNDS = 3, 1
#: Rough seconds, on 2 quiet cores: the LocalCluster and the warm-up, then one round of the 7 sides.
SETUP_S, SECONDS_PER_ROUND = 50, 75
HAND_PROCESSES = DASK_WORKERS = 2
THREADS_DRIVER = "psycopg"


@dataclass
class Ran:
    """What one side's run gives back: the units' (start, pid), latencies, failures, when map() returned."""

    starts: list[Started]
    latencies: list[float]
    failed: int
    first_error: str | None
    mapped: float
    stats: dict[str, Any] | None = None


@dataclass
class Bench:
    """The scenario's context, and the Dask cluster's client and worker processes (if it started)."""

    ctx: Context
    client: Any = None
    cluster_pids: tuple[int, ...] = ()
    cluster_error: str | None = None


@dataclass(frozen=True)
class Side:
    """One side: its key, its label's stem, what it runs, how many processes, and how."""

    key: str
    name: str
    what: str
    processes: int
    run: Callable[[Bench, str, list[Op]], Awaitable[Ran]]
    dask: bool = False


def _ran(report: RunReport[Started], mapped: float) -> Ran:
    stats = dataclasses.asdict(report.stats)
    stats.pop("limit_trace", None)
    return Ran(**summary(report), mapped=mapped, stats=stats)


async def _semaphore(bench: Bench, app: str, ops: list[Op]) -> Ran:
    engine = bench.ctx.db.async_engine(app, pool_size=LIMIT)
    try:
        async with SemaphoreRunner(async_sessionmaker(engine), limit=LIMIT, errors="collect") as runner:
            report = await runner.map(timed_async, ops)
            mapped = time.monotonic()
    finally:
        await engine.dispose()
    return _ran(report, mapped)


async def _threads(bench: Bench, app: str, ops: list[Op]) -> Ran:
    engine = bench.ctx.db.sync_engine(app, pool_size=LIMIT, driver=THREADS_DRIVER)
    try:
        async with ThreadOffloadRunner(sessionmaker(engine), limit=LIMIT, errors="collect") as runner:
            report = await runner.map(timed_sync, ops)
            mapped = time.monotonic()
    finally:
        await asyncio.to_thread(engine.dispose)
    return _ran(report, mapped)


def _process_runner(
    processes: int, *, dask: bool = False
) -> Callable[[Bench, str, list[Op]], Awaitable[Ran]]:
    async def run(bench: Bench, app: str, ops: list[Op]) -> Ran:
        if dask and bench.client is None:
            raise RuntimeError(bench.cluster_error or "the Dask LocalCluster did not start")
        db = bench.ctx.db
        runner = ProcessRunner(
            db.driver_url(db.async_driver),
            limit=LIMIT,
            processes=processes,
            engine_options=db.async_options(app),
            errors="collect",
            cluster=bench.client if dask else None,
        )
        async with runner:
            report = await runner.map(timed_async, ops)
            mapped = time.monotonic()
        return _ran(report, mapped)

    return run


async def _hand_written(bench: Bench, app: str, ops: list[Op]) -> Ran:
    db, n = bench.ctx.db, len(ops)
    url, options, share = db.driver_url(db.async_driver), db.async_options(app), LIMIT // HAND_PROCESSES
    parts = [ops[k * n // HAND_PROCESSES : (k + 1) * n // HAND_PROCESSES] for k in range(HAND_PROCESSES)]
    loop = asyncio.get_running_loop()
    pool = ProcessPoolExecutor(HAND_PROCESSES, mp_context=multiprocessing.get_context("spawn"))
    try:
        done = await asyncio.gather(
            *(loop.run_in_executor(pool, hand_written_share, url, options, share, part) for part in parts)
        )
        mapped = time.monotonic()
    finally:
        await asyncio.to_thread(pool.shutdown)
    errors = [d["first_error"] for d in done if d["first_error"]]
    return Ran(
        starts=[s for d in done for s in d["starts"]],
        latencies=[x for d in done for x in d["latencies"]],
        failed=sum(d["failed"] for d in done),
        first_error=errors[0] if errors else None,
        mapped=mapped,
    )


SIDES: tuple[Side, ...] = (
    Side("semaphore", "semaphore", "one SemaphoreRunner(limit=L) in this process (asyncpg)", 1, _semaphore),
    Side("threads", "threads", "one ThreadOffloadRunner(limit=L) in this process (psycopg)", 1, _threads),
    *(
        Side(f"process-{p}", f"process-{p}", f"ProcessRunner(limit=L, processes={p})", p, _process_runner(p))
        for p in (1, 2, 4)
    ),
    Side(
        "hand-written-2",
        "hand-written pool-2",
        "ProcessPoolExecutor(2, spawn), each process a SemaphoreRunner(limit=L/2) on half the ops",
        HAND_PROCESSES,
        _hand_written,
    ),
    Side(
        "dask-2",
        "dask-2",
        "ProcessRunner(limit=L, cluster=client) on a LocalCluster of 2 worker processes",
        DASK_WORKERS,
        _process_runner(DASK_WORKERS, dask=True),
        dask=True,
    ),
)
BY_KEY = {side.key: side for side in SIDES}


class CpuMeter:
    """CPU seconds since it was made: this process's, and its workers' (ended children, and ``pids``)."""

    def __init__(self, pids: tuple[int, ...] = ()) -> None:
        self._pids = pids
        self._start = self._now()

    def _now(self) -> tuple[float, float]:
        watched = sum(proc_cpu_s(pid) or 0.0 for pid in self._pids)
        return time.process_time(), children_cpu_s() + watched

    def read(self) -> tuple[float, float]:
        """(this process, its workers) CPU seconds since the meter was made."""
        now = self._now()
        return now[0] - self._start[0], now[1] - self._start[1]


def timing(ran: Ran, t0: float, end: float) -> dict[str, Any]:
    """Start-up, all processes started, run and shutdown seconds, and the units per process."""
    if not ran.starts:
        return {}
    first: dict[int, float] = {}
    for started, pid in ran.starts:
        first[pid] = min(started, first.get(pid, started))
    begun = min(first.values())
    return {
        "startup_s": begun - t0,
        "all_started_s": max(first.values()) - t0,
        "run_s": ran.mapped - begun,
        "shutdown_s": end - ran.mapped,
        "units_per_process": sorted(Counter(pid for _, pid in ran.starts).values(), reverse=True),
    }


async def _timed(
    bench: Bench, side: Side, ops: list[Op], label: str, app: str, config: dict[str, Any]
) -> None:
    ctx = bench.ctx
    async with Probe(ctx, "processes", label, total=len(ops), app_name=app, group=GROUP, config=config) as p:
        meter = CpuMeter(bench.cluster_pids if side.dask else ())
        t0 = time.monotonic()
        ran = await side.run(bench, app, ops)
        end = time.monotonic()
        parent_cpu, workers_cpu = meter.read()
        p.latencies, p.failed = ran.latencies, ran.failed
    m = p.m
    if m.error:
        return
    m.client_cpu_s = parent_cpu + workers_cpu
    m.extra.update(timing(ran, t0, end), parent_cpu_s=parent_cpu, workers_cpu_s=workers_cpu)
    if ran.first_error:
        m.extra["first_error"] = ran.first_error
    if ran.stats is not None:
        m.extra["runner_stats"] = ran.stats


def measure(bench: Bench, side: Side, ops: list[Op], label: str, extra: dict[str, Any]) -> None:
    """One side on fresh tables; an error outside its probe is recorded too, and the rounds go on."""
    ctx = bench.ctx
    config = {"side": side.key, "processes": side.processes, "limit": LIMIT, **extra}
    try:
        ctx.reset()
        asyncio.run(_timed(bench, side, ops, label, ctx.app_name(label), config))
    except Exception as exc:
        ctx.failed("processes", label, exc, group=GROUP, **config)


@contextlib.contextmanager
def cluster(ctx: Context) -> Iterator[Bench]:
    """The Dask LocalCluster of the dask-2 side, for the whole pass; a Bench without one if it fails."""
    try:
        from distributed import Client, LocalCluster
    except ImportError as exc:
        yield Bench(ctx, cluster_error=f"{exc}: pip install 'boundeddb[dask]' for the dask-2 side")
        return
    ctx.log(f"starting a Dask LocalCluster of {DASK_WORKERS} worker processes (not timed)")
    with contextlib.ExitStack() as stack:
        try:
            local = stack.enter_context(
                LocalCluster(
                    n_workers=DASK_WORKERS, threads_per_worker=1, processes=True, dashboard_address=None
                )
            )
            client = stack.enter_context(Client(local))
            pids = tuple(client.run(os.getpid).values())
        except Exception as exc:
            stack.close()
            yield Bench(ctx, cluster_error=f"the LocalCluster did not start: {type(exc).__name__}: {exc}")
            return
        yield Bench(ctx, client, pids)


def order(k: int) -> tuple[Side, ...]:
    """The sides in round ``k`` (0-based): forward in even rounds, reversed in odd ones."""
    return SIDES if k % 2 == 0 else SIDES[::-1]


def run(ctx: Context) -> None:
    ops = ctx.ops[:MAX_OPS]
    with cluster(ctx) as bench:
        before = len(ctx.results)
        for side in SIDES:
            measure(bench, side, ops[:WARMUP_OPS], f"warm-up {side.name}", {})
        del ctx.results[before:]  # the warm-up is not a result
        for k in range(max(1, ctx.processes_rounds)):
            direction = "forward" if k % 2 == 0 else "reversed"
            for position, side in enumerate(order(k), start=1):
                extra = {"round": k + 1, "position": position, "order": direction}
                measure(bench, side, ops, f"{side.name} (L={LIMIT}) round {k + 1}", extra)


SCENARIO = Scenario(
    name="processes",
    run=run,
    what="ProcessRunner with 1, 2, 4 processes against one SemaphoreRunner and one ThreadOffloadRunner "
    "at L=8, a hand-written process pool and a Dask LocalCluster, in ABBA rounds",
    section="Processes",
    seconds=SETUP_S + DEFAULT_ROUNDS * SECONDS_PER_ROUND,
    index_pass=True,
    default=False,
)
