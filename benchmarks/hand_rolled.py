"""
``hand-rolled``: the runners' strategies written by hand, the yardsticks for boundeddb's overhead.

* ``hand-rolled (L)``: what people write without a library — a task per op, each taking an
  ``asyncio.Semaphore(L)`` around ``async with AsyncSession: ...; commit()`` (asyncpg, as
  ``semaphore``).
* ``hand-rolled-threads (L)``: ``concurrent.futures.ThreadPoolExecutor(L).map`` over the ops,
  each with its own ``Session`` (psycopg, as ``threads``), no event loop at all.
"""

from __future__ import annotations

import asyncio
import time
from concurrent.futures import ThreadPoolExecutor

from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker
from sqlalchemy.orm import Session, sessionmaker

from ._harness import Context, Probe
from ._workload import Op, op_async, op_sync

THREADS_DRIVER = "psycopg"


def run(ctx: Context) -> None:
    asyncio.run(measure_async(ctx, ctx.limit, ctx.ops))
    measure_threads(ctx, ctx.limit, ctx.ops)


async def measure_async(
    ctx: Context, limit: int, ops: list[Op], *, group: str = "main", label: str | None = None
) -> None:
    """Run ``ops`` through a task per op behind ``asyncio.Semaphore(limit)`` on fresh tables."""
    ctx.reset()
    label = label or f"hand-rolled (L={limit})"
    app = ctx.app_name(label)
    engine = ctx.db.async_engine(app, pool_size=limit)
    sessions = async_sessionmaker(engine, expire_on_commit=False)
    gate = asyncio.Semaphore(limit)
    config = {"driver": "asyncpg", "limit": limit, "pool_size": limit, "max_overflow": 0}

    async def one(session_factory: async_sessionmaker[AsyncSession], op: Op, p: Probe) -> float:
        async with gate:
            start = time.perf_counter()
            async with session_factory() as session:
                await op_async(session, op)
                await session.commit()
            p.tick()
            return time.perf_counter() - start

    try:
        probe = Probe(ctx, "hand-rolled", label, total=len(ops), app_name=app, group=group, config=config)
        probe.m.extra["note"] = "a task per op behind asyncio.Semaphore(L), AsyncSession, asyncpg"
        async with probe as p:
            tasks = [asyncio.create_task(one(sessions, op, p)) for op in ops]
            results = await asyncio.gather(*tasks, return_exceptions=True)
            p.latencies = [r for r in results if isinstance(r, float)]
            p.failed = len(results) - len(p.latencies)
    finally:
        await engine.dispose()


def measure_threads(
    ctx: Context, limit: int, ops: list[Op], *, group: str = "main", label: str | None = None
) -> None:
    """Run ``ops`` through ``ThreadPoolExecutor(limit).map`` on fresh tables."""
    ctx.reset()
    label = label or f"hand-rolled-threads (L={limit})"
    app = ctx.app_name(label)
    engine = ctx.db.sync_engine(app, pool_size=limit, driver=THREADS_DRIVER)
    sessions = sessionmaker(engine, expire_on_commit=False)
    config = {"driver": THREADS_DRIVER, "limit": limit, "pool_size": limit, "max_overflow": 0}

    def one(session_factory: sessionmaker[Session], op: Op, p: Probe) -> float:
        start = time.perf_counter()
        with session_factory() as session:
            op_sync(session, op)
            session.commit()
        p.tick()
        return time.perf_counter() - start

    try:
        probe = Probe(
            ctx, "hand-rolled-threads", label, total=len(ops), app_name=app, group=group, config=config
        )
        probe.m.extra["note"] = f"ThreadPoolExecutor(L).map with a Session per op, {THREADS_DRIVER}, no loop"
        with probe as p, ThreadPoolExecutor(limit, thread_name_prefix="hand-rolled") as pool:
            p.latencies = list(pool.map(one, [sessions] * len(ops), ops, [p] * len(ops)))
    finally:
        engine.dispose()
