"""
``loop-lag``: event-loop lag in a real ASGI app while it serves database requests (seeds 004, 002).

Seed 004 shows an unrelated ``/ping`` slowed to ~12 s while 100 requests run SQLAlchemy
AsyncSession queries, and a sync endpoint in the framework's threadpool doing better.  Here a
Starlette app, served by uvicorn in this process on a free loopback port, has ``/ping`` and
``/db/{i}`` (op i of the workload), served four ways:

* ``inline``: ``async with AsyncSession`` in the endpoint (asyncpg);
* ``threadpool``: a sync endpoint, which Starlette runs in its threadpool (psycopg);
* ``semaphore-submit``: ``await SemaphoreRunner.submit(unit)`` (asyncpg);
* ``thread-offload-submit``: ``await ThreadOffloadRunner.submit(unit)`` (psycopg).

A load generator in a separate process (:mod:`benchmarks.workers.loadgen`, httpx) keeps 50 DB
requests in flight (at most ``--loop-lag-requests`` of them, and at most 120 s), and a pinger in
another process sends one ``/ping`` at a time, 20 ms apart; the ``/ping`` latencies, the DB requests/s, peak
connections, the server's loop lag and its garbage-collector pauses are reported.

Each way runs at L = ``--limit`` connections (the pool; and the runner's limit), and then
variants that each turn one knob, to find what keeps ``/ping`` fast (the report compares every
variant with the one that differs from it in one knob only):

* ``L=2``, ``L=4``: fewer units in flight, so fewer units running Python in the server at once
  (for ``inline``, a pool of 4 instead of a runner);
* ``switch=1ms``: ``sys.setswitchinterval(0.001)`` instead of 0.005 s, in the server (this
  process) only and restored after: the GIL changes hands more often between busy threads;
* ``c=20``: 20 DB requests in flight instead of 50;
* ``gc.freeze``: ``gc.collect(); gc.freeze()`` once the app is built, as servers do after
  start-up, so that the garbage collector's full collections skip the long-lived objects.

Then one family with a backfill on the endpoints' own runner (issue 10): ``semaphore-submit+bulk``
is ``semaphore-submit`` at L=4 while a :class:`~benchmarks.scenarios.mixed_priorities.BulkJob` runs the
``mixed`` scenario's bulk units (50-200 ms of ``pg_sleep`` and a one-row insert) through the same
``SemaphoreRunner`` at priority 0 for the whole variant: the endpoints' ``submit`` at priority
0, at ``priority=1``, and at ``priority=1`` on a runner with ``reserve=1``.  Each also records
the bulk units finished (and per second) while the load ran; ``semaphore-submit L=4`` is the same
app without the bulk job.

The listening socket is created with ``IPPROTO_TCP`` so that asyncio sets ``TCP_NODELAY`` on
each connection, as it does under ``uvicorn --host --port``; with protocol 0 every response's
body waited for the client's delayed ACK (~40 ms on Linux) behind its headers.
"""

from __future__ import annotations

import asyncio
import gc
import resource
import sys
import threading
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from sqlalchemy.ext.asyncio import async_sessionmaker
from sqlalchemy.orm import sessionmaker
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import PlainTextResponse
from starlette.routing import Route

from boundeddb import SemaphoreRunner, ThreadOffloadRunner

from ..harness import Context, Probe
from ..measurement import Measurement
from ..scenario import Scenario
from ..stats import percentile
from ..workload import async_unit, op_async, op_sync, sync_unit
from . import _web as web
from .mixed_priorities import BulkJob

KINDS = ("inline", "threadpool", "semaphore-submit", "thread-offload-submit")
#: ``semaphore-submit`` with a bulk job on the same runner (see the module docstring).
BULK_KIND = "semaphore-submit+bulk"
CONCURRENCY = 50
#: Each variant's load generator stops at this deadline even if requests remain.
DEADLINE_S = 120.0


@dataclass(frozen=True)
class Variant:
    """One way of serving /db: a kind, its limit, the interpreter's switch interval, the load."""

    kind: str
    #: Connections (and runner limit, or threads); None: ``--limit``.
    limit: int | None = None
    #: ``sys.setswitchinterval`` in the server (this process) while it serves; None: leave it.
    switch_interval_s: float | None = None
    #: DB requests the load generator keeps in flight.
    concurrency: int = CONCURRENCY
    #: ``gc.collect(); gc.freeze()`` in the server once the app is built (``gc.unfreeze()`` after).
    gc_freeze: bool = False
    #: The endpoints' ``submit(..., priority=)`` and the runner's ``reserve`` (BULK_KIND only).
    priority: int = 0
    reserve: int = 0

    def label(self) -> str:
        parts = ["loop-lag", self.kind]
        if self.limit is not None:
            parts.append(f"L={self.limit}")
        if self.switch_interval_s is not None:
            parts.append(f"switch={self.switch_interval_s * 1e3:g}ms")
        if self.concurrency != CONCURRENCY:
            parts.append(f"c={self.concurrency}")
        if self.gc_freeze:
            parts.append("gc.freeze")
        if self.priority:
            parts.append(f"priority={self.priority}")
        if self.reserve:
            parts.append(f"reserve={self.reserve}")
        return " ".join(parts)


