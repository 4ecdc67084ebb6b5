"""
``limit-sweep``: throughput and p99 latency of ``semaphore`` and ``threads`` against the limit L.

The post picked 40 by feel.  This sweep runs both runners at L = 1, 2, 5, 10, 20, 40, 80 on the
first ``--sweep-n`` ops of the same sequence, each point on fresh tables, to show where more
connections stop buying throughput and start buying only latency (and server load).
"""

from __future__ import annotations

import asyncio

from . import semaphore, threads
from ._harness import Context, Measurement

LIMITS = (1, 2, 5, 10, 20, 40, 80)


def run(ctx: Context) -> None:
    ops = ctx.ops[: ctx.sweep_n]
    for limit in LIMITS:
        free = ctx.db.free_connections()
        if limit > free:
            for scenario in ("semaphore", "threads"):
                ctx.results.append(
                    Measurement(
                        scenario=scenario,
                        label=f"{scenario} L={limit}",
                        group="sweep",
                        n=len(ops),
                        config={"limit": limit},
                        error=f"skipped: the server has only {free} connections free",
                    )
                )
            continue
        asyncio.run(semaphore.measure(ctx, limit, ops, group="sweep", label=f"semaphore L={limit}"))
        asyncio.run(
            threads.measure(ctx, limit, ops, driver="psycopg", group="sweep", label=f"threads L={limit}")
        )
