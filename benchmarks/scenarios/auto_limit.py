"""
``auto-limit``: ``limit="auto"`` against the fixed limits a user could have chosen.

Auto runs get a pool of C connections (C = ``--limit``, 20 by default: the ceiling the auto limit
may not pass); a fixed limit L gets ``pool_size=L`` as everywhere in the suite.  Three parts:

* **vs best fixed** — ``SemaphoreRunner`` (asyncpg) and ``ThreadOffloadRunner`` (psycopg) on this
  pass's schema: auto against the best fixed limit of this pass's limit sweep (5 if the sweep did
  not run), in ``--auto-rounds`` rounds on the first ``min(N, 5,000)`` ops, auto first in odd
  rounds and second in even ones (ABBA).  Each round gives auto / best ops/s; the goal uses
  their geometric mean (the report gives its 95% interval and the median too).
* **latency-bound** — units that mostly wait (``SELECT pg_sleep(0.02)`` and a one-row insert)
  through ``SemaphoreRunner``: auto against L=C (the best fixed limit here, as more in flight
  only helps up to the pool), the same rounds with the order turned around each round, and against
  L=5 in the first :data:`LATENCY_SMALL_ROUNDS` of them (twice as slow: a few rounds tell).
* **neighbour** — the post's ops for :data:`NEIGHBOUR_TOTAL_S` seconds on the indexed schema (so
  the workload itself does not slow down as ``b`` grows), through ``stream()`` and through
  ``run()``: :data:`NEIGHBOUR_START_S` seconds in, another process starts to hammer the same
  server (:mod:`benchmarks.workers.neighbour`, :data:`NEIGHBOUR_CONNECTIONS` connections), and it stops at
  :data:`NEIGHBOUR_STOP_S`.  Auto and L=C (and, through ``stream()``, the best fixed limit of the
  first pass's sweep, without the neighbour) in :data:`NEIGHBOUR_ROUNDS` rounds per verb, the order
  turned around each round (first pass only); each records its throughput and unit p99 per second
  and the runner's limit every 100 ms.

:mod:`benchmarks.report.auto_limit` turns the rows into the report's section, goals and charts.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import statistics
import subprocess
import time
from collections.abc import Iterator
from typing import Any, Literal

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncSession

from boundeddb import Outcome

from .. import workers
from ..db.schema import A
from ..harness import Context
from ..scenario import Scenario
from ..stats import by_fixed_limit, percentile
from ..workload import async_unit
from . import semaphore, threads
from ._runner import record

GROUP = "auto"
#: Ops per vs-best measurement: the first min(N, this) of the sequence (about 8 s on 2 cores; the
#: auto limit's climb takes about half a second of it).
MAX_OPS = 5_000
#: Fixed limit to compare with when the sweep did not run in this pass.
FALLBACK_BEST = 5
LATENCY_UNITS = 4_000
LATENCY_SLEEP_S = 0.02
LATENCY_SMALL = 5
#: Rounds of the latency-bound comparison that run L=LATENCY_SMALL too.
LATENCY_SMALL_ROUNDS = 3
NEIGHBOUR_TOTAL_S = 40.0
NEIGHBOUR_START_S = 10.0
NEIGHBOUR_STOP_S = 25.0
NEIGHBOUR_CONNECTIONS = 4
#: Rounds of the neighbour comparison through each of stream() and run(), the order turned around
#: each round.
NEIGHBOUR_ROUNDS = 2
NEIGHBOUR_MODES = ("stream", "run")
SAMPLE_S = 0.1
#: The stretches of a neighbour run the report compares (the first and last second left out).
PHASES = {
    "before": (2.0, NEIGHBOUR_START_S),
    "during": (NEIGHBOUR_START_S + 1, NEIGHBOUR_STOP_S),
    "after": (NEIGHBOUR_STOP_S + 1, NEIGHBOUR_TOTAL_S),
}

Limit = int | Literal["auto"]


def best_fixed(ctx: Context, runner: str) -> int:
    """
    The limit with the most ops/s on average over this pass's limit sweep's passes, among the limits
    an auto limit could reach (at most --limit, the pool it gets); FALLBACK_BEST if the sweep did not run.
    """
    rows = [
        m
        for m in ctx.results
        if m.group == "sweep" and m.scenario == runner and m.schema == ctx.schema and not m.error
        if m.ops_per_s
    ]
    points = {limit: ms for limit, ms in by_fixed_limit(rows).items() if limit <= ctx.limit}
    if not points:
        return FALLBACK_BEST
    return max(points, key=lambda limit: statistics.mean(m.ops_per_s or 0.0 for m in points[limit]))


def _capacity(ctx: Context, limit: Limit) -> int | None:
    """The pool an auto limit gets: --limit connections (a fixed limit gets its own size)."""
    return ctx.limit if limit == "auto" else None


def _label(part: str, runner: str, limit: Limit) -> str:
    return f"{part}: {runner} L={limit}"


def vs_best(ctx: Context) -> None:
    ops = ctx.ops[:MAX_OPS]
    for runner in ("semaphore", "threads"):
        best = best_fixed(ctx, runner)
        for k in range(ctx.auto_rounds):
            sides: tuple[Limit, Limit] = ("auto", best) if k % 2 == 0 else (best, "auto")
            for limit in sides:
                extra = {"part": "vs-best", "runner": runner, "round": k + 1, "best": best}
                label = _label("vs-best", runner, limit)
                capacity = _capacity(ctx, limit)
                if runner == "semaphore":
                    coro = semaphore.measure(
                        ctx, limit, ops, group=GROUP, label=label, capacity=capacity, extra=extra
                    )
                else:
                    coro = threads.measure(
                        ctx,
                        limit,
                        ops,
                        driver="psycopg",
                        group=GROUP,
                        label=label,
                        capacity=capacity,
                        extra=extra,
                    )
                asyncio.run(coro)


async def waiting_unit(session: AsyncSession) -> None:
    """A unit that mostly waits: 20 ms of pg_sleep, then a one-row insert (flushed at commit)."""
    await session.execute(text(f"SELECT pg_sleep({LATENCY_SLEEP_S})"))
    session.add(A(data="latency-bound"))


async def measure_waiting(ctx: Context, limit: Limit, extra: dict[str, Any]) -> None:
    """LATENCY_UNITS waiting units through a SemaphoreRunner of ``limit``."""
    ctx.reset()
    label = _label("latency-bound", "semaphore", limit)
    cm = semaphore.probed_runner(
        ctx, limit, label, total=LATENCY_UNITS, group=GROUP, capacity=_capacity(ctx, limit), extra=extra
    )
    async with cm as (runner, p):
        report = await runner.run(waiting_unit for _ in range(LATENCY_UNITS))
        p.done = LATENCY_UNITS
        record(p, report)


def latency_bound(ctx: Context) -> None:
    for k in range(ctx.auto_rounds):
        sides: tuple[Limit, ...] = ("auto", ctx.limit)
        if k < LATENCY_SMALL_ROUNDS:
            sides = (*sides, LATENCY_SMALL)
        for limit in sides if k % 2 == 0 else sides[::-1]:
            extra = {"part": "latency-bound", "runner": "semaphore", "round": k + 1, "best": ctx.limit}
            asyncio.run(measure_waiting(ctx, limit, extra))


def _start_neighbour(ctx: Context) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        workers.command("neighbour", ctx.db.libpq_dsn(), str(NEIGHBOUR_CONNECTIONS)),
        cwd=workers.ROOT,
        stdout=subprocess.DEVNULL,
    )


async def _stop_neighbour(proc: subprocess.Popen[bytes] | None) -> None:
    if proc is not None and proc.poll() is None:
        proc.terminate()
        try:
            await asyncio.to_thread(proc.wait, 15)
        except subprocess.TimeoutExpired:
            proc.kill()


def per_second(done: list[tuple[float, float]], total_s: float) -> list[dict[str, Any]]:
    """Completions (time, latency) bucketed by second: ops/s and unit p99 in each."""
    buckets: list[list[float]] = [[] for _ in range(int(total_s) + 1)]
    for t, latency in done:
        buckets[min(int(t), len(buckets) - 1)].append(latency)
    return [
        {"t": k, "ops": len(b), "p99_ms": round((percentile(b, 0.99) or 0.0) * 1e3, 2)}
        for k, b in enumerate(buckets[: int(total_s)])
    ]


def phase_figures(done: list[tuple[float, float]]) -> dict[str, dict[str, float | None]]:
    """ops/s and unit p99 (ms) of the units that finished in each of PHASES."""
    out: dict[str, dict[str, float | None]] = {}
    for name, (start, end) in PHASES.items():
        latencies = [latency for t, latency in done if start <= t < end]
        p99 = percentile(latencies, 0.99)
        out[name] = {"ops_s": len(latencies) / (end - start), "p99_ms": None if p99 is None else p99 * 1e3}
    return out


async def measure_neighbour(ctx: Context, limit: Limit, best: int, mode: str, round_no: int) -> None:
    """
    The post's ops for NEIGHBOUR_TOTAL_S seconds while a neighbour comes and goes (see the module
    docstring), through ``runner.stream()`` or ``runner.run()`` (``mode``; outcomes timed by
    ``on_outcome``).
    """
    ctx.db.reset_schema(index=True)
    label = _label(f"neighbour {mode} {round_no}", "semaphore", limit)
    extra = {"part": "neighbour", "best": best, "mode": mode, "round": round_no}
    done: list[tuple[float, float]] = []
    limits: list[tuple[float, int]] = []
    proc: subprocess.Popen[bytes] | None = None
    capacity = _capacity(ctx, limit)
    cm = semaphore.probed_runner(ctx, limit, label, total=0, group=GROUP, capacity=capacity, extra=extra)
    try:
        async with cm as (runner, p):
            t0 = time.perf_counter()

            def units() -> Iterator[Any]:
                for op in itertools.cycle(ctx.ops):
                    if time.perf_counter() - t0 >= NEIGHBOUR_TOTAL_S:
                        return
                    yield async_unit(op, p.tick)

            def settled(o: Outcome[Any]) -> None:
                if o.error is None:
                    done.append((time.perf_counter() - t0, o.latency_s))
                else:
                    p.failed += 1

            async def watch() -> None:
                nonlocal proc
                while True:
                    now = time.perf_counter() - t0
                    limits.append((round(now, 2), runner.limit))
                    if proc is None and now >= NEIGHBOUR_START_S:
                        proc = _start_neighbour(ctx)
                    elif proc is not None and now >= NEIGHBOUR_STOP_S:
                        await _stop_neighbour(proc)
                    await asyncio.sleep(SAMPLE_S)

            watcher = asyncio.create_task(watch())
            try:
                if mode == "stream":
                    async with contextlib.aclosing(runner.stream(units())) as outcomes:
                        async for o in outcomes:
                            settled(o)
                else:
                    await runner.run(units(), on_outcome=settled)
            finally:
                watcher.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await watcher
            p.latencies = [latency for _, latency in done]
            p.m.n = len(done) + p.failed
            series = per_second(done, NEIGHBOUR_TOTAL_S)
            p.m.extra.update(series=series, phases=phase_figures(done), limits=limits)
    finally:
        await _stop_neighbour(proc)


def neighbour(ctx: Context) -> None:
    """
    NEIGHBOUR_ROUNDS rounds through stream() and as many through run(): auto against L=C (and the
    sweep's best fixed limit through stream()), the order turned around each round (ABBA).
    """
    best = best_fixed(ctx, "semaphore")
    for mode in NEIGHBOUR_MODES:
        sides: tuple[Limit, ...] = ("auto", ctx.limit)
        if mode == "stream" and best != ctx.limit:
            sides = (*sides, best)
        for k in range(NEIGHBOUR_ROUNDS):
            for limit in sides if k % 2 == 0 else sides[::-1]:
                asyncio.run(measure_neighbour(ctx, limit, best, mode, k + 1))


def run(ctx: Context) -> None:
    vs_best(ctx)
    latency_bound(ctx)
    if not ctx.index:
        neighbour(ctx)


SCENARIO = Scenario(
    name="auto-limit",
    run=run,
    what="limit='auto' against the best fixed limit, on waiting units, and beside a noisy neighbour",
    section="Auto limit",
    seconds=600,
    index_pass=True,
    default=False,
)
