"""
``raw-asyncpg``: the same statements on a raw asyncpg pool, window of L, no ORM: the ceiling.

Each op sends what the ORM sends (see ``_workload.RAW_*``): a create inserts 3 ``a`` rows
returning id and create_date and then 5 ``b`` rows in one transaction; a read selects 10 ``a``
rows and their ``b`` rows by ``a_id IN (...)``.  L worker coroutines pull ops from one
iterator and acquire a pooled connection per op, so it is the same sliding window.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from typing import Any

import asyncpg

from ._harness import Context, Probe
from ._workload import RAW_INSERT_A, RAW_INSERT_B, RAW_READ_A, Op, raw_read_b


def run(ctx: Context) -> None:
    asyncio.run(_main(ctx))


async def _op(conn: Any, op: Op) -> int:
    if op.kind == "create":
        async with conn.transaction():
            rows = await conn.fetch(RAW_INSERT_A, *(str(op.data + i) for i in (1, 2, 3)))
            await conn.fetch(RAW_INSERT_B, *(row["id"] for row in rows))
        return 3
    async with conn.transaction():
        parents = await conn.fetch(RAW_READ_A, 10)
        ids = [row["id"] for row in parents]
        children = await conn.fetch(raw_read_b(len(ids)), *ids) if ids else []
    return sum(row["id"] for row in children)


async def _main(ctx: Context) -> None:
    ctx.reset()
    limit = ctx.limit
    label = f"raw-asyncpg (L={limit})"
    app = ctx.app_name(label)
    pool = await asyncpg.create_pool(
        ctx.db.libpq_dsn(),
        min_size=0,
        max_size=limit,
        server_settings={"application_name": app},
    )
    config = {"driver": "asyncpg (no ORM)", "limit": limit, "pool_max_size": limit}
    latencies: list[float] = []

    async def worker(ops: Iterator[Op], p: Probe) -> None:
        for op in ops:
            start = time.perf_counter()
            async with pool.acquire() as conn:
                await _op(conn, op)
            latencies.append(time.perf_counter() - start)
            p.tick()

    try:
        probe = Probe(ctx, "raw-asyncpg", label, total=len(ctx.ops), app_name=app, config=config)
        async with probe as p:
            p.latencies = latencies
            shared = iter(ctx.ops)
            await asyncio.gather(*(worker(shared, p) for _ in range(limit)))
    finally:
        await pool.close()
