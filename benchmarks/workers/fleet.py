"""
One process of the ``fleet`` scenario: ``python -m benchmarks.workers.fleet CONFIG_JSON``.

It builds its own asyncpg engine and :class:`boundeddb.SemaphoreRunner`, warms the pool, prints
``ready``, waits for a line on stdin (so that every process of the fleet starts together), runs
its slice of the op sequence, and prints one JSON line: elapsed seconds, each unit's latency and
slot wait, and failures.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import sys
import time
from typing import Any

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine, async_sessionmaker, create_async_engine

from boundeddb import SemaphoreRunner, pgbouncer_engine_options

from ..workload import async_unit, make_ops


def _noop() -> None:
    pass


async def _warm(engine: AsyncEngine, n: int) -> None:
    async with contextlib.AsyncExitStack() as stack:
        for _ in range(n):
            conn = await stack.enter_async_context(engine.connect())
            await conn.execute(text("SELECT 1"))
            # End the transaction but keep the connection: behind a transaction-mode pooler an open
            # transaction holds a server connection, and the fleet's warm-ups would wait on each other.
            await conn.commit()


async def main(config: dict[str, Any]) -> dict[str, Any]:
    url, limit = config["url"], int(config["limit"])
    options: dict[str, Any] = pgbouncer_engine_options(url) if config["options"] else {}
    connect_args = options.setdefault("connect_args", {})
    connect_args["server_settings"] = {"application_name": config["app"]}
    engine = create_async_engine(url, pool_size=limit, max_overflow=0, pool_timeout=60, **options)
    ops = make_ops(config["total"], config["seed"])[config["start"] : config["start"] + config["count"]]
    try:
        await _warm(engine, limit)
        print("ready", flush=True)
        await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline)
        runner = SemaphoreRunner(
            async_sessionmaker(engine, expire_on_commit=False), limit=limit, errors="collect"
        )
        started = time.perf_counter()
        async with runner:
            report = await runner.run([async_unit(op, _noop) for op in ops])
        elapsed = time.perf_counter() - started
    finally:
        await engine.dispose()
    failed = [o for o in report.outcomes if not o.ok]
    return {
        "elapsed_s": elapsed,
        "latencies": [round(o.latency_s, 6) for o in report.outcomes if o.ok],
        "waits": [round(o.wait_s, 6) for o in report.outcomes if o.ok],
        "failed": len(failed),
        "first_error": next((f"{type(o.error).__name__}: {o.error}"[:300] for o in failed), None),
    }


if __name__ == "__main__":
    print(json.dumps(asyncio.run(main(json.loads(sys.argv[1])))), flush=True)
