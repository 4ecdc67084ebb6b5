"""
The loop-lag scenario's load generator, run as a separate process (its own GIL).

``python _loadgen.py BASE_URL REQUESTS CONCURRENCY N_OPS`` sends REQUESTS requests to
``BASE_URL/db/{i}`` from CONCURRENCY workers, and one ``/ping`` every 20 ms meanwhile, then
prints one JSON object: DB and ping latencies, errors and elapsed time.  Every loop is bounded in
count and by a deadline, and it only talks to the loopback address it is given.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import sys
import time
from typing import Any

import httpx

PING_INTERVAL_S = 0.02
DEADLINE_S = 300.0


async def main(base: str, requests: int, concurrency: int, n_ops: int) -> dict[str, Any]:
    if not base.startswith("http://127.0.0.1:"):
        raise SystemExit(f"refusing a non-loopback target: {base}")
    counter = itertools.count()
    db: list[float] = []
    ping: list[float] = []
    errors: list[str] = []
    deadline = time.perf_counter() + DEADLINE_S
    done = asyncio.Event()
    limits = httpx.Limits(max_connections=concurrency + 1, max_keepalive_connections=concurrency + 1)
    async with httpx.AsyncClient(base_url=base, limits=limits, timeout=120.0) as client:
        await client.get("/ping")  # connect once before timing

        async def worker() -> None:
            while time.perf_counter() < deadline:
                i = next(counter)
                if i >= requests:
                    return
                start = time.perf_counter()
                try:
                    response = await client.get(f"/db/{i % n_ops}")
                    response.raise_for_status()
                except httpx.HTTPError as exc:
                    errors.append(repr(exc)[:200])
                else:
                    db.append(time.perf_counter() - start)

        async def pinger() -> None:
            while not done.is_set() and time.perf_counter() < deadline:
                start = time.perf_counter()
                try:
                    (await client.get("/ping")).raise_for_status()
                except httpx.HTTPError as exc:
                    errors.append(repr(exc)[:200])
                else:
                    ping.append(time.perf_counter() - start)
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(done.wait(), PING_INTERVAL_S)

        started = time.perf_counter()
        ping_task = asyncio.create_task(pinger())
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        elapsed = time.perf_counter() - started
        done.set()
        await ping_task
    return {
        "db_latencies": db,
        "ping_latencies": ping,
        "db_ok": len(db),
        "errors": len(errors),
        "first_error": errors[0] if errors else None,
        "elapsed_s": elapsed,
    }


if __name__ == "__main__":
    base_url, n_requests, n_workers, ops = sys.argv[1], *map(int, sys.argv[2:5])
    print(json.dumps(asyncio.run(main(base_url, n_requests, n_workers, ops))))
