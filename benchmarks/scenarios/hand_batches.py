"""
Hand-written batch loops on the post's ops: the yardsticks of the ``overhead`` scenario's batch pairs.

Issue #33's goal is that the library's batches reach at least 0.95 of a hand-written loop at the
same size.  The ``batching`` scenario compares throughput on its own workloads
(:func:`benchmarks.scenarios._batching.hand_async` and ``hand_threads``); these are the same loops
on the post's op sequence, with the plumbing of :mod:`.hand_rolled` (fresh tables, a pool of L,
``expire_on_commit=False``, a probe, one ``p.tick()`` per op), so that ``overhead`` and
``instructions`` measure them beside the runners with ``batch=BATCH``:

* :func:`measure_window`: L worker coroutines, each taking ``BATCH`` ops at a time from one shared
  iterator and running them one after another in one AsyncSession, committed once (asyncpg: what
  ``SemaphoreRunner(limit=L, batch=BATCH)`` does when no unit fails);
* :func:`measure_threads`: ``ThreadPoolExecutor(L)``, L threads each taking ``BATCH`` ops at a time
  from one shared iterator under a lock, in one Session, committed once, no event loop (psycopg:
  what ``ThreadOffloadRunner(limit=L, batch=BATCH).run_sync`` does when no unit fails).

Neither isolates a failing op: a batch that raises is counted as failed as a whole (the library's
failure handling is the ``batching`` scenario's subject, not this one's).  Every op of a batch gets
the batch's time, from taking it to its COMMIT, as its latency.
"""

from __future__ import annotations

import asyncio
import itertools
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker
from sqlalchemy.orm import Session, sessionmaker

from ..harness import Context, Probe
from ..workload import Op, op_async, op_sync
from .hand_rolled import async_probe, sync_probe

#: Ops per transaction on both sides of the batch pairs.
BATCH = 50
#: The rows' ``scenario``.
SCENARIO_NAME = "hand-batches"


async def measure_window(
    ctx: Context, limit: int, ops: list[Op], *, group: str = "main", label: str | None = None
) -> None:
    """Run ``ops`` through L worker coroutines that take ``BATCH`` at a time from one shared iterator."""
    latencies: list[float] = []
    failed = 0

    async def worker(sessions: async_sessionmaker[AsyncSession], todo: Iterator[Op], p: Probe) -> None:
        nonlocal failed
        while batch := list(itertools.islice(todo, BATCH)):
            start = time.perf_counter()
            try:
                async with sessions() as session:
                    for op in batch:
                        await op_async(session, op)
                    await session.commit()
            except Exception:
                failed += len(batch)
                continue
            for _ in batch:
                p.tick()
            latencies.extend([time.perf_counter() - start] * len(batch))

    way = f"L worker coroutines taking {BATCH} ops at a time from one iterator, one commit each"
    label = label or f"hand-batch-window (L={limit}, batch={BATCH})"
    async with async_probe(ctx, limit, ops, label, group, way, SCENARIO_NAME, batch=BATCH) as (sessions, p):
        todo = iter(ops)
        await asyncio.gather(*(worker(sessions, todo, p) for _ in range(limit)))
        p.latencies, p.failed = latencies, failed


def measure_threads(
    ctx: Context, limit: int, ops: list[Op], *, group: str = "main", label: str | None = None
) -> None:
    """Run ``ops`` through L threads that take ``BATCH`` at a time from one shared iterator, no event loop."""
    latencies: list[float] = []
    failed = 0
    lock = threading.Lock()

    def worker(sessions: sessionmaker[Session], todo: Iterator[Op], p: Probe) -> None:
        nonlocal failed
        while True:
            with lock:
                batch = list(itertools.islice(todo, BATCH))
            if not batch:
                return
            start = time.perf_counter()
            try:
                with sessions() as session:
                    for op in batch:
                        op_sync(session, op)
                    session.commit()
            except Exception:
                with lock:
                    failed += len(batch)
                continue
            elapsed = time.perf_counter() - start
            with lock:
                for _ in batch:
                    p.tick()
                latencies.extend([elapsed] * len(batch))

    label = label or f"hand-batch-threads (L={limit}, batch={BATCH})"
    way = f"ThreadPoolExecutor(L), L threads taking {BATCH} ops at a time under a lock, one commit each, "
    way += "{driver}, no loop"
    with (
        sync_probe(ctx, limit, ops, label, group, way, SCENARIO_NAME, batch=BATCH) as (sessions, probe),
        probe as p,
        ThreadPoolExecutor(limit, thread_name_prefix="hand-batch") as pool,
    ):
        todo = iter(ops)
        for future in [pool.submit(worker, sessions, todo, p) for _ in range(limit)]:
            future.result()
        p.latencies, p.failed = latencies, failed
