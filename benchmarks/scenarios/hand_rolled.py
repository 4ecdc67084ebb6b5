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
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession, async_sessionmaker
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


def _async_setup(
    ctx: Context, limit: int, label: str
) -> tuple[str, AsyncEngine, async_sessionmaker[AsyncSession], dict[str, Any]]:
    """Fresh tables, then the engine, sessionmaker and config of one async measurement."""
    ctx.reset()
    app = ctx.app_name(label)
    engine = ctx.db.async_engine(app, pool_size=limit)
    sessions = async_sessionmaker(engine, expire_on_commit=False)
    config = {"driver": ctx.db.async_driver, "limit": limit, "pool_size": limit, "max_overflow": 0}
    return app, engine, sessions, config


def _sync_setup(
    ctx: Context, limit: int, label: str
) -> tuple[str, Any, sessionmaker[Session], dict[str, Any]]:
    """Fresh tables, then the engine, sessionmaker and config of one thread measurement."""
    ctx.reset()
    app = ctx.app_name(label)
    engine = ctx.db.sync_engine(app, pool_size=limit, driver=ctx.db.thread_driver)
    sessions = sessionmaker(engine, expire_on_commit=False)
    config = {"driver": ctx.db.thread_driver, "limit": limit, "pool_size": limit, "max_overflow": 0}
    return app, engine, sessions, config


async def measure_async(
    ctx: Context, limit: int, ops: list[Op], *, group: str = "main", label: str | None = None
) -> None:
    """Run ``ops`` through a task per op behind ``asyncio.Semaphore(limit)`` on fresh tables."""
    label = label or f"hand-rolled (L={limit})"
    app, engine, sessions, config = _async_setup(ctx, limit, label)
    gate = asyncio.Semaphore(limit)

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
        probe.m.extra["note"] = (
            f"a task per op behind asyncio.Semaphore(L), AsyncSession, {ctx.db.async_driver}"
        )
        async with probe as p:
            tasks = [asyncio.create_task(one(sessions, op, p)) for op in ops]
            results = await asyncio.gather(*tasks, return_exceptions=True)
            p.latencies = [r for r in results if isinstance(r, float)]
            p.failed = len(results) - len(p.latencies)
    finally:
        await engine.dispose()


async def measure_window(
    ctx: Context, limit: int, ops: list[Op], *, group: str = "main", label: str | None = None
) -> None:
    """Run ``ops`` through L worker coroutines that pull from one shared iterator (a sliding window)."""
    label = label or f"hand-window (L={limit})"
    app, engine, sessions, config = _async_setup(ctx, limit, label)
    latencies: list[float] = []
    failed = 0

    async def worker(todo: Iterator[Op], p: Probe) -> None:
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

    try:
        probe = Probe(ctx, "hand-rolled", label, total=len(ops), app_name=app, group=group, config=config)
        probe.m.extra["note"] = (
            f"L worker coroutines pulling ops from one iterator, AsyncSession, {ctx.db.async_driver}"
        )
        async with probe as p:
            todo = iter(ops)
            await asyncio.gather(*(worker(todo, p) for _ in range(limit)))
            p.latencies, p.failed = latencies, failed
    finally:
        await engine.dispose()


async def measure_chunks(
    ctx: Context, limit: int, ops: list[Op], *, group: str = "main", label: str | None = None
) -> None:
    """Run ``ops`` as ``asyncio.gather`` over each consecutive chunk of ``limit`` ops."""
    label = label or f"hand-chunks (L={limit})"
    app, engine, sessions, config = _async_setup(ctx, limit, label)
    config["chunk_size"] = limit

    async def one(op: Op, p: Probe) -> float:
        start = time.perf_counter()
        async with sessions() as session:
            await op_async(session, op)
            await session.commit()
        p.tick()
        return time.perf_counter() - start

    try:
        probe = Probe(ctx, "hand-rolled", label, total=len(ops), app_name=app, group=group, config=config)
        probe.m.extra["note"] = (
            f"asyncio.gather over each chunk of L ops, AsyncSession, {ctx.db.async_driver}"
        )
        async with probe as p:
            results: list[Any] = []
            for i in range(0, len(ops), limit):
                chunk = ops[i : i + limit]
                results += await asyncio.gather(*(one(op, p) for op in chunk), return_exceptions=True)
            p.latencies = [r for r in results if isinstance(r, float)]
            p.failed = len(results) - len(p.latencies)
    finally:
        await engine.dispose()


