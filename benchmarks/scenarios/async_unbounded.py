"""
``async-unbounded``: the post's "Async story one" — a task per op, on a big pool.

Reproduces the post's first asyncio script (116 s, ~100 connections there): every op becomes
``asyncio.create_task`` at once, with the post's ``await asyncio.sleep(0)`` after each create,
and only the pool bounds concurrency.  The post's pool had 3,000 slots on a server with
max_connections=2000; ours allows ``max_connections`` (100 by default), so the pool is sized just
under what the server has free (90 at most) and its checkout timeout is raised so that queued
tasks wait rather than fail.  The row reports how many connections the run grabbed.
"""

from __future__ import annotations

import asyncio

from sqlalchemy.ext.asyncio import async_sessionmaker

from ..harness import Context, Probe
from ..scenario import throughput_row
from .hand_rolled import timed_op

MAX_POOL = 90
POOL_TIMEOUT_S = 3600


def run(ctx: Context) -> None:
    asyncio.run(_main(ctx))


async def _main(ctx: Context) -> None:
    ctx.reset()
    pool_size = min(MAX_POOL, ctx.db.free_connections())
    app = ctx.app_name("async-unbounded")
    engine = ctx.db.async_engine(app, pool_size=pool_size, pool_timeout=POOL_TIMEOUT_S)
    sessions = async_sessionmaker(engine, expire_on_commit=False)
    config = {
        "driver": "asyncpg",
        "pool_size": pool_size,
        "max_overflow": 0,
        "pool_timeout": POOL_TIMEOUT_S,
        "server_max_connections": ctx.db.max_connections,
    }
    try:
        label = f"async-unbounded (pool {pool_size})"
        probe = Probe(ctx, "async-unbounded", label, total=len(ctx.ops), app_name=app, config=config)
        probe.m.extra["note"] = (
            f"the post's pool had 3,000 slots; this server has max_connections={ctx.db.max_connections}, "
            f"so the pool is {pool_size} (just under what was free), with a {POOL_TIMEOUT_S} s checkout "
            "timeout so that queued tasks wait instead of failing"
        )
        async with probe as p:
            tasks = []
            for op in ctx.ops:
                tasks.append(asyncio.create_task(timed_op(sessions, op, p)))
                if op.kind == "create":
                    await asyncio.sleep(0)  # the post's trick
            done, _ = await asyncio.wait(tasks)
            p.latencies = [t.result() for t in done if t.exception() is None]
            p.failed = len(done) - len(p.latencies)
            p.m.extra["first_error"] = next((repr(t.exception()) for t in done if t.exception()), None)
    finally:
        await engine.dispose()


SCENARIO = throughput_row(
    "async-unbounded",
    run,
    "the post's first async script: a task per op, bounded only by a pool near max_connections",
    seconds=12,
)
