"""
``limit-sweep``: throughput and p99 latency of ``semaphore`` and ``threads`` against the limit L.

The post picked 40 by feel.  This sweep runs both runners at L = 1, 2, 5, 10, 20, 40, 80 on the
first ``--sweep-n`` ops of the same sequence, each point on fresh tables, to show where more
connections stop buying throughput and start buying only latency (and server load); with
``--sweep-passes K``, K times, the order of the limits turned around each pass (the report and the
chart give each limit's mean over the passes).  Beside
them, each runner once with ``limit="auto"`` on a pool of ``--limit`` connections (the chart marks
it at its time-weighted mean limit; the ``auto-limit`` scenario compares it with the best point in
rounds).
"""

from __future__ import annotations

import asyncio

from ..harness import Context
from ..measurement import Measurement
from ..scenario import Scenario
from . import semaphore, threads

LIMITS = (1, 2, 5, 10, 20, 40, 80)


def run(ctx: Context) -> None:
    ops = ctx.ops[: ctx.sweep_n]
    passes = ctx.sweep_passes
    for k in range(passes):
        order = LIMITS if k % 2 == 0 else LIMITS[::-1]
        tag = f" pass {k + 1}" if passes > 1 else ""
        extra = {"pass": k + 1}
        for limit in order:
            free = ctx.db.free_connections()
            if limit > free:
                for scenario in ("semaphore", "threads"):
                    ctx.results.append(
                        Measurement(
                            scenario=scenario,
                            label=f"{scenario} L={limit}{tag}",
                            group="sweep",
                            n=len(ops),
                            config={"limit": limit, **extra},
                            error=f"skipped: the server has only {free} connections free",
                        )
                    )
                continue
            asyncio.run(
                semaphore.measure(
                    ctx, limit, ops, group="sweep", label=f"semaphore L={limit}{tag}", extra=extra
                )
            )
            asyncio.run(
                threads.measure(
                    ctx,
                    limit,
                    ops,
                    driver="psycopg",
                    group="sweep",
                    label=f"threads L={limit}{tag}",
                    extra=extra,
                )
            )
    auto = "auto"
    asyncio.run(
        semaphore.measure(ctx, auto, ops, group="sweep", label="semaphore L=auto", capacity=ctx.limit)
    )
    asyncio.run(
        threads.measure(
            ctx, auto, ops, driver="psycopg", group="sweep", label="threads L=auto", capacity=ctx.limit
        )
    )


SCENARIO = Scenario(
    name="limit-sweep",
    run=run,
    what="semaphore and threads at L = 1, 2, 5, 10, 20, 40, 80, and once each with limit='auto'",
    section="Limit sweep",
    seconds=35,
    index_pass=True,
)
