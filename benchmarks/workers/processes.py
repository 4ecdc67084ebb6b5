"""
What the ``processes`` scenario's spawned processes import by name: its unit functions and the
hand-written pool's task.

:class:`boundeddb.ProcessRunner`'s workers (local processes, or tasks on a Dask LocalCluster) and
the hand-written ``ProcessPoolExecutor``'s processes are started with ``spawn``: each is a new
interpreter that imports this module (and the workload's) to find the function it is given, so
this module imports only what the units need.  The schema comes from ``$BOUNDEDDB_BENCH_SCHEMA``,
which spawned processes inherit.

Every unit runs the post's op (:func:`benchmarks.workload.op_async` or ``op_sync``) and returns
when it started and in which process: ``CLOCK_MONOTONIC`` is one clock for every process of a
Linux machine, so the scenario reads from the values how long its side took to start its first
unit, and how the units spread over the processes.
"""

from __future__ import annotations

import asyncio
import os
import time
from typing import Any

from sqlalchemy.engine import URL
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker, create_async_engine
from sqlalchemy.orm import Session

from boundeddb import RunReport, SemaphoreRunner

from ..workload import Op, op_async, op_sync

#: A unit's value: when it started (``time.monotonic()``, CLOCK_MONOTONIC) and its process's id.
Started = tuple[float, int]


async def timed_async(session: AsyncSession, op: Op) -> Started:
    """The post's op on an AsyncSession; when it started and where."""
    started = time.monotonic()
    await op_async(session, op)
    return started, os.getpid()


def timed_sync(session: Session, op: Op) -> Started:
    """The post's op on a Session; when it started and where."""
    started = time.monotonic()
    op_sync(session, op)
    return started, os.getpid()


def summary(report: RunReport[Started]) -> dict[str, Any]:
    """What the scenario keeps of a report: the units' start values and latencies, the failures."""
    done = [o for o in report.outcomes if o.error is None]
    failed = [o for o in report.outcomes if o.error is not None]
    return {
        "starts": [o.value for o in done],
        "latencies": [o.latency_s for o in done],
        "failed": len(failed),
        "first_error": next((repr(o.error)[:300] for o in failed), None),
    }


async def _share(url: URL, options: dict[str, Any], share: int, ops: list[Op]) -> dict[str, Any]:
    engine = create_async_engine(url, pool_size=share, max_overflow=0, **options)
    try:
        async with SemaphoreRunner(async_sessionmaker(engine), limit=share, errors="collect") as runner:
            report = await runner.map(timed_async, ops)
    finally:
        await engine.dispose()
    return summary(report)


def hand_written_share(url: URL, options: dict[str, Any], share: int, ops: list[Op]) -> dict[str, Any]:
    """
    One process of the hand-written pool: an asyncpg engine of ``share`` connections and a
    ``SemaphoreRunner(limit=share)`` over its part of the ops, as each ProcessRunner worker has;
    :func:`summary` of its report.
    """
    return asyncio.run(_share(url, options, share, ops))
