"""
``memory``: a million trivial units through ``SemaphoreRunner.stream()`` in O(limit) memory.

The post's scripts create every coroutine (or task) up front, so memory grows with N.  Here
1,000,000 ``SELECT 1`` units (``--memory-units``; fewer in the default suite) come from a
generator and their outcomes are consumed as they complete; the sampler records this process's
peak RSS growth over the run.  Latencies are kept in a fixed-size reservoir so that the
benchmark itself does not grow.
"""

from __future__ import annotations

import asyncio
import gc
from collections.abc import Iterator
from typing import Any

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from boundeddb import SemaphoreRunner

from ..harness import Context, Probe
from ..scenario import Scenario
from ..stats import Reservoir

SELECT_1 = text("SELECT 1")


async def select_one(session: AsyncSession) -> Any:
    return (await session.execute(SELECT_1)).scalar()


def units(n: int) -> Iterator[Any]:
    for _ in range(n):
        yield select_one


def run(ctx: Context) -> None:
    asyncio.run(_main(ctx))


async def _main(ctx: Context) -> None:
    n, limit = ctx.memory_units, ctx.limit
    label = f"memory stream() x{n:,} (L={limit})"
    app = ctx.app_name("memory")
    engine = ctx.db.async_engine(app, pool_size=limit)
    sessions = async_sessionmaker(engine, expire_on_commit=False)
    config = {"driver": "asyncpg", "limit": limit, "pool_size": limit, "units": n}
    reservoir = Reservoir(seed=ctx.seed)
    gc.collect()
    try:
        async with (
            SemaphoreRunner(sessions, limit=limit, errors="collect") as runner,
            Probe(ctx, "memory", label, total=n, app_name=app, group="memory", config=config) as p,
        ):
            p.latencies = reservoir.values
            ok = 0
            async for outcome in runner.stream(units(n)):
                if outcome.error is None:
                    ok += 1
                    reservoir.add(outcome.latency_s)
                elif "first_error" not in p.m.extra:
                    p.m.extra["first_error"] = repr(outcome.error)[:300]
                p.tick()
            p.succeeded, p.failed = ok, n - ok
    finally:
        await engine.dispose()


SCENARIO = Scenario(
    name="memory",
    run=run,
    what="SELECT 1 units from a generator through stream() (50,000; 1,000,000 at --n 35000): RSS growth",
    section="Memory",
    seconds=25,
)
