"""
``raw-asyncpg``: the same statements on a raw asyncpg pool, window of L, no ORM: the ceiling.

Each op sends what the ORM sends (see ``RAW_*`` below): a create inserts 3 ``a`` rows
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

from ..db.schema import SCHEMA
from ..harness import Context, Probe
from ..scenario import throughput_row
from ..workload import Op

# The statements the ORM sends, written out for the raw asyncpg scenario.
RAW_INSERT_A = f"INSERT INTO {SCHEMA}.a (data) VALUES ($1), ($2), ($3) RETURNING id, create_date"
RAW_INSERT_B = (
    f"INSERT INTO {SCHEMA}.b (a_id, data)"
    " VALUES ($1, NULL), ($1, NULL), ($2, NULL), ($3, NULL), ($3, NULL) RETURNING id"
)
RAW_READ_A = f"SELECT id, data, create_date FROM {SCHEMA}.a LIMIT $1"


def raw_read_b(k: int) -> str:
    """The selectinload query for ``k`` parent ids (the ORM expands IN to k parameters)."""
    params = ", ".join(f"${i}" for i in range(1, k + 1))
    return f"SELECT a_id, id, data FROM {SCHEMA}.b WHERE a_id IN ({params})"


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


SCENARIO = throughput_row(
    "raw-asyncpg", run, "the same statements on a raw asyncpg pool, no ORM: the ceiling", seconds=5
)
