"""
The auto limit beside CPU hogs: does it drift up when the client's cores are contended?

Reproduces tests/test_auto_limit.py's server-bound case (units that each keep a server core busy
for a while, a pool of 24, ``limit="auto"``) that once ended at 16 under load, and asks why:

- ``sweep``: throughput at fixed limits (4, 8, 12, 16, 24), so what the controller *should* find;
- ``auto``: where ``limit="auto"`` ends (``limit_final``) on the same units;

each under every condition, the conditions alternating round by round:

- ``quiet``: no hog of ours (the machine's other work still runs);
- ``hogs``: N busy-looping processes anywhere (they compete with the client and the server alike);
- ``client-core``: the client and the hogs pinned to CPU 0 (the hogs take the client's core; the
  server's backends can still move to CPU 1);
- ``server-core``: the client on CPU 0, the hogs on CPU 1 (the server competes; the client not).

Self-contained (not part of ``python -m benchmarks``); run from the repository root:

    python -m benchmarks.client_load --rounds 3 --hogs 2 --kind threads --kind semaphore

PostgreSQL at ``$BOUNDEDDB_BENCH_URL`` or ``postgresql://postgres@127.0.0.1/test``. Every hog is a
child of this process and is killed when it ends.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import statistics
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url
from sqlalchemy.ext.asyncio import async_sessionmaker, create_async_engine
from sqlalchemy.orm import sessionmaker

from boundeddb import SemaphoreRunner, ThreadOffloadRunner

#: tests/test_auto_limit.py's BUSY units: each keeps a server core busy.
BUSY = text("SELECT count(*) * 0 + CAST(:i AS integer) FROM generate_series(1, 400000)")
POOL = 24
LIMITS = (4, 8, 12, 16, 24)
CONDITIONS = ("quiet", "hogs", "client-core", "server-core")


def url(driver: str) -> str:
    base = make_url(os.environ.get("BOUNDEDDB_BENCH_URL", "postgresql://postgres@127.0.0.1/test"))
    return base.set(drivername=f"postgresql+{driver}").render_as_string(hide_password=False)


@contextlib.contextmanager
def condition(name: str, hogs: int) -> Iterator[None]:
    """Start the condition's hogs and pin this process; undo both on the way out."""
    cpus = sorted(os.sched_getaffinity(0))
    pin_client, pin_hogs = {
        "quiet": (None, None),
        "hogs": (None, None),
        "client-core": ({cpus[0]}, {cpus[0]}),
        "server-core": ({cpus[0]}, {cpus[-1]}),
    }[name]
    count = 0 if name == "quiet" else hogs
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", "while True: pass"],
            preexec_fn=(lambda: os.sched_setaffinity(0, pin_hogs)) if pin_hogs else None,
        )
        for _ in range(count)
    ]
    try:
        if pin_client:
            os.sched_setaffinity(0, pin_client)
        yield
    finally:
        os.sched_setaffinity(0, cpus)
        for proc in procs:
            proc.kill()
        for proc in procs:
            proc.wait()


def units(is_async: bool, n: int) -> list[Any]:
    def make(i: int) -> Any:
        if is_async:

            async def unit(session: Any) -> int:
                return int((await session.execute(BUSY, {"i": i})).scalar_one())

            return unit

        def sync_unit(session: Any) -> int:
            return int(session.execute(BUSY, {"i": i}).scalar_one())

        return sync_unit

    return [make(i) for i in range(n)]


async def measure(kind: str, limit: int | str, n: int) -> dict[str, Any]:
    """One run of ``n`` BUSY units at ``limit`` (an int or "auto"): throughput and the limit's path."""
    if kind == "semaphore":
        engine: Any = create_async_engine(url("asyncpg"), pool_size=POOL, max_overflow=0)
        runner: Any = SemaphoreRunner(async_sessionmaker(engine), limit=limit)
    else:
        engine = create_engine(url("psycopg"), pool_size=POOL, max_overflow=0)
        runner = ThreadOffloadRunner(sessionmaker(engine), limit=limit)
    try:
        stats = (await runner.run(units(kind == "semaphore", n))).stats
    finally:
        if kind == "semaphore":
            await engine.dispose()
        else:
            engine.dispose()
    return {"throughput": stats.throughput, "final": stats.limit_final,
            "trace": [n for _, n in stats.limit_trace]}  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--hogs", type=int, default=2)
    parser.add_argument("--kind", action="append", choices=["threads", "semaphore"])
    parser.add_argument("--condition", action="append", choices=CONDITIONS)
    parser.add_argument("--sweep-n", type=int, default=160, help="units per fixed-limit run")
    parser.add_argument("--auto-n", type=int, default=400, help="units per auto run (the test's 400)")
    args = parser.parse_args()
    kinds, conditions = args.kind or ["threads"], args.condition or list(CONDITIONS)
    sweep: dict[tuple[str, str, int], list[float]] = {}
    finals: dict[tuple[str, str], list[int]] = {}
    for r in range(args.rounds):
        for name in conditions if r % 2 == 0 else conditions[::-1]:
            for kind in kinds:
                with condition(name, args.hogs):
                    for limit in LIMITS if r % 2 == 0 else LIMITS[::-1]:
                        x = asyncio.run(measure(kind, limit, args.sweep_n))["throughput"]
                        sweep.setdefault((kind, name, limit), []).append(x)
                    auto = asyncio.run(measure(kind, "auto", args.auto_n))
                finals.setdefault((kind, name), []).append(auto["final"])
                print(f"round {r + 1} {kind:9} {name:11} load {os.getloadavg()[0]:.1f}  "
                      f"auto trace {auto['trace']}", flush=True)  # fmt: skip
    print("\nunits/s at fixed limits (median of the rounds; each relative to L=8) and auto's limit_final:")
    for kind in kinds:
        for name in conditions:
            medians = {limit: statistics.median(sweep[kind, name, limit]) for limit in LIMITS}
            row = "  ".join(f"L={limit}: {x:5.1f} ({x / medians[8]:.2f})" for limit, x in medians.items())
            print(f"{kind:9} {name:11} {row}   auto final {finals[kind, name]}")


if __name__ == "__main__":
    main()
