"""
``chunked``: the post's "Async story two" — ``asyncio.gather`` over chunks of 40.

Reproduces the post's chunked script (102 s there, the fastest of its three) with
``boundeddb.ChunkedRunner(chunk_size=40)``: 40 units start together and the next chunk waits
for the slowest of them (a barrier), so connections sit idle at the end of every chunk.  On
asyncpg, or with ``--database mysql`` on aiomysql.
"""

from __future__ import annotations

import asyncio

from sqlalchemy.ext.asyncio import async_sessionmaker

from boundeddb import ChunkedRunner

from ..harness import Context, Probe
from ..scenario import MYSQL, POSTGRESQL, throughput_row
from ..workload import Op, async_unit
from ._runner import record

CHUNK = 40


def run(ctx: Context) -> None:
    asyncio.run(measure(ctx, CHUNK, ctx.ops, label=f"chunked-{CHUNK}"))


async def measure(
    ctx: Context, chunk: int, ops: list[Op], *, group: str = "main", label: str | None = None
) -> None:
    """Run ``ops`` through a ChunkedRunner of ``chunk_size=chunk`` on fresh tables (pool_size=chunk)."""
    ctx.reset()
    label = label or f"chunked-{chunk}"
    app = ctx.app_name(label)
    engine = ctx.db.async_engine(app, pool_size=chunk)
    sessions = async_sessionmaker(engine, expire_on_commit=False)
    config = {"driver": ctx.db.async_driver, "chunk_size": chunk, "pool_size": chunk, "max_overflow": 0}
    try:
        async with (
            ChunkedRunner(sessions, chunk_size=chunk, errors="collect") as runner,
            Probe(
                ctx, "chunked", label, total=len(ops), app_name=app, group=group, config=config, bar=False
            ) as p,
        ):
            units = [async_unit(op) for op in ops]
            record(p, await runner.run(units, progress=p.runner_progress()))
    finally:
        await engine.dispose()


SCENARIO = throughput_row(
    "chunked",
    run,
    "the post's second async script: ChunkedRunner with chunks of 40",
    seconds=12,
    databases=(POSTGRESQL, MYSQL),
)
