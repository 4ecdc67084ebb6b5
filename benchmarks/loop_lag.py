"""
``loop-lag``: event-loop lag in a real ASGI app while it serves database requests (seeds 004, 002).

Seed 004 shows an unrelated ``/ping`` slowed to ~12 s while 100 requests run SQLAlchemy
AsyncSession queries, and a sync endpoint in the framework's threadpool doing better.  Here a
Starlette app, served by uvicorn in this process on a free loopback port, has ``/ping`` and
``/db/{i}`` (op i of the workload) in four variants:

* ``inline``: ``async with AsyncSession`` in the endpoint (asyncpg);
* ``threadpool``: a sync endpoint, which Starlette runs in its threadpool (psycopg);
* ``semaphore-submit``: ``await SemaphoreRunner.submit(unit)`` (asyncpg);
* ``thread-offload-submit``: ``await ThreadOffloadRunner.submit(unit)`` (psycopg).

Every variant's engine has a pool of L (``--limit``) connections.  A load generator in a separate
process (``_loadgen.py``, httpx) keeps 50 DB requests in flight, and a pinger in another
process sends one ``/ping`` at a time, 20 ms apart; the ``/ping`` latencies, the DB requests/s
and the server's loop lag are reported.
"""

from __future__ import annotations

import asyncio
import json
import resource
import socket
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import uvicorn
from sqlalchemy.ext.asyncio import async_sessionmaker
from sqlalchemy.orm import sessionmaker
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import PlainTextResponse
from starlette.routing import Route

from boundeddb import SemaphoreRunner, ThreadOffloadRunner

from ._harness import Context, Measurement, Probe, percentile
from ._workload import async_unit, op_async, op_sync, sync_unit

VARIANTS = ("inline", "threadpool", "semaphore-submit", "thread-offload-submit")
CONCURRENCY = 50
LOADGEN = Path(__file__).with_name("_loadgen.py")


def run(ctx: Context) -> None:
    for variant in VARIANTS:
        asyncio.run(_variant(ctx, variant))


def _noop() -> None:
    pass


async def _ping(request: Request) -> PlainTextResponse:
    return PlainTextResponse("pong")


Endpoint = Callable[[Request], Any]
Cleanup = list[Callable[[], Awaitable[Any]]]


def _build(ctx: Context, variant: str, app_name: str) -> tuple[Endpoint, Cleanup, str]:
    """The /db endpoint of ``variant``, what to close afterwards, and the driver it uses."""
    limit, ops = ctx.limit, ctx.ops
    if variant in ("inline", "semaphore-submit"):
        engine = ctx.db.async_engine(app_name, pool_size=limit)
        sessions = async_sessionmaker(engine, expire_on_commit=False)
        if variant == "inline":

            async def inline(request: Request) -> PlainTextResponse:
                async with sessions() as session:
                    await op_async(session, ops[request.path_params["i"]])
                    await session.commit()
                return PlainTextResponse("ok")

            return inline, [engine.dispose], "asyncpg"
        runner = SemaphoreRunner(sessions, limit=limit)

        async def semaphore_submit(request: Request) -> PlainTextResponse:
            await runner.submit(async_unit(ops[request.path_params["i"]], _noop))
            return PlainTextResponse("ok")

        return semaphore_submit, [runner.aclose, engine.dispose], "asyncpg"

    sync_engine = ctx.db.sync_engine(app_name, pool_size=limit, driver="psycopg")
    sync_sessions = sessionmaker(sync_engine, expire_on_commit=False)
    dispose = _async(sync_engine.dispose)
    if variant == "threadpool":

        def threadpool(request: Request) -> PlainTextResponse:
            with sync_sessions() as session:
                op_sync(session, ops[request.path_params["i"]])
                session.commit()
            return PlainTextResponse("ok")

        return threadpool, [dispose], "psycopg"
    thread_runner = ThreadOffloadRunner(sync_sessions, limit=limit)

    async def thread_offload_submit(request: Request) -> PlainTextResponse:
        await thread_runner.submit(sync_unit(ops[request.path_params["i"]], _noop))
        return PlainTextResponse("ok")

    return thread_offload_submit, [thread_runner.aclose, dispose], "psycopg"