#: The four ways of the issue, at ``--limit`` and 50 requests in flight.
BASE = tuple(Variant(kind) for kind in KINDS)
#: One knob turned at a time (and the best combinations): see the module docstring.
EXTRA = (
    Variant("thread-offload-submit", limit=2),
    Variant("thread-offload-submit", limit=4),
    Variant("semaphore-submit", limit=4),
    Variant("inline", limit=4),
    Variant("thread-offload-submit", switch_interval_s=0.001),
    Variant("threadpool", switch_interval_s=0.001),
    Variant("thread-offload-submit", concurrency=20),
    Variant("inline", gc_freeze=True),
    Variant("thread-offload-submit", limit=4, gc_freeze=True),
    Variant("semaphore-submit", limit=4, gc_freeze=True),
    Variant("thread-offload-submit", limit=2, gc_freeze=True),
)
#: A bulk job on the endpoints' runner: no priority, priority=1, priority=1 with a reserve.
BULK = (
    Variant(BULK_KIND, limit=4),
    Variant(BULK_KIND, limit=4, priority=1),
    Variant(BULK_KIND, limit=4, priority=1, reserve=1),
)
VARIANTS = BASE + EXTRA + BULK


def run(ctx: Context) -> None:
    for variant in VARIANTS:
        asyncio.run(_variant(ctx, variant))


def _noop() -> None:
    pass


Endpoint = Callable[[Request], Any]
Cleanup = list[Callable[[], Awaitable[Any]]]


def _build(
    ctx: Context, spec: Variant, limit: int, app_name: str
) -> tuple[Endpoint, Cleanup, str, BulkJob | None]:
    """The /db endpoint of ``spec``, what to close afterwards, the driver, and its bulk job if any."""
    ops = ctx.ops
    variant = spec.kind
    if variant == BULK_KIND:
        engine = ctx.db.async_engine(app_name, pool_size=limit)
        runner = SemaphoreRunner(
            async_sessionmaker(engine, expire_on_commit=False), limit=limit, reserve=spec.reserve
        )
        bulk = BulkJob(runner, ctx.seed)

        async def bulk_submit(request: Request) -> PlainTextResponse:
            unit = async_unit(ops[request.path_params["i"]], _noop)
            await runner.submit(unit, priority=spec.priority)
            return PlainTextResponse("ok")

        return bulk_submit, [bulk.stop, runner.aclose, engine.dispose], "asyncpg", bulk
    if variant in ("inline", "semaphore-submit"):
        engine = ctx.db.async_engine(app_name, pool_size=limit)
        sessions = async_sessionmaker(engine, expire_on_commit=False)
        if variant == "inline":

            async def inline(request: Request) -> PlainTextResponse:
                async with sessions() as session:
                    await op_async(session, ops[request.path_params["i"]])
                    await session.commit()
                return PlainTextResponse("ok")

            return inline, [engine.dispose], "asyncpg", None
        runner = SemaphoreRunner(sessions, limit=limit)

        async def semaphore_submit(request: Request) -> PlainTextResponse:
            await runner.submit(async_unit(ops[request.path_params["i"]], _noop))
            return PlainTextResponse("ok")

        return semaphore_submit, [runner.aclose, engine.dispose], "asyncpg", None

    sync_engine = ctx.db.sync_engine(app_name, pool_size=limit, driver="psycopg")
    sync_sessions = sessionmaker(sync_engine, expire_on_commit=False)
    dispose = _async(sync_engine.dispose)
    if variant == "threadpool":

        def threadpool(request: Request) -> PlainTextResponse:
            with sync_sessions() as session:
                op_sync(session, ops[request.path_params["i"]])
                session.commit()
            return PlainTextResponse("ok")

        return threadpool, [dispose], "psycopg", None
    thread_runner = ThreadOffloadRunner(sync_sessions, limit=limit)

    async def thread_offload_submit(request: Request) -> PlainTextResponse:
        await thread_runner.submit(sync_unit(ops[request.path_params["i"]], _noop))
        return PlainTextResponse("ok")

    return thread_offload_submit, [thread_runner.aclose, dispose], "psycopg", None