async def measure_aiometer(
    ctx: Context, limit: int, ops: list[Op], *, group: str = "main", label: str | None = None
) -> None:
    """Run ``ops`` through ``aiometer.run_on_each(fn, ops, max_at_once=limit)``."""
    import aiometer  # the bench extra's; imported here so that a missing one fails only this side

    label = label or f"aiometer (L={limit})"
    app, engine, sessions, config = _async_setup(ctx, limit, label)
    probe = Probe(ctx, "aiometer", label, total=len(ops), app_name=app, group=group, config=config)
    probe.m.extra["note"] = (
        f"aiometer.run_on_each(fn, ops, max_at_once=L), AsyncSession, {ctx.db.async_driver}"
    )
    latencies: list[float] = []
    failed = 0

    async def one(op: Op) -> None:
        nonlocal failed
        start = time.perf_counter()
        try:
            async with sessions() as session:
                await op_async(session, op)
                await session.commit()
        except Exception:
            failed += 1
            return
        probe.tick()
        latencies.append(time.perf_counter() - start)

    try:
        async with probe as p:
            await aiometer.run_on_each(one, ops, max_at_once=limit)
            p.latencies, p.failed = latencies, failed
    finally:
        await engine.dispose()


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
    app, engine, sessions, config = _sync_setup(ctx, limit, label)
    try:
        probe = Probe(
            ctx, "hand-rolled-threads", label, total=len(ops), app_name=app, group=group, config=config
        )
        probe.m.extra["note"] = (
            f"ThreadPoolExecutor(L).map with a Session per op, {ctx.db.thread_driver}, no loop"
        )
        with probe as p, ThreadPoolExecutor(limit, thread_name_prefix="hand-rolled") as pool:
            p.latencies = list(pool.map(_one_sync, [sessions] * len(ops), ops, [p] * len(ops)))
    finally:
        engine.dispose()


async def measure_run_in_executor(
    ctx: Context, limit: int, ops: list[Op], *, group: str = "main", label: str | None = None
) -> None:
    """Run ``ops`` as ``asyncio.gather`` over ``loop.run_in_executor`` on a ``ThreadPoolExecutor(limit)``."""
    label = label or f"hand-run-in-executor (L={limit})"
    app, engine, sessions, config = _sync_setup(ctx, limit, label)
    try:
        probe = Probe(
            ctx, "hand-rolled-threads", label, total=len(ops), app_name=app, group=group, config=config
        )
        probe.m.extra["note"] = (
            f"asyncio.gather over loop.run_in_executor(ThreadPoolExecutor(L), ...), {ctx.db.thread_driver}"
        )
        async with probe as p:
            loop = asyncio.get_running_loop()
            with ThreadPoolExecutor(limit, thread_name_prefix="hand-rolled") as pool:
                results = await asyncio.gather(
                    *(loop.run_in_executor(pool, _one_sync, sessions, op, p) for op in ops),
                    return_exceptions=True,
                )
            p.latencies = [r for r in results if isinstance(r, float)]
            p.failed = len(results) - len(p.latencies)
    finally:
        engine.dispose()


SCENARIO = throughput_row(
    "hand-rolled",
    run,
    "the runners' strategies by hand: gather + Semaphore, ThreadPoolExecutor (MySQL: + window, chunks)",
    seconds=35,
    databases=(POSTGRESQL, MYSQL),
)
