"""
``overhead``: each boundeddb runner against its hand-written equivalent, with peers, over K rounds.

The project's target is that every runner reaches at least 0.97 of the ops/s of the code a user
would write by hand for the same strategy.  A single run of each, one after the other, cannot
resolve 3%: on a shared 2-core machine throughput drifts by about ±10% from one minute to the
next.  So this scenario measures six pairs, each side on the same op functions, engine settings
(``pool_size=L, max_overflow=0``, ``expire_on_commit=False``) and fresh tables:

* ``semaphore``: ``SemaphoreRunner(limit=L)`` against a hand-written sliding window, L worker
  coroutines pulling ops from one shared iterator, an AsyncSession per op (asyncpg).  In the same
  rounds, as peers (informational, compared with the same hand-written window): the tutorial
  pattern, ``asyncio.gather`` over a task per op behind ``asyncio.Semaphore(L)``,
  ``aiometer.run_on_each(fn, ops, max_at_once=L)``, and ``SemaphoreRunner(limit=L,
  verify_commits=True)`` (the cost of reading each writing unit's transaction id before COMMIT:
  its ratio beside the plain runner's), and the runner watched (``on_outcome=`` a counter and
  ``progress=`` a rich bar drawn into memory: what watching costs when asked for; the plain
  runner, which asks for neither, has no per-unit work for it), and the runner under
  ``boundeddb.instrument()`` with the OpenTelemetry SDK (:mod:`benchmarks.otel`: what metrics and
  spans cost when asked for);
* ``chunked``: ``ChunkedRunner(chunk_size=L)`` against ``asyncio.gather`` over each consecutive
  chunk of L ops (asyncpg);
* ``threads``: ``ThreadOffloadRunner(limit=L).run_sync(units)`` against
  ``ThreadPoolExecutor(L).map`` (psycopg), both from plain sync code under a sync probe (no event
  loop, no loop-lag ticker on either side), with the runner instrumented as a peer;
* ``threads-async``: ``await ThreadOffloadRunner(limit=L).run(units)`` under asyncio against
  ``asyncio.gather`` over ``loop.run_in_executor`` on a ``ThreadPoolExecutor(L)`` (psycopg), both
  under the async probe;
* ``semaphore-batch``: ``SemaphoreRunner(limit=L, batch=50)`` against a hand-written batch window,
  L worker coroutines each taking 50 ops at a time from one shared iterator, running them in one
  AsyncSession and committing once (asyncpg; :mod:`.hand_batches`);
* ``threads-batch``: ``ThreadOffloadRunner(limit=L, batch=50).run_sync(units)`` against
  ``ThreadPoolExecutor(L)`` with L threads each taking 50 ops at a time from one shared iterator
  under a lock, in one Session, committed once (psycopg, no loop).

The batch pairs' target is issue #33's: the library's batches at least 0.95 of the hand-written
batch loop at the same size (:data:`BATCH_TARGET`; ``Pair.target``).

The library sides count their progress with the runner's own ``progress=`` (nothing per unit;
drawn only on a terminal), the hand-written sides with a counter each unit calls.

In every round each pair runs its sides back to back: library, hand-written, then the peers in
rounds 1, 3, 5, ... and the reverse order in rounds 2, 4, ..., so that a slow drift of the machine
favours no side; the library and its hand-written equivalent are always neighbours
(ABBA for the pair).  Every measurement runs the first ``min(N, 3000)`` ops of the sequence, with
an application_name of its own.  A short warm-up of every side, not recorded, comes first.  The
report gives per pair the median ops/s of each side and the per-round ratios library /
hand-written with their median, min and max (the target uses the median); the peers' ratios to
the hand-written side; and, as a cross-check that depends less on other processes' load, the
per-round ratio of this process's CPU time per op, hand-written / library (above 1 means the
library spent less).  ``--overhead-rounds`` sets K (1 in a plain run, 5 with ``--full``).
"""

from __future__ import annotations

import io
from collections.abc import Iterable
from typing import Any