async def _variant(ctx: Context, variant: Variant) -> None:
    ctx.reset()
    label = variant.label()
    app_name = ctx.app_name(label)
    limit = variant.limit or ctx.limit
    endpoint, cleanup, driver, bulk = _build(ctx, variant, limit, app_name)
    app = Starlette(routes=[Route("/ping", web.ping), Route("/db/{i:int}", endpoint)])
    switch_interval = sys.getswitchinterval()
    try:
        if variant.switch_interval_s is not None:
            sys.setswitchinterval(variant.switch_interval_s)
        if variant.gc_freeze:
            gc.collect()
            gc.freeze()
        if bulk is not None:
            bulk.start()
        await _serve_and_load(ctx, app, variant, limit, label, app_name, driver, bulk)
    finally:
        sys.setswitchinterval(switch_interval)  # this process's, restored whatever happened
        if variant.gc_freeze:
            gc.unfreeze()
        for close in cleanup:
            await close()
        if bulk is not None and bulk.error and ctx.results and ctx.results[-1].label == label:
            ctx.results[-1].extra["bulk_error"] = bulk.error


def _async(fn: Callable[[], Any]) -> Callable[[], Awaitable[None]]:
    async def call() -> None:
        fn()

    return call


async def _serve_and_load(
    ctx: Context,
    app: Starlette,
    variant: Variant,
    limit: int,
    label: str,
    app_name: str,
    driver: str,
    bulk: BulkJob | None = None,
) -> None:
    requests = ctx.loop_lag_requests
    config_out = {
        "variant": variant.kind,
        "limit": limit,
        "driver": driver,
        "pool_size": limit,
        "max_overflow": 0,
        "concurrency": variant.concurrency,
        "requests": requests,
        "switch_interval_s": sys.getswitchinterval(),
        "gc_freeze": variant.gc_freeze,
        "tcp_nodelay": True,
        "deadline_s": DEADLINE_S,
        "server": "uvicorn (in-process) + Starlette",
    }
    if variant.kind == "threadpool":
        config_out["threads"] = "Starlette's threadpool (anyio's default limiter: 40 threads)"
    if bulk is not None:
        config_out.update(
            priority=variant.priority, reserve=variant.reserve, bulk="mixed_priorities.BulkJob, priority 0"
        )
    async with web.serve(app) as base:
        await _load(ctx, base, label, app_name, config_out, bulk)


async def _load(
    ctx: Context, base: str, label: str, app_name: str, config: dict[str, Any], bulk: BulkJob | None = None
) -> None:
    """Run the pinger and the load generator against ``base`` inside a Probe."""
    requests = config["requests"]
    child0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    pinger = await web.spawn("ping", base)
    loadgen = await web.spawn(
        "db", base, str(requests), str(config["concurrency"]), str(len(ctx.ops)), str(DEADLINE_S)
    )
    try:
        await web.ready(pinger)
        await web.ready(loadgen)
        probe = Probe(
            ctx, "loop-lag", label, total=requests, app_name=app_name, group="loop-lag", config=config
        )
        threads_seen = 0
        window = (0.0, 0.0)
        with web.GcPauses() as collections:
            async with probe as p:
                started = time.perf_counter()
                for proc in (pinger, loadgen):
                    await web.go(proc)
                result = await web.result(loadgen)
                p.latencies = result["db_latencies"]
                p.failed = result["errors"]
                p.done = result["db_ok"]
                threads_seen = threading.active_count()
                window = (started, time.perf_counter())
        assert pinger.stdin is not None
        pinger.stdin.close()
        if probe.m.error is None:
            pings = await web.result(pinger)
            child1 = resource.getrusage(resource.RUSAGE_CHILDREN)
            child_cpu = child1.ru_utime + child1.ru_stime - child0.ru_utime - child0.ru_stime
            _summarise(probe.m, result, pings, child_cpu)
            probe.m.extra.update(server_threads=threads_seen, **collections.summary())
            if bulk is not None:
                probe.m.extra.update(bulk.summary(*window))
    finally:
        await web.stop(pinger, loadgen)


def _summarise(m: Measurement, result: dict[str, Any], pings: dict[str, Any], child_cpu: float) -> None:
    ping = pings["ping_latencies"]
    m.ops_per_s = result["db_ok"] / result["elapsed_s"] if result["elapsed_s"] else None
    m.extra.update(
        ping_count=len(ping),
        ping_p50_s=percentile(ping, 0.5),
        ping_p95_s=percentile(ping, 0.95),
        ping_p99_s=percentile(ping, 0.99),
        ping_max_s=max(ping, default=None),
        ping_slowest_s=sorted(ping)[-10:],
        ping_errors=pings["errors"],
        loadgen_elapsed_s=result["elapsed_s"],
        loadgen_cpu_s=child_cpu,
        loadgen_busy_cpu_s=result.get("cpu_s"),
        deadline_hit=result.get("deadline_hit", False),
        first_error=result["first_error"] or pings["first_error"],
    )


SCENARIO = Scenario(
    name="loop-lag",
    run=run,
    what="an ASGI app's /ping latency while it serves database requests, 18 ways",
    section="Loop lag under HTTP load",
    seconds=240,
    default=False,
)
