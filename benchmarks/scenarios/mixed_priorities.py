"""
``mixed``: short interactive units submitted beside a bulk run on one runner (issue 10).

A web app and a backfill often share one pool: when the bulk run holds every slot, a request's
unit waits for a bulk unit to finish before it starts.  Here a ``SemaphoreRunner`` of
:data:`LIMIT` runs a bulk run of slow units while a second task submits short interactive units
at a steady :data:`RATE_HZ` per second, on a fixed schedule (open loop: one every 20 ms whether
or not the earlier ones have finished), each with ``runner.submit``.  Four measurements:

* **baseline** — the bulk run alone on a runner of ``LIMIT - RESERVE``: what the bulk run does
  with the slots a reserve leaves it;
* **none** — the bulk run and the interactive units, all at priority 0;
* **priority** — the interactive units with ``priority=1``;
* **reserve** — ``priority=1`` on a runner with ``reserve=RESERVE``.

A bulk unit is ``SELECT pg_sleep(s)`` with ``s`` drawn uniformly from 50-200 ms (a fixed seed;
every measurement of a round runs the same sequence) and a one-row insert into ``a``, committed
by the runner.  The server's work is waiting, not CPU: on a 2-core machine shared by the client
and the server, four backends burning 50-200 ms of CPU each would measure the operating
system's scheduler (how soon the interactive unit's backend and this process get a core), not
which unit the runner lets start; a real backfill's unit mostly waits (on I/O, locks, the
network) too.  An interactive unit reads one row (``SELECT id FROM a ORDER BY id DESC LIMIT 1``,
on the primary key).

The interactive **wait** is timed in the unit itself: from just before the ``runner.submit``
call to the unit's first line, which runs once the runner has granted a slot and opened the
session (the session connects lazily, at the unit's first statement; the pool is warmed to
``LIMIT`` connections before each measurement).  ``submit()`` returns the unit's value, not an
``Outcome``, so ``Outcome.wait_s`` is not available there.  The **response** is the whole
``submit`` call.  Each interactive unit's submit also records how late the event loop ran it
against its schedule (the client's own lag, in neither figure).  Only the interactive units
submitted before the bulk run pulled its last unit count (the bulk run then still saturates
its slots); the others are counted apart.  **Bulk throughput** is the bulk run's succeeded
units / its ``RunStats.elapsed_s``.  A task samples ``runner.statistics()`` and the bulk units
in flight every :data:`SAMPLE_S` s: the share of the bulk's slots (``LIMIT - reserve``) it kept
busy, and the most units in flight across priorities (the bound).

Rounds (:data:`ROUNDS`) run the four measurements in one order, then the reverse (ABBA), each on
fresh tables; the report (:mod:`benchmarks.report.mixed_priorities`) gives the median of the rounds.  The
bulk run has ``N // 25`` units, between :data:`MIN_BULK` and :data:`MAX_BULK` (200 at the
default N: about 30 s a round; 40 under ``--quick``).

:class:`BulkJob` is the same bulk work as an open-ended background run, for the ``loop-lag``
scenario's variants that share the endpoints' runner with a bulk job.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import statistics
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import select, text
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession, async_sessionmaker

from boundeddb import SemaphoreRunner

from ..db.schema import A
from ..harness import Context, Probe
from ..scenario import Scenario
from ..stats import percentile
from ._runner import record

GROUP = "mixed"
LIMIT = 4
RESERVE = 1
RATE_HZ = 50.0
SLEEP_MIN_S, SLEEP_MAX_S = 0.05, 0.2
ROUNDS = 3
MIN_BULK, MAX_BULK = 40, 200
SAMPLE_S = 0.01
INTERACTIVE_READ = select(A.id).order_by(A.id.desc()).limit(1)


@dataclass(frozen=True)
class Variant:
    """One measurement of a round: the runner's limit and reserve, the submits' priority."""

    name: str
    limit: int
    reserve: int = 0
    #: The interactive units' priority; None: no interactive units (the baseline).
    priority: int | None = None

    def label(self) -> str:
        if self.priority is None:
            return f"mixed: bulk alone L={self.limit}"
        parts = [f"mixed: priority={self.priority}"]
        if self.reserve:
            parts.append(f"reserve={self.reserve}")
        return " ".join([*parts, f"L={self.limit}"])


VARIANTS = (
    Variant("baseline", LIMIT - RESERVE),
    Variant("none", LIMIT, priority=0),
    Variant("priority", LIMIT, priority=1),
    Variant("reserve", LIMIT, reserve=RESERVE, priority=1),
)


def bulk_units_for(ctx: Context) -> int:
    """Bulk units per measurement: N // 25, clamped to [MIN_BULK, MAX_BULK]."""
    return max(MIN_BULK, min(MAX_BULK, len(ctx.ops) // 25))


def sleeps(n: int, seed: int) -> list[float]:
    """``n`` bulk durations, uniform in [SLEEP_MIN_S, SLEEP_MAX_S], from a fixed seed."""
    rng = random.Random(seed)
    return [round(rng.uniform(SLEEP_MIN_S, SLEEP_MAX_S), 4) for _ in range(n)]


def bulk_unit(sleep_s: float, busy: list[int], done: Callable[[], None]) -> Callable[[AsyncSession], Any]:
    """``pg_sleep(sleep_s)`` and a one-row insert; ``busy[0]`` counts the bulk units running."""

    async def unit(session: AsyncSession) -> None:
        busy[0] += 1
        try:
            await session.execute(text("SELECT pg_sleep(CAST(:s AS double precision))"), {"s": sleep_s})
            session.add(A(data="bulk"))
        finally:
            busy[0] -= 1
        done()

    return unit


@dataclass
class Interactive:
    """One interactive unit: when it was due and submitted, how long it waited and took."""

    due: float
    submitted: float = 0.0
    wait_s: float | None = None
    response_s: float | None = None
    error: str | None = None


@dataclass
class Samples:
    """What the sampler saw every SAMPLE_S seconds: (time, bulk running, statistics())."""

    rows: list[tuple[float, int, int, int, int]] = field(default_factory=list)

    def add(self, t: float, bulk: int, runner: SemaphoreRunner) -> None:
        s = runner.statistics()
        waiting_high = sum(n for p, n in s.waiting_by_priority.items() if p > 0)
        self.rows.append((t, bulk, s.in_flight, s.waiting, waiting_high))


async def _warm(engine: AsyncEngine, n: int) -> None:
    """Open the pool's ``n`` connections before the timed part, so that no unit waits for a connect."""
    async with contextlib.AsyncExitStack() as stack:
        for _ in range(n):
            conn = await stack.enter_async_context(engine.connect())
            await conn.execute(text("SELECT 1"))


async def _interactive(
    runner: SemaphoreRunner, priority: int, t0: float, drained: list[float], out: list[Interactive]
) -> None:
    """Submit one interactive unit every 1/RATE_HZ s from ``t0`` until the bulk run has pulled its last."""

    async def one(item: Interactive) -> None:
        item.submitted = time.perf_counter()

        async def unit(session: AsyncSession) -> int | None:
            if item.wait_s is None:  # a retried attempt keeps the first start
                item.wait_s = time.perf_counter() - item.submitted
            value: int | None = (await session.execute(INTERACTIVE_READ)).scalar()
            return value

        try:
            await runner.submit(unit, priority=priority)
        except Exception as exc:
            item.error = f"{type(exc).__name__}: {exc}"[:200]
        item.response_s = time.perf_counter() - item.submitted

    tasks: set[asyncio.Task[None]] = set()
    k = 0
    while True:
        due = t0 + k / RATE_HZ
        delay = due - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        if drained:
            break
        item = Interactive(due=due)
        out.append(item)
        tasks.add(asyncio.create_task(one(item)))
        k += 1
    await asyncio.gather(*tasks)


async def _sample(runner: SemaphoreRunner, busy: list[int], t0: float, samples: Samples) -> None:
    while True:
        samples.add(time.perf_counter() - t0, busy[0], runner)
        await asyncio.sleep(SAMPLE_S)


def _ms(value: float | None) -> float | None:
    return None if value is None else round(value * 1e3, 3)


def summarise(
    items: list[Interactive], samples: Samples, drained_at: float | None, t0: float, share: int
) -> dict[str, Any]:
    """The interactive figures (units submitted while the bulk run still had units to pull) and the slots."""
    end = drained_at if drained_at is not None else float("inf")
    counted = [i for i in items if i.submitted < end and i.error is None and i.wait_s is not None]
    waits = [i.wait_s for i in counted if i.wait_s is not None]
    responses = [i.response_s for i in counted if i.response_s is not None]
    lateness = [max(0.0, i.submitted - i.due) for i in counted]
    busy_rows = [r for r in samples.rows if t0 + r[0] < end] or samples.rows
    return {
        "interactive_submitted": len(items),
        "interactive_counted": len(counted),
        "interactive_failed": sum(1 for i in items if i.error is not None),
        "interactive_after_drain": sum(1 for i in items if i.submitted >= end),
        "first_interactive_error": next((i.error for i in items if i.error), None),
        "wait_p50_ms": _ms(percentile(waits, 0.5)),
        "wait_p99_ms": _ms(percentile(waits, 0.99)),
        "wait_max_ms": _ms(max(waits, default=None)),
        "wait_over_5ms": sum(1 for w in waits if w > 0.005),
        "response_p50_ms": _ms(percentile(responses, 0.5)),
        "response_p99_ms": _ms(percentile(responses, 0.99)),
        "response_max_ms": _ms(max(responses, default=None)),
        "schedule_late_p99_ms": _ms(percentile(lateness, 0.99)),
        "bulk_busy_share": (statistics.fmean(r[1] for r in busy_rows) / share) if busy_rows else None,
        "max_in_flight": max((r[2] for r in samples.rows), default=None),
        "max_waiting": max((r[3] for r in samples.rows), default=None),
        "max_waiting_high": max((r[4] for r in samples.rows), default=None),
        "statistics_samples": len(samples.rows),
        "waits_ms": sorted(round(w * 1e3, 3) for w in waits),  # for the chart
    }


async def measure(ctx: Context, variant: Variant, durations: list[float], k: int) -> None:
    """One measurement: the bulk run of ``durations`` on a fresh runner, with interactive units or not."""
    ctx.reset()
    label = variant.label()
    app = ctx.app_name(label)
    engine = ctx.db.async_engine(app, pool_size=variant.limit)
    sessions = async_sessionmaker(engine, expire_on_commit=False)
    config = {
        "variant": variant.name,
        "round": k,
        "driver": "asyncpg",
        "limit": variant.limit,
        "reserve": variant.reserve,
        "priority": variant.priority,
        "pool_size": variant.limit,
        "max_overflow": 0,
        "bulk_units": len(durations),
        "bulk_sleep_s": [SLEEP_MIN_S, SLEEP_MAX_S],
        "rate_hz": RATE_HZ if variant.priority is not None else 0,
    }
    busy = [0]
    drained: list[float] = []
    items: list[Interactive] = []
    samples = Samples()
    try:
        await _warm(engine, variant.limit)
        runner = SemaphoreRunner(sessions, limit=variant.limit, reserve=variant.reserve, errors="collect")
        async with (
            runner,
            Probe(ctx, "mixed", label, total=len(durations), app_name=app, group=GROUP, config=config) as p,
        ):

            def units() -> Iterator[Callable[[AsyncSession], Any]]:
                last = len(durations) - 1
                for i, s in enumerate(durations):
                    if i == last:
                        drained.append(time.perf_counter())
                    yield bulk_unit(s, busy, p.tick)

            t0 = time.perf_counter()
            sampler = asyncio.create_task(_sample(runner, busy, t0, samples))
            submits = None
            if variant.priority is not None:
                submits = asyncio.create_task(_interactive(runner, variant.priority, t0, drained, items))
            try:
                report = await runner.run(units())
                if submits is not None:
                    await submits
            finally:
                sampler.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await sampler
            record(p, report)
        m = p.m
        m.ops_per_s = report.stats.succeeded / report.stats.elapsed_s if report.stats.elapsed_s else None
        share = variant.limit - variant.reserve
        m.extra.update(bulk_elapsed_s=report.stats.elapsed_s, bulk_share=share)
        m.extra.update(summarise(items, samples, drained[0] if drained else None, t0, share))
    finally:
        await engine.dispose()


def run(ctx: Context) -> None:
    n = bulk_units_for(ctx)
    for k in range(ROUNDS):
        durations = sleeps(n, ctx.seed + k)
        for variant in VARIANTS if k % 2 == 0 else VARIANTS[::-1]:
            asyncio.run(measure(ctx, variant, durations, k + 1))


class BulkJob:
    """
    The bulk units as a background ``runner.run()`` at priority 0 until :meth:`stop`: a backfill
    sharing a web app's runner (the ``loop-lag`` scenario's ``semaphore-submit+bulk`` variants).
    """

    def __init__(self, runner: SemaphoreRunner, seed: int) -> None:
        self._runner, self._rng = runner, random.Random(seed)
        self._stopping = False
        self._busy = [0]
        self._task: asyncio.Task[Any] | None = None
        self.done: list[float] = []
        self.error: str | None = None

    def _units(self) -> Iterator[Callable[[AsyncSession], Any]]:
        while not self._stopping:
            sleep_s = self._rng.uniform(SLEEP_MIN_S, SLEEP_MAX_S)
            yield bulk_unit(sleep_s, self._busy, lambda: self.done.append(time.perf_counter()))

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._runner.run(self._units()))

    async def stop(self, timeout_s: float = 30.0) -> None:
        """Pull no more units; wait for those in flight (cancel the run after ``timeout_s``)."""
        self._stopping = True
        if self._task is None:
            return
        try:
            await asyncio.wait_for(self._task, timeout_s)
        except Exception as exc:  # a failed bulk unit must not lose the variant's measurement
            self.error = f"{type(exc).__name__}: {exc}"[:200]

    def summary(self, start: float, end: float) -> dict[str, Any]:
        """Bulk units finished within ``[start, end]`` (perf_counter), and per second."""
        done = sum(1 for t in self.done if start <= t <= end)
        return {
            "bulk_done": done,
            "bulk_ops_s": done / (end - start) if end > start else None,
            "bulk_error": self.error,
        }


SCENARIO = Scenario(
    name="mixed",
    run=run,
    what="short units submitted beside a bulk run: no priority, priority=1, and with reserve=1",
    section="Priorities and a reserve",
    seconds=95,
)