async def _variant(ctx: Context, variant: str) -> None:
    ctx.reset()
    label = f"loop-lag {variant}"
    app_name = ctx.app_name(label)
    endpoint, cleanup, driver = _build(ctx, variant, app_name)
    app = Starlette(routes=[Route("/ping", _ping), Route("/db/{i:int}", endpoint)])
    try:
        await _serve_and_load(ctx, app, variant, label, app_name, driver)
    finally:
        for close in cleanup:
            await close()


def _async(fn: Callable[[], Any]) -> Callable[[], Awaitable[None]]:
    async def call() -> None:
        fn()

    return call


async def _serve_and_load(
    ctx: Context, app: Starlette, variant: str, label: str, app_name: str, driver: str
) -> None:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    config = uvicorn.Config(app, log_level="warning", access_log=False, lifespan="off")
    server = uvicorn.Server(config)
    serving = asyncio.create_task(server.serve(sockets=[sock]))
    while not server.started:
        if serving.done():
            serving.result()
        await asyncio.sleep(0.01)
    requests = ctx.loop_lag_requests
    config_out = {
        "variant": variant,
        "driver": driver,
        "pool_size": ctx.limit,
        "max_overflow": 0,
        "concurrency": CONCURRENCY,
        "requests": requests,
        "server": "uvicorn (in-process) + Starlette",
    }
    if variant == "threadpool":
        config_out["threads"] = "Starlette's threadpool (anyio's default limiter: 40 threads)"
    try:
        await _load(ctx, f"http://127.0.0.1:{port}", label, app_name, config_out)
    finally:
        server.should_exit = True
        await serving


async def _load(ctx: Context, base: str, label: str, app_name: str, config: dict[str, Any]) -> None:
    """Run the pinger and the load generator against ``base`` inside a Probe."""
    requests = config["requests"]
    child0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    pinger = await _spawn("ping", base)
    loadgen = await _spawn("db", base, str(requests), str(CONCURRENCY), str(len(ctx.ops)))
    try:
        await _ready(pinger)
        await _ready(loadgen)
        probe = Probe(
            ctx, "loop-lag", label, total=requests, app_name=app_name, group="loop-lag", config=config
        )
        async with probe as p:
            for proc in (pinger, loadgen):
                assert proc.stdin is not None
                proc.stdin.write(b"go\n")
                await proc.stdin.drain()
            result = await _result(loadgen)
            p.latencies = result["db_latencies"]
            p.failed = result["errors"]
            p.done = result["db_ok"]
        assert pinger.stdin is not None
        pinger.stdin.close()
        if probe.m.error is None:
            pings = await _result(pinger)
            child1 = resource.getrusage(resource.RUSAGE_CHILDREN)
            child_cpu = child1.ru_utime + child1.ru_stime - child0.ru_utime - child0.ru_stime
            _summarise(probe.m, result, pings, child_cpu)
    finally:
        for proc in (pinger, loadgen):
            if proc.returncode is None:
                proc.kill()
                await proc.wait()


async def _spawn(*args: str) -> asyncio.subprocess.Process:
    return await asyncio.create_subprocess_exec(
        sys.executable, str(LOADGEN), *args, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE
    )


async def _ready(proc: asyncio.subprocess.Process) -> None:
    assert proc.stdout is not None
    line = await asyncio.wait_for(proc.stdout.readline(), 60)
    if line.strip() != b"ready":
        raise RuntimeError(f"load generator did not start: {line!r}")


async def _result(proc: asyncio.subprocess.Process) -> dict[str, Any]:
    assert proc.stdout is not None
    out = await proc.stdout.read()
    if await proc.wait():
        raise RuntimeError(f"load generator exited with {proc.returncode}")
    result: dict[str, Any] = json.loads(out)
    return result


def _summarise(m: Measurement, result: dict[str, Any], pings: dict[str, Any], child_cpu: float) -> None:
    ping = pings["ping_latencies"]
    m.ops_per_s = result["db_ok"] / result["elapsed_s"] if result["elapsed_s"] else None
    m.extra.update(
        ping_count=len(ping),
        ping_p50_s=percentile(ping, 0.5),
        ping_p99_s=percentile(ping, 0.99),
        ping_max_s=max(ping, default=None),
        ping_errors=pings["errors"],
        loadgen_elapsed_s=result["elapsed_s"],
        loadgen_cpu_s=child_cpu,
        first_error=result["first_error"] or pings["first_error"],
    )