from rich.console import Console
from rich.progress import Progress
from sqlalchemy.ext.asyncio import async_sessionmaker

from boundeddb import SemaphoreRunner

from ..harness import Context, Probe
from ..scenario import Scenario
from ..workload import Op, async_unit
from . import chunked, hand_batches, hand_rolled, parity, semaphore, threads
from ._pairs import HAND_WRITTEN, INSTRUMENTED, LIBRARY, MAX_OPS, TARGET, Pair, Side, run_rounds
from ._runner import record

__all__ = ["HAND_WRITTEN", "INSTRUMENTED", "LIBRARY", "MAX_OPS", "PAIRS", "Pair", "Side", "goals"]

#: Rounds in a plain run (a first look) and with ``--full`` (the reference runs' count).
DEFAULT_ROUNDS, FULL_ROUNDS = 1, 5
#: Rough seconds of the warm-up and of one round at N >= 3,000 on the development machine.
WARMUP_S, SECONDS_PER_ROUND = 10, 100
GROUP = "overhead"
#: Issue #33's goal for the batch pairs: the library's batches >= this fraction of the hand-written
#: batch loop at the same size.
BATCH_TARGET = 0.95
#: The goal for it: instrumented / library client work per op at most this.
INSTRUMENTED_GOAL = 1.10
THREADS_DRIVER = "psycopg"
#: Ops per transaction on both sides of the batch pairs.
BATCH = hand_batches.BATCH
BATCHES, BATCH_YARDSTICK = "the library's batches", "the hand-written batch loop at the same size"


async def _measure_semaphore(
    ctx: Context,
    limit: int,
    ops: list[Op],
    group: str,
    label: str,
    *,
    verify: bool = False,
    watch: bool = False,
) -> None:
    """:func:`semaphore.measure` with ``verify_commits=True`` or watched (the runner under its own label)."""
    ctx.reset()
    app = ctx.app_name(label)
    engine = ctx.db.async_engine(app, pool_size=limit)
    sessions = async_sessionmaker(engine, expire_on_commit=False)
    config = {"driver": "asyncpg", "limit": limit, "pool_size": limit, "max_overflow": 0}
    watched: dict[str, Any] = {}
    if verify:
        config["verify_commits"] = True
    if watch:
        config.update(on_outcome=True, progress=True)
        settled = [0]
        console = Console(file=io.StringIO(), force_terminal=True, width=120)
        watched = {
            "progress": Progress(console=console, auto_refresh=False),
            "on_outcome": lambda outcome: settled.__setitem__(0, settled[0] + 1),
        }
    try:
        async with (
            SemaphoreRunner(sessions, limit=limit, errors="collect", verify_commits=verify) as runner,
            Probe(ctx, "semaphore", label, total=len(ops), app_name=app, group=group, config=config) as p,
        ):
            record(p, await runner.run([async_unit(op, p.tick) for op in ops], **watched))
    finally:
        await engine.dispose()


