"""
The web scenarios' load generators and pinger, each run as a process of its own (its own GIL).

``python -m benchmarks.workers.loadgen db BASE_URL REQUESTS CONCURRENCY N_OPS [DEADLINE_S]`` sends REQUESTS
requests (or as many as it can before DEADLINE_S seconds) to ``BASE_URL/db/{i}`` from
CONCURRENCY workers, each with its own ``httpx.AsyncClient`` and
keep-alive connection (one client shared by 50 workers spends most of its CPU in its own pool).
``... loadgen ping BASE_URL`` sends one ``/ping`` at a time, 20 ms apart, with a sync
``httpx.Client``, until its standard input closes.  ``... loadgen burst BASE_URL PATH N``
is post 004's ``run_test.py``: N requests to PATH and N to ``/ping``, all at once (the
``post-004`` scenario).

Both connect, print ``ready``, wait for a ``go`` line on standard input, then work and print one
JSON object.  Every loop is bounded in count and by a deadline, and they only talk to the
loopback address they are given.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import select
import sys
import time
from typing import Any

import httpx

PING_INTERVAL_S = 0.02
DEADLINE_S = 600.0


def _check(base: str) -> None:
    if not base.startswith("http://127.0.0.1:"):
        raise SystemExit(f"refusing a non-loopback target: {base}")


def _handshake() -> None:
    print("ready", flush=True)
    if sys.stdin.readline().strip() != "go":
        raise SystemExit("no go")


async def db(
    base: str, requests: int, concurrency: int, n_ops: int, deadline_s: float = DEADLINE_S
) -> dict[str, Any]:
    counter = itertools.count()
    latencies: list[float] = []
    errors: list[str] = []
    clients = [httpx.AsyncClient(base_url=base, timeout=120.0) for _ in range(concurrency)]
    try:
        await asyncio.gather(*(c.get("/ping") for c in clients))  # connect before timing
        _handshake()

        async def worker(client: httpx.AsyncClient) -> None:
            while time.perf_counter() < deadline:
                i = next(counter)
                if i >= requests:
                    return
                start = time.perf_counter()
                try:
                    (await client.get(f"/db/{i % n_ops}")).raise_for_status()
                except httpx.HTTPError as exc:
                    errors.append(repr(exc)[:200])
                else:
                    latencies.append(time.perf_counter() - start)

        started, cpu0 = time.perf_counter(), time.process_time()
        deadline = started + min(deadline_s, DEADLINE_S)
        await asyncio.gather(*(worker(c) for c in clients))
        elapsed, cpu = time.perf_counter() - started, time.process_time() - cpu0
    finally:
        await asyncio.gather(*(c.aclose() for c in clients))
    return {
        "db_latencies": latencies,
        "db_ok": len(latencies),
        "errors": len(errors),
        "first_error": errors[0] if errors else None,
        "elapsed_s": elapsed,
        "cpu_s": cpu,
        "deadline_hit": len(latencies) + len(errors) < requests,
    }


def ping(base: str) -> dict[str, Any]:
    latencies: list[float] = []
    errors: list[str] = []
    deadline = time.perf_counter() + DEADLINE_S
    with httpx.Client(base_url=base, timeout=120.0) as client:
        client.get("/ping")
        _handshake()
        while time.perf_counter() < deadline:
            start = time.perf_counter()
            try:
                client.get("/ping").raise_for_status()
            except httpx.HTTPError as exc:
                errors.append(repr(exc)[:200])
            else:
                latencies.append(time.perf_counter() - start)
            readable, _, _ = select.select([sys.stdin], [], [], PING_INTERVAL_S)
            if readable and not sys.stdin.readline():
                break  # standard input closed: the DB load is over
    return {"ping_latencies": latencies, "errors": len(errors), "first_error": errors[0] if errors else None}


async def burst(base: str, path: str, n: int) -> dict[str, Any]:
    """``n`` requests to ``path`` and ``n`` to ``/ping``, all in flight at once: each one's seconds."""
    async with httpx.AsyncClient(
        base_url=base, timeout=300.0, limits=httpx.Limits(max_connections=None)
    ) as client:
        await client.get("/ping")
        _handshake()

        async def one(target: str) -> tuple[str, float, bool]:
            start = time.perf_counter()
            try:
                ok = (await client.get(target)).status_code == 200
            except httpx.HTTPError:
                ok = False
            return target, time.perf_counter() - start, ok

        results = await asyncio.gather(*(one(t) for _ in range(n) for t in (path, "/ping")))
    return {
        "db_latencies": [s for t, s, ok in results if t == path and ok],
        "ping_latencies": [s for t, s, ok in results if t == "/ping" and ok],
        "errors": sum(1 for _, _, ok in results if not ok),
    }


if __name__ == "__main__":
    mode, base_url = sys.argv[1], sys.argv[2]
    _check(base_url)
    if mode == "db":
        n_requests, n_workers, ops = map(int, sys.argv[3:6])
        limit_s = float(sys.argv[6]) if len(sys.argv) > 6 else DEADLINE_S
        result = asyncio.run(db(base_url, n_requests, n_workers, ops, limit_s))
    elif mode == "burst":
        result = asyncio.run(burst(base_url, sys.argv[3], int(sys.argv[4])))
    else:
        result = ping(base_url)
    print(json.dumps(result), flush=True)
