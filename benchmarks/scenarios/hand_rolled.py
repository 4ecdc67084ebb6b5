"""
``hand-rolled``: the runners' strategies written by hand, the yardsticks for boundeddb's overhead.

The ``hand-rolled`` scenario of the throughput table runs two of them on the whole sequence:

* ``hand-rolled (L)``: the tutorial pattern — ``asyncio.gather`` over a task per op, each taking an
  ``asyncio.Semaphore(L)`` around ``async with AsyncSession: ...; commit()`` (asyncpg, as
  ``semaphore``);
* ``hand-rolled-threads (L)``: ``concurrent.futures.ThreadPoolExecutor(L).map`` over the ops,
  each with its own ``Session`` (psycopg, as ``threads``), no event loop at all.

With ``--database mysql`` (aiomysql and pymysql) it also runs the sliding window
(:func:`measure_window`, ``SemaphoreRunner``'s exact equivalent) and the post's own chunks of 40
(:func:`measure_chunks`, ``ChunkedRunner``'s), so that every runner of the MariaDB table has its
hand-written twin beside it.

The ``overhead`` scenario also uses the hand-written equivalent of each runner, and a peer library:

* :func:`measure_window`: a sliding window, L worker coroutines pulling ops from one shared
  iterator (what ``SemaphoreRunner`` does);
* :func:`measure_chunks`: ``asyncio.gather`` over each consecutive chunk of L ops, a barrier between
  chunks (what ``ChunkedRunner`` does);
* :func:`measure_run_in_executor`: ``asyncio.gather`` over ``loop.run_in_executor(pool, ...)`` with a
  ``ThreadPoolExecutor(L)``, under asyncio (what ``await ThreadOffloadRunner.run`` does);
* :func:`measure_aiometer`: ``aiometer.run_on_each(fn, ops, max_at_once=L)``, a peer a user might
  pick instead of ``SemaphoreRunner``.

Every one opens one session per op (``async with sessions() as session: await op_async(session,
op); await session.commit()``, or its sync twin), with ``expire_on_commit=False``, on an engine of
``pool_size=L, max_overflow=0`` and fresh tables, so that it sends the same statements as the runners.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker
from sqlalchemy.orm import Session, sessionmaker

from ..harness import Context, Probe
from ..scenario import MYSQL, POSTGRESQL, throughput_row
from ..workload import Op, op_async, op_sync

#: The post's chunk size, for the hand-written chunks of the MySQL pass.
CHUNK = 40


def run(ctx: Context) -> None:
    asyncio.run(measure_async(ctx, ctx.limit, ctx.ops))
    if ctx.db.kind == "mysql":
        asyncio.run(measure_window(ctx, ctx.limit, ctx.ops))
        asyncio.run(measure_chunks(ctx, CHUNK, ctx.ops, label=f"hand-chunks-{CHUNK}"))
    measure_threads(ctx, ctx.limit, ctx.ops)


async def timed_op(sessions: async_sessionmaker[AsyncSession], op: Op, p: Probe) -> float:
    """``op`` in a session of its own, committed: its latency; one tick of ``p``'s bar."""
    start = time.perf_counter()
    async with sessions() as session:
        await op_async(session, op)
        await session.commit()
    p.tick()
    return time.perf_counter() - start


def _settled(p: Probe, results: list[Any]) -> None:
    """Latencies and failures of ``asyncio.gather(..., return_exceptions=True)`` into the probe."""
    p.latencies = [r for r in results if isinstance(r, float)]
    p.failed = len(results) - len(p.latencies)


@contextlib.asynccontextmanager
async def async_probe(
    ctx: Context,
    limit: int,
    ops: list[Op],
    label: str,
    group: str,
    way: str,
    scenario: str = "hand-rolled",
    **settings: Any,
) -> AsyncIterator[tuple[async_sessionmaker[AsyncSession], Probe]]:
    """Fresh tables, an AsyncSession factory on a pool of ``limit``, and the open probe of one measurement."""
    ctx.reset()
    app = ctx.app_name(label)
    engine = ctx.db.async_engine(app, pool_size=limit)
    sessions = async_sessionmaker(engine, expire_on_commit=False)
    config = {
        "driver": ctx.db.async_driver,
        "limit": limit,
        "pool_size": limit,
        "max_overflow": 0,
        **settings,
    }
    try:
        probe = Probe(ctx, scenario, label, total=len(ops), app_name=app, group=group, config=config)
        probe.m.extra["note"] = f"{way}, AsyncSession, {ctx.db.async_driver}"
        async with probe as p:
            yield sessions, p
    finally:
        await engine.dispose()


@contextlib.contextmanager
def sync_probe(
    ctx: Context,
    limit: int,
    ops: list[Op],
    label: str,
    group: str,
    way: str,
    scenario: str = "hand-rolled-threads",
    **settings: Any,
) -> Iterator[tuple[sessionmaker[Session], Probe]]:
    """Fresh tables, a Session factory on a pool of ``limit``, and one measurement's probe, not yet open."""
    ctx.reset()
    app = ctx.app_name(label)
    engine = ctx.db.sync_engine(app, pool_size=limit, driver=ctx.db.thread_driver)
    sessions = sessionmaker(engine, expire_on_commit=False)
    config = {
        "driver": ctx.db.thread_driver,
        "limit": limit,
        "pool_size": limit,
        "max_overflow": 0,
        **settings,
    }
    probe = Probe(ctx, scenario, label, total=len(ops), app_name=app, group=group, config=config)
    probe.m.extra["note"] = way.format(driver=ctx.db.thread_driver)
    try:
        yield sessions, probe
    finally:
        engine.dispose()