# fmt: off
PAIRS: dict[str, Pair] = {p.name: p for p in (
    Pair("semaphore", "semaphore / hand-written window",
        Side(LIBRARY, "semaphore", "SemaphoreRunner(limit=L).run", semaphore.measure),
        Side(HAND_WRITTEN, "hand-written window", "L worker coroutines on one shared iterator",
             hand_rolled.measure_window),
        (Side("verify-commits", "semaphore verify_commits",
              "SemaphoreRunner(limit=L, verify_commits=True).run", _measure_semaphore, {"verify": True}),
         Side("watched", "semaphore watched",
              "SemaphoreRunner(limit=L).run(units, on_outcome=..., progress=...)", _measure_semaphore,
              {"watch": True}),
         Side(INSTRUMENTED, "semaphore instrumented",
              "SemaphoreRunner(limit=L).run under boundeddb.instrument() (OpenTelemetry SDK)",
              semaphore.measure, instrumented=True),
         Side("tutorial", "tutorial gather+Semaphore", "gather, a task per op, Semaphore(L)",
              hand_rolled.measure_async),
         Side("aiometer", "aiometer", "aiometer.run_on_each(fn, ops, max_at_once=L)",
              hand_rolled.measure_aiometer))),
    Pair("chunked", "chunked / hand-written chunks",
        Side(LIBRARY, "chunked", "ChunkedRunner(chunk_size=L).run", chunked.measure),
        Side(HAND_WRITTEN, "hand-written chunks", "gather over each chunk of L ops",
             hand_rolled.measure_chunks)),
    Pair("threads", "threads run_sync / ThreadPoolExecutor.map",
        Side(LIBRARY, "threads run_sync", "ThreadOffloadRunner(limit=L).run_sync, no loop",
             threads.measure_sync, {"driver": THREADS_DRIVER}),
        Side(HAND_WRITTEN, "ThreadPoolExecutor.map", "ThreadPoolExecutor(L).map, no loop",
             hand_rolled.measure_threads),
        (Side(INSTRUMENTED, "threads run_sync instrumented",
              "ThreadOffloadRunner(limit=L).run_sync under boundeddb.instrument()", threads.measure_sync,
              {"driver": THREADS_DRIVER}, instrumented=True),)),
    Pair("threads-async", "threads run / run_in_executor",
        Side(LIBRARY, "threads run", "await ThreadOffloadRunner(limit=L).run, asyncio", threads.measure,
             {"driver": THREADS_DRIVER}),
        Side(HAND_WRITTEN, "run_in_executor", "gather over loop.run_in_executor, asyncio",
             hand_rolled.measure_run_in_executor)),
    Pair("semaphore-batch", f"semaphore batch={BATCH} / hand-written batch window",
        Side(LIBRARY, f"semaphore batch={BATCH}", f"SemaphoreRunner(limit=L, batch={BATCH}).run",
             semaphore.measure, {"batch": BATCH}),
        Side(HAND_WRITTEN, "hand-written batch window",
             f"L worker coroutines taking {BATCH} ops at a time from one shared iterator, an AsyncSession "
             "and one commit per batch", hand_batches.measure_window),
        target=BATCH_TARGET, subject=BATCHES, yardstick=BATCH_YARDSTICK),
    Pair("threads-batch", f"threads run_sync batch={BATCH} / hand-written batch threads",
        Side(LIBRARY, f"threads run_sync batch={BATCH}",
             f"ThreadOffloadRunner(limit=L, batch={BATCH}).run_sync, no loop", threads.measure_sync,
             {"driver": THREADS_DRIVER, "batch": BATCH}),
        Side(HAND_WRITTEN, "hand-written batch threads",
             f"ThreadPoolExecutor(L), L threads taking {BATCH} ops at a time from one shared iterator "
             "under a lock, a Session and one commit per batch, no loop", hand_batches.measure_threads),
        target=BATCH_TARGET, subject=BATCHES, yardstick=BATCH_YARDSTICK),
    *parity.PAIRS,
)}
# fmt: on


def goals(names: Iterable[str] | None = None) -> str:
    """
    The targets of the pairs ``names`` (default: all) in words: ``>= 0.97, semaphore-batch and
    threads-batch >= 0.95``; ``>= 0.95`` where only the batch pairs are named.
    """
    pairs = [PAIRS[name] for name in names] if names is not None else list(PAIRS.values())
    by_target: dict[float, list[str]] = {}
    for pair in pairs:
        by_target.setdefault(pair.target, []).append(pair.name)
    if len(by_target) <= 1:
        return f">= {next(iter(by_target), TARGET)}"
    shown = [f"{' and '.join(names)} >= {target}" for target, names in by_target.items() if target != TARGET]
    return ", ".join([f">= {TARGET}", *shown])


def run(ctx: Context) -> None:
    run_rounds(ctx, (pair for pair in PAIRS.values() if pair.study == GROUP), GROUP)


SCENARIO = Scenario(
    name="overhead",
    run=run,
    what="each runner against its hand-written equivalent, with peers, in interleaved rounds",
    section="Library overhead",
    seconds=WARMUP_S + DEFAULT_ROUNDS * SECONDS_PER_ROUND,
    index_pass=True,
)
