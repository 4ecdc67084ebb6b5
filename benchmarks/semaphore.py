"""
``semaphore``: ``boundeddb.SemaphoreRunner(limit=L)``, a sliding window of L async units.

The post's chunks of 40 leave connections idle while a chunk waits for its slowest unit; a
sliding window starts the next unit as soon as any finishes, so L connections stay busy.
"""

from __future__ import annotations

import asyncio

from sqlalchemy.ext.asyncio import async_sessionmaker

from boundeddb import SemaphoreRunner

from ._harness import Context, Probe
from ._library import record
from ._workload import Op, async_unit


def run(ctx: Context) -> None:
    asyncio.run(measure(ctx, ctx.limit, ctx.ops))


async def measure(
    ctx: Context, limit: int, ops: list[Op], *, group: str = "main", label: str | None = None
) -> None:
    """Run ``ops`` through a SemaphoreRunner of ``limit`` on fresh tables."""
    ctx.reset()
    label = label or f"semaphore (L={limit})"
    app = ctx.app_name(label)
    engine = ctx.db.async_engine(app, pool_size=limit)
    sessions = async_sessionmaker(engine, expire_on_commit=False)
    config = {"driver": "asyncpg", "limit": limit, "pool_size": limit, "max_overflow": 0}
    try:
        async with (
            SemaphoreRunner(sessions, limit=limit, errors="collect") as runner,
            Probe(ctx, "semaphore", label, total=len(ops), app_name=app, group=group, config=config) as p,
        ):
            units = [async_unit(op, p.tick) for op in ops]
            record(p, await runner.run(units))
    finally:
        await engine.dispose()
