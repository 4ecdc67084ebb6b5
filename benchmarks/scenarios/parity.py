"""
``parity``: ``submit()`` against the plain code a web app writes without the library, and
``ThreadOffloadRunner``'s batches of request-log rows against a hand-written thread batch loop.

Issue #45's pairs, measured as the overhead pairs are (:func:`._pairs.run_rounds`: interleaved
rounds, alternating order; ``--scenario instructions`` counts them under callgrind):

* ``submit-16``, ``submit-64``: ``callers`` coroutines (16 or 64), each taking the next op of one
  shared sequence and awaiting ``SemaphoreRunner(limit=4).submit(unit)``, against the same callers
  each opening ``async with sessions.begin() as session:`` for its op (asyncpg): what a web handler
  writes without the library. Both on a pool of 4 (``max_overflow=0``), so 12 or 60 callers wait,
  in the runner's limiter or in the pool's queue. ``submit-16`` has ``submit(unit, priority=1)``
  as a peer.
* ``threads-submit-16``, ``threads-submit-64``: the same callers awaiting
  ``ThreadOffloadRunner(limit=4).submit(unit)`` (psycopg), against
  ``await anyio.to_thread.run_sync(call)`` where ``call`` opens ``with sessions.begin() as session:``:
  what FastAPI does with a sync endpoint (anyio's default 40 threads).
* ``threads-batch-log50``, ``threads-batch-log500``: ``ThreadOffloadRunner(limit=8,
  batch=B).run_sync(units)``, each unit adding one request-log row (:mod:`._batching`), against
  :func:`._batching.hand_threads`: 8 threads each taking B units at a time, one Session and one
  commit. An op of these pairs is ``ROWS_PER_OP`` rows, so that a round holds enough batches of 500.

The goal of all of them: the library at least 0.95 of the plain code (ops/s, median of the
rounds), and at most 1.05 times its instructions per op.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Any

import anyio.to_thread
from sqlalchemy.orm import Session, sessionmaker

from boundeddb import ThreadOffloadRunner

from ..harness import Context, Probe
from ..scenario import Scenario
from ..workload import Op, async_unit, op_async, op_sync, sync_unit
from . import _batching
from ._pairs import HAND_WRITTEN, LIBRARY, Pair, Side, run_rounds
from ._runner import record
from .hand_rolled import async_probe, sync_probe
from .semaphore import probed_runner

GROUP = "overhead"
STUDY = "parity"
#: The pool of the submit pairs (the issue's measurement: 16 callers on a pool of 4).
SUBMIT_POOL = 4
#: The goal: the library >= this fraction of the plain code's ops/s, and of its instructions per op
#: (plain / library), i.e. at most 5% more.
PARITY_TARGET = 0.95
#: Request-log rows per op in the thread batch pairs.
ROWS_PER_OP = 8
#: Rough seconds of the warm-up and of one round of every pair at N >= 3,000.
SECONDS_PER_ROUND = 60


async def _callers(
    call: Callable[[Op], Awaitable[Any]], ops: list[Op], callers: int, p: Probe
) -> list[float]:
    """``callers`` coroutines awaiting ``call(op)`` for the next op of ``ops`` until none is left."""
    todo = iter(ops)
    latencies: list[float] = []

    async def caller() -> None:
        for op in todo:
            start = time.perf_counter()
            await call(op)
            latencies.append(time.perf_counter() - start)
            p.tick()

    await asyncio.gather(*(caller() for _ in range(callers)))
    return latencies


async def measure_submit(
    ctx: Context, limit: int, ops: list[Op], *, group: str, label: str, callers: int, priority: int = 0
) -> None:
    """``callers`` coroutines awaiting ``SemaphoreRunner(limit).submit(unit, priority=priority)``."""
    ctx.reset()
    extra = {"callers": callers, "priority": priority, "verb": "submit"}
    async with probed_runner(ctx, limit, label, total=len(ops), group=group, scenario=STUDY, extra=extra) as (
        runner,
        p,
    ):
        p.latencies = await _callers(
            lambda op: runner.submit(async_unit(op), priority=priority), ops, callers, p
        )


async def measure_plain(
    ctx: Context, limit: int, ops: list[Op], *, group: str, label: str, callers: int
) -> None:
    """``callers`` coroutines each opening ``async with sessions.begin()`` for their op."""
    way = f"{callers} callers, async with sessions.begin() per call"
    async with async_probe(ctx, limit, ops, label, group, way, STUDY, callers=callers) as (sessions, p):

        async def call(op: Op) -> None:
            async with sessions.begin() as session:
                await op_async(session, op)

        p.latencies = await _callers(call, ops, callers, p)


async def measure_threads_submit(
    ctx: Context, limit: int, ops: list[Op], *, group: str, label: str, callers: int, priority: int = 0
) -> None:
    """``callers`` coroutines awaiting ``ThreadOffloadRunner(limit).submit(unit, priority=priority)``."""
    way = f"{callers} callers, ThreadOffloadRunner.submit, {{driver}}"
    settings = {"callers": callers, "priority": priority, "verb": "submit"}
    with sync_probe(ctx, limit, ops, label, group, way, STUDY, **settings) as (sessions, probe):
        async with ThreadOffloadRunner(sessions, limit=limit, errors="collect") as runner:
            with probe as p:
                submit = runner.submit
                p.latencies = await _callers(
                    lambda op: submit(sync_unit(op), priority=priority), ops, callers, p
                )


def _plain_sync(sessions: sessionmaker[Session], op: Op) -> None:
    with sessions.begin() as session:
        op_sync(session, op)


async def measure_threads_plain(
    ctx: Context, limit: int, ops: list[Op], *, group: str, label: str, callers: int
) -> None:
    """``callers`` coroutines awaiting ``anyio.to_thread.run_sync`` of a ``sessions.begin()`` block."""
    way = f"{callers} callers, anyio.to_thread.run_sync of a sessions.begin() block per call, {{driver}}"
    with (
        sync_probe(ctx, limit, ops, label, group, way, STUDY, callers=callers) as (sessions, probe),
        probe as p,
    ):
        call = anyio.to_thread.run_sync
        p.latencies = await _callers(lambda op: call(_plain_sync, sessions, op), ops, callers, p)


def _log_work(ops: list[Op]) -> _batching.Work:
    return _batching.Work("log", ROWS_PER_OP * len(ops), None)


def measure_log_batches(
    ctx: Context, limit: int, ops: list[Op], *, group: str, label: str, batch: int, hand: bool = False
) -> None:
    """
    ``ROWS_PER_OP`` request-log rows per op through ``ThreadOffloadRunner(limit, batch=batch).run_sync``,
    or with ``hand`` through :func:`._batching.hand_threads` (its ``LIMIT`` threads: ``limit``).
    """
    _batching.reset(ctx)
    work = _log_work(ops)
    way = "hand-written batch threads" if hand else "ThreadOffloadRunner.run_sync"
    settings = {"batch": batch, "workload": "log", "rows_per_op": ROWS_PER_OP}
    with sync_probe(
        ctx, limit, ops, label, group, f"{way}, request-log rows, {{driver}}", STUDY, **settings
    ) as (
        sessions,
        probe,
    ):
        _batching.warm_sync(sessions.kw["bind"], limit)
        units = [_batching.sync_unit(work, i) for i in range(work.n)]
        if hand:
            with probe as p:
                latencies = _batching.hand_threads(sessions, work, batch, p)
                p.latencies = latencies[::ROWS_PER_OP]
            return
        with ThreadOffloadRunner(sessions, limit=limit, errors="collect", batch=batch) as runner, probe as p:
            record(p, runner.run_sync(units))
            p.latencies = p.latencies[::ROWS_PER_OP]
            p.failed //= ROWS_PER_OP


def _submit_pairs(callers: int, counted: bool) -> tuple[Pair, Pair]:
    def side(key: str, name: str, what: str, measure: Callable[..., Any], **more: Any) -> Side:
        return Side(key, name, what, measure, {"callers": callers, **more}, limit=SUBMIT_POOL)

    shared: dict[str, Any] = {"target": PARITY_TARGET, "subject": "submit()", "study": STUDY,
                              "counted": counted, "yardstick": "a plain session per call"}  # fmt: skip
    plain, awaiting = f"{callers} callers, plain session per call", f"{callers} callers awaiting"
    priority = f"submit priority=1 x{callers}", "submit(unit, priority=1)", measure_submit
    return (
        Pair(f"submit-{callers}", f"submit x{callers} / {plain}",
             side(LIBRARY, f"submit x{callers}", f"{awaiting} SemaphoreRunner(limit=4).submit(unit)",
                  measure_submit),
             side(HAND_WRITTEN, f"plain x{callers}",
                  f"{callers} callers, async with sessions.begin() per call", measure_plain),
             (side("priority", *priority, priority=1),) if callers == 16 else (), **shared),
        Pair(f"threads-submit-{callers}", f"threads submit x{callers} / {plain} in a thread",
             side(LIBRARY, f"threads submit x{callers}",
                  f"{awaiting} ThreadOffloadRunner(limit=4).submit(unit)", measure_threads_submit),
             side(HAND_WRITTEN, f"plain threads x{callers}",
                  f"{callers} callers, anyio.to_thread.run_sync of a sessions.begin() block",
                  measure_threads_plain), **shared),
    )  # fmt: skip


def _log_pair(batch: int) -> Pair:
    options = {"batch": batch}
    return Pair(
        f"threads-batch-log{batch}",
        f"threads run_sync batch={batch} / hand-written batch threads, log rows",
        Side(LIBRARY, f"threads batch={batch} log",
             f"ThreadOffloadRunner(limit=8, batch={batch}).run_sync, {ROWS_PER_OP} request-log rows an op",
             measure_log_batches, options, limit=_batching.LIMIT),
        Side(HAND_WRITTEN, f"hand batch threads {batch} log",
             f"8 threads taking {batch} units at a time, a Session and one commit each, request-log rows",
             measure_log_batches, {**options, "hand": True}, limit=_batching.LIMIT),
        target=PARITY_TARGET, subject="the library's batches", yardstick="the hand-written batch loop",
        study=STUDY,
    )  # fmt: skip


PAIRS: tuple[Pair, ...] = (
    *_submit_pairs(16, counted=True),
    *_submit_pairs(64, counted=False),
    _log_pair(50),
    _log_pair(500),
)


def run(ctx: Context) -> None:
    run_rounds(ctx, PAIRS, GROUP)


SCENARIO = Scenario(
    name=STUDY,
    run=run,
    what="submit() at 16 and 64 callers against a plain session per call, async and in threads; "
    "thread batches of request-log rows at 50 and 500 against a hand-written loop",
    section="Library overhead",
    seconds=10 + 3 * SECONDS_PER_ROUND,
    default=False,
)
