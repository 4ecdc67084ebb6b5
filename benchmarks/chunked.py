"""
``chunked``: the post's "Async story two" — ``asyncio.gather`` over chunks of 40.

Reproduces the post's chunked script (102 s there, the fastest of its three) with
``boundeddb.ChunkedRunner(chunk_size=40)``: 40 units start together and the next chunk waits
for the slowest of them (a barrier), so connections sit idle at the end of every chunk.
"""

from __future__ import annotations

import asyncio

from sqlalchemy.ext.asyncio import async_sessionmaker

from boundeddb import ChunkedRunner

from ._harness import Context, Probe
from ._library import record
from ._workload import async_unit

CHUNK = 40


def run(ctx: Context) -> None:
    asyncio.run(_main(ctx))


async def _main(ctx: Context) -> None:
    ctx.reset()
    app = ctx.app_name("chunked")
    engine = ctx.db.async_engine(app, pool_size=CHUNK)
    sessions = async_sessionmaker(engine, expire_on_commit=False)
    config = {"driver": "asyncpg", "chunk_size": CHUNK, "pool_size": CHUNK, "max_overflow": 0}
    label = f"chunked-{CHUNK}"
    try:
        async with (
            ChunkedRunner(sessions, chunk_size=CHUNK, errors="collect") as runner,
            Probe(ctx, "chunked", label, total=len(ctx.ops), app_name=app, config=config) as p,
        ):
            units = [async_unit(op, p.tick) for op in ctx.ops]
            record(p, await runner.run(units))
    finally:
        await engine.dispose()
