"""
``semaphore``: ``boundeddb.SemaphoreRunner(limit=L)``, a sliding window of L async units.

The post's chunks of 40 leave connections idle while a chunk waits for its slowest unit; a
sliding window starts the next unit as soon as any finishes, so L connections stay busy.  On
asyncpg; with ``--database mysql`` on aiomysql (``semaphore``) and on asyncmy (``semaphore-asyncmy``).
``semaphore-batch50`` is the same runner with ``batch=50``: up to 50 of the post's operations in one
transaction (the ``batching`` scenario studies sizes and failures).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any, Literal

from sqlalchemy.ext.asyncio import async_sessionmaker

from boundeddb import SemaphoreRunner

from ..harness import Context, Probe
from ..scenario import MYSQL, POSTGRESQL, throughput_row
from ..workload import Op, async_unit
from ._runner import pool_config, record


def run(ctx: Context) -> None:
    asyncio.run(measure(ctx, ctx.limit, ctx.ops))


def run_batch50(ctx: Context) -> None:
    """The same with ``batch=50``."""
    label = f"semaphore batch=50 (L={ctx.limit})"
    asyncio.run(measure(ctx, ctx.limit, ctx.ops, label=label, scenario="semaphore-batch50", batch=50))


def run_asyncmy(ctx: Context) -> None:
    """The same on asyncmy (MySQL/MariaDB only)."""
    label = f"semaphore-asyncmy (L={ctx.limit})"
    asyncio.run(measure(ctx, ctx.limit, ctx.ops, label=label, driver="asyncmy", scenario="semaphore-asyncmy"))


@contextlib.asynccontextmanager
async def probed_runner(
    ctx: Context,
    limit: int | Literal["auto"],
    label: str,
    *,
    total: int,
    group: str,
    capacity: int | None = None,
    extra: dict[str, Any] | None = None,
    driver: str | None = None,
    scenario: str = "semaphore",
    runner_bar: bool = False,
    batch: int | None = None,
) -> AsyncIterator[tuple[SemaphoreRunner, Probe]]:
    """
    A SemaphoreRunner of ``limit`` on a pool of ``capacity`` connections (default: the limit;
    ``limit="auto"`` needs it, and gets ``pool_use_lifo=True``) of ``driver`` (default: the
    database's async driver, asyncpg on PostgreSQL), under a Probe; the engine is disposed of
    afterwards. ``runner_bar``: the run will draw the scenario's progress bar itself
    (``progress=p.runner_progress()``), not the probe.
    """
    app = ctx.app_name(label)
    driver = driver or ctx.db.async_driver
    bar = not runner_bar
    config = {**pool_config(limit, capacity, driver), **({"batch": batch} if batch else {}), **(extra or {})}
    engine = ctx.db.async_engine(
        app, pool_size=config["pool_size"], driver=driver, pool_use_lifo=config["pool_use_lifo"]
    )
    sessions = async_sessionmaker(engine, expire_on_commit=False)
    try:
        async with (
            SemaphoreRunner(sessions, limit=limit, errors="collect", batch=batch) as runner,
            Probe(ctx, scenario, label, total=total, app_name=app, group=group, config=config, bar=bar) as p,
        ):
            yield runner, p
    finally:
        await engine.dispose()


async def measure(
    ctx: Context,
    limit: int | Literal["auto"],
    ops: list[Op],
    *,
    group: str = "main",
    label: str | None = None,
    capacity: int | None = None,
    extra: dict[str, Any] | None = None,
    driver: str | None = None,
    scenario: str = "semaphore",
    batch: int | None = None,
) -> None:
    """Run ``ops`` through a SemaphoreRunner of ``limit`` on fresh tables (see :func:`probed_runner`)."""
    ctx.reset()
    label = label or f"semaphore (L={limit})"
    cm = probed_runner(
        ctx, limit, label, total=len(ops), group=group, capacity=capacity, extra=extra, driver=driver,
        scenario=scenario, runner_bar=True, batch=batch,
    )  # fmt: skip
    async with cm as (runner, p):
        units = [async_unit(op) for op in ops]
        record(p, await runner.run(units, progress=p.runner_progress()))


SCENARIO = throughput_row(
    "semaphore",
    run,
    "SemaphoreRunner(limit=L) (asyncpg; aiomysql on MySQL)",
    seconds=12,
    databases=(POSTGRESQL, MYSQL),
)
BATCH50 = throughput_row(
    "semaphore-batch50", run_batch50, "SemaphoreRunner(limit=L, batch=50) (asyncpg)", seconds=12
)
ASYNCMY = throughput_row(
    "semaphore-asyncmy", run_asyncmy, "SemaphoreRunner(limit=L) on asyncmy", seconds=20, databases=(MYSQL,)
)