async def measure_async(
    ctx: Context, limit: int, ops: list[Op], *, group: str = "main", label: str | None = None
) -> None:
    """Run ``ops`` through a task per op behind ``asyncio.Semaphore(limit)`` on fresh tables."""
    gate = asyncio.Semaphore(limit)

    async def one(sessions: async_sessionmaker[AsyncSession], op: Op, p: Probe) -> float:
        async with gate:
            return await timed_op(sessions, op, p)

    way, label = "a task per op behind asyncio.Semaphore(L)", label or f"hand-rolled (L={limit})"
    async with async_probe(ctx, limit, ops, label, group, way) as (sessions, p):
        tasks = [asyncio.create_task(one(sessions, op, p)) for op in ops]
        _settled(p, await asyncio.gather(*tasks, return_exceptions=True))


async def measure_window(
    ctx: Context, limit: int, ops: list[Op], *, group: str = "main", label: str | None = None
) -> None:
    """Run ``ops`` through L worker coroutines that pull from one shared iterator (a sliding window)."""
    latencies: list[float] = []
    failed = 0

    async def worker(sessions: async_sessionmaker[AsyncSession], todo: Iterator[Op], p: Probe) -> None:
        nonlocal failed
        for op in todo:
            start = time.perf_counter()
            try:
                async with sessions() as session:
                    await op_async(session, op)
                    await session.commit()
            except Exception:
                failed += 1
                continue
            p.tick()
            latencies.append(time.perf_counter() - start)

    way, label = "L worker coroutines pulling ops from one iterator", label or f"hand-window (L={limit})"
    async with async_probe(ctx, limit, ops, label, group, way) as (sessions, p):
        todo = iter(ops)
        await asyncio.gather(*(worker(sessions, todo, p) for _ in range(limit)))
        p.latencies, p.failed = latencies, failed


async def measure_chunks(
    ctx: Context, limit: int, ops: list[Op], *, group: str = "main", label: str | None = None
) -> None:
    """Run ``ops`` as ``asyncio.gather`` over each consecutive chunk of ``limit`` ops."""
    way, label = "asyncio.gather over each chunk of L ops", label or f"hand-chunks (L={limit})"
    async with async_probe(ctx, limit, ops, label, group, way, chunk_size=limit) as (sessions, p):
        results: list[Any] = []
        for i in range(0, len(ops), limit):
            chunk = ops[i : i + limit]
            results += await asyncio.gather(
                *(timed_op(sessions, op, p) for op in chunk), return_exceptions=True
            )
        _settled(p, results)


async def measure_aiometer(
    ctx: Context, limit: int, ops: list[Op], *, group: str = "main", label: str | None = None
) -> None:
    """Run ``ops`` through ``aiometer.run_on_each(fn, ops, max_at_once=limit)``."""
    import aiometer  # the bench extra's; imported here so that a missing one fails only this side

    label = label or f"aiometer (L={limit})"
    way = "aiometer.run_on_each(fn, ops, max_at_once=L)"
    latencies: list[float] = []
    async with async_probe(ctx, limit, ops, label, group, way, scenario="aiometer") as (sessions, p):

        async def one(op: Op) -> None:
            try:
                latencies.append(await timed_op(sessions, op, p))
            except Exception:
                p.failed += 1

        await aiometer.run_on_each(one, ops, max_at_once=limit)
        p.latencies = latencies


def _one_sync(session_factory: sessionmaker[Session], op: Op, p: Probe) -> float:
    start = time.perf_counter()
    with session_factory() as session:
        op_sync(session, op)
        session.commit()
    p.tick()
    return time.perf_counter() - start


def measure_threads(
    ctx: Context, limit: int, ops: list[Op], *, group: str = "main", label: str | None = None
) -> None:
    """Run ``ops`` through ``ThreadPoolExecutor(limit).map`` on fresh tables, no event loop."""
    label = label or f"hand-rolled-threads (L={limit})"
    way = "ThreadPoolExecutor(L).map with a Session per op, {driver}, no loop"
    with (
        sync_probe(ctx, limit, ops, label, group, way) as (sessions, probe),
        probe as p,
        ThreadPoolExecutor(limit, thread_name_prefix="hand-rolled") as pool,
    ):
        p.latencies = list(pool.map(_one_sync, [sessions] * len(ops), ops, [p] * len(ops)))


async def measure_run_in_executor(
    ctx: Context, limit: int, ops: list[Op], *, group: str = "main", label: str | None = None
) -> None:
    """Run ``ops`` as ``asyncio.gather`` over ``loop.run_in_executor`` on a ``ThreadPoolExecutor(limit)``."""
    label = label or f"hand-run-in-executor (L={limit})"
    way = "asyncio.gather over loop.run_in_executor(ThreadPoolExecutor(L), ...), {driver}"
    with sync_probe(ctx, limit, ops, label, group, way) as (sessions, probe):
        async with probe as p:
            loop = asyncio.get_running_loop()
            with ThreadPoolExecutor(limit, thread_name_prefix="hand-rolled") as pool:
                calls = (loop.run_in_executor(pool, _one_sync, sessions, op, p) for op in ops)
                _settled(p, await asyncio.gather(*calls, return_exceptions=True))


SCENARIO = throughput_row(
    "hand-rolled",
    run,
    "the runners' strategies by hand: gather + Semaphore, ThreadPoolExecutor (MySQL: + window, chunks)",
    seconds=20,
    databases=(POSTGRESQL, MYSQL),
)
