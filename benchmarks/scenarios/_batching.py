"""
The ``batching`` scenario's parts (:mod:`.batching`): the request-log table, the workloads' units,
the hand-written batch loops, the web path's open-loop arrivals, and the counters of transactions,
batch times and rows.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import random
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Engine, MetaData, String, create_engine, event, insert, text
from sqlalchemy.ext.asyncio import AsyncEngine, async_sessionmaker
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column, sessionmaker
from sqlalchemy.pool import NullPool

from ..db.schema import SCHEMA
from ..harness import Context, Probe
from ..workload import Op, make_ops, op_async, op_sync

#: Units (so batches, so connections) in flight on every side.
LIMIT = 8
#: The share of units that fail on a duplicate key, and the key (seeded before each run).
FAIL_SHARE = 0.01
DUP_KEY = -1


class LogBase(DeclarativeBase):
    metadata = MetaData(schema=SCHEMA)


class LogRow(LogBase):
    """One request's log row: small, as a web app's request log is."""

    __tablename__ = "request_log"

    id: Mapped[int] = mapped_column(primary_key=True)
    request_id: Mapped[int] = mapped_column(unique=True)
    path: Mapped[str] = mapped_column(String(64))
    status: Mapped[int]
    duration_ms: Mapped[float]


def log_row(key: int) -> LogRow:
    return LogRow(request_id=key, path=f"/items/{key % 997}", status=404 if key % 10 == 0 else 200,
                  duration_ms=(key % 50) / 10)  # fmt: skip


@dataclass(frozen=True)
class Workload:
    name: str
    what: str
    #: The size the issue's goal is at.
    goal_size: int
    #: Units per side at ``batch=B``: this many times ``--n``.
    units_per_n: float
    #: Units per side at one transaction per unit: times ``--n``.  The same as ``units_per_n`` where
    #: a unit's cost grows with the tables (the mix's reads scan ``b``); fewer for log rows, whose
    #: cost does not (one insert, a unique index), so that the slow side stays short.
    single_per_n: float


WORKLOADS = (
    Workload("mix", "the post's mix (half creates, half reads)", 50, 0.5, 0.5),
    Workload("creates", "the post's creates (3 a + 5 b rows a unit)", 50, 0.5, 0.5),
    Workload("log", "request-log rows (one small ORM row a unit, not flushed)", 500, 4.0, 1.0),
)


@dataclass(frozen=True)
class Work:
    """The units of one measurement, as data: the ops (None: log rows) and which units fail."""

    workload: str
    n: int
    ops: tuple[Op, ...] | None
    failing: frozenset[int] = frozenset()

    def expected(self) -> dict[str, int]:
        """The rows the good units leave: every one exactly once."""
        good = [i for i in range(self.n) if i not in self.failing]
        if self.ops is None:
            return {"a": 0, "b": 0, "log": len(good)}
        creates = sum(1 for i in good if self.ops[i].kind == "create")
        return {"a": 3 * creates, "b": 5 * creates, "log": 0}


def make_work(ctx: Context, workload: Workload, *, single: bool = False, failing: bool = False) -> Work:
    """The units of ``workload`` for a side at one transaction per unit (``single``) or in batches."""
    n = max(20, round(len(ctx.ops) * (workload.single_per_n if single else workload.units_per_n)))
    rng = random.Random(ctx.seed)
    ops: tuple[Op, ...] | None = None
    if workload.name == "mix":
        ops = tuple(make_ops(n, ctx.seed))
    elif workload.name == "creates":
        ops = tuple(Op("create", rng.randint(1, 100_000)) for _ in range(n))
    bad = frozenset(rng.sample(range(n), max(1, round(n * FAIL_SHARE)))) if failing else frozenset()
    return Work(workload.name, n, ops, bad)


def async_unit(work: Work, i: int) -> Callable[[Any], Any]:
    """Unit ``i`` of ``work`` for an AsyncSession."""
    op = work.ops[i] if work.ops is not None else None
    fails = i in work.failing

    async def unit(session: Any) -> int:
        if op is not None:
            await op_async(session, op)
        if op is None or fails:
            session.add(log_row(DUP_KEY if fails else i))
            if op is not None:  # the post's ops flush in the unit: the unit raises
                await session.flush()
        return i

    return unit


def sync_unit(work: Work, i: int) -> Callable[[Session], int]:
    """Unit ``i`` of ``work`` for a Session (the twin of :func:`async_unit`)."""
    op = work.ops[i] if work.ops is not None else None
    fails = i in work.failing

    def unit(session: Session) -> int:
        if op is not None:
            op_sync(session, op)
        if op is None or fails:
            session.add(log_row(DUP_KEY if fails else i))
            if op is not None:
                session.flush()
        return i

    return unit


def reset(ctx: Context) -> None:
    """Fresh a, b and request_log tables, the duplicate key seeded; then the suite's CHECKPOINT."""
    engine = create_engine(ctx.db.driver_url("psycopg"), poolclass=NullPool,
                           connect_args={"application_name": ctx.app_name("batching setup")})  # fmt: skip
    try:
        with engine.begin() as conn:
            conn.execute(text(f"CREATE SCHEMA IF NOT EXISTS {SCHEMA}"))
            LogBase.metadata.drop_all(conn)
            LogBase.metadata.create_all(conn)
            conn.execute(insert(LogRow).values(request_id=DUP_KEY, path="/seed", status=200, duration_ms=0))
    finally:
        engine.dispose()
    ctx.reset()


async def warm(engine: AsyncEngine, n: int = LIMIT) -> None:
    """Open the pool's ``n`` connections before the timed part: no side pays for connecting."""
    async with contextlib.AsyncExitStack() as stack:
        for _ in range(n):
            conn = await stack.enter_async_context(engine.connect())
            await conn.execute(text("SELECT 1"))


def warm_sync(engine: Engine, n: int = LIMIT) -> None:
    """:func:`warm` for a sync engine."""
    with contextlib.ExitStack() as stack:
        for _ in range(n):
            stack.enter_context(engine.connect()).execute(text("SELECT 1"))


def count_rows(ctx: Context, work: Work) -> dict[str, Any]:
    """The rows the run left, against :meth:`Work.expected`; ``ok``: every good unit's exactly once."""
    with ctx.db.connect() as conn:
        row = conn.execute(
            f"SELECT (SELECT count(*) FROM {SCHEMA}.a), (SELECT count(*) FROM {SCHEMA}.b), "
            f"count(*), count(DISTINCT request_id) FROM {SCHEMA}.request_log WHERE request_id >= 0"
        ).fetchone()
    assert row is not None
    found = {"a": int(row[0]), "b": int(row[1]), "log": int(row[2]), "log_distinct": int(row[3])}
    expected = work.expected()
    ok = all(found[k] == v for k, v in expected.items()) and found["log_distinct"] == found["log"]
    return {"expected": expected, "found": found, "ok": ok}


def count_transactions(sync_engine: Any) -> dict[str, int]:
    """Transactions committed and rolled back on ``sync_engine`` from now on (its engine events)."""
    counts = {"commits": 0, "rollbacks": 0}
    lock = threading.Lock()

    def counter(key: str) -> Callable[[Any], None]:
        def bump(conn: Any) -> None:
            with lock:
                counts[key] += 1

        return bump

    event.listen(sync_engine, "commit", counter("commits"))
    event.listen(sync_engine, "rollback", counter("rollbacks"))
    return counts


async def hand_async(sessions: async_sessionmaker[Any], work: Work, size: int, p: Probe) -> list[float]:
    """
    LIMIT coroutines, each taking ``size`` units at a time: one AsyncSession, one commit. A batch
    that fails is rolled back and its units run again one transaction each, as a careful hand would;
    those that fail alone count in ``p.failed``. The good units' latencies are returned.
    """
    todo = iter([async_unit(work, i) for i in range(work.n)])
    latencies: list[float] = []

    async def commit(units: list[Any]) -> None:
        async with sessions() as session:
            for unit in units:
                await unit(session)
            await session.commit()

    async def worker() -> None:
        while batch := list(itertools.islice(todo, size)):
            start = time.perf_counter()
            try:
                await commit(batch)
            except Exception:
                for unit in batch:
                    try:
                        await commit([unit])
                    except Exception:
                        p.failed += 1
                    else:
                        latencies.append(time.perf_counter() - start)
            else:
                latencies.extend([time.perf_counter() - start] * len(batch))
            p.done += len(batch)

    await asyncio.gather(*(worker() for _ in range(LIMIT)))
    return latencies


def hand_threads(sessions: sessionmaker[Session], work: Work, size: int, p: Probe) -> list[float]:
    """LIMIT threads, each taking ``size`` units at a time: one Session, one commit; as hand_async."""
    todo = iter([sync_unit(work, i) for i in range(work.n)])
    lock = threading.Lock()
    latencies: list[float] = []

    def commit(units: list[Any]) -> None:
        with sessions() as session:
            for unit in units:
                unit(session)
            session.commit()

    def worker() -> None:
        while True:
            with lock:
                batch = list(itertools.islice(todo, size))
            if not batch:
                return
            start = time.perf_counter()
            try:
                commit(batch)
                good, failed = len(batch), 0
            except Exception:
                good = failed = 0
                for unit in batch:
                    try:
                        commit([unit])
                        good += 1
                    except Exception:
                        failed += 1
            with lock:
                latencies.extend([time.perf_counter() - start] * good)
                p.failed += failed
                p.done += len(batch)

    with ThreadPoolExecutor(LIMIT, thread_name_prefix="hand-batch") as pool:
        for future in [pool.submit(worker) for _ in range(LIMIT)]:
            future.result()
    return latencies


def time_batches(session_class: type[Session]) -> list[float]:
    """Each committed transaction of ``session_class``'s sessions: first statement to COMMIT done, s."""
    started: dict[int, float] = {}
    durations: list[float] = []
    event.listen(session_class, "after_begin", lambda s, t, c: started.setdefault(id(s), time.perf_counter()))
    event.listen(session_class, "after_rollback", lambda s: started.pop(id(s), None))

    def committed(session: Session) -> None:
        start = started.pop(id(session), None)
        if start is not None:
            durations.append(time.perf_counter() - start)

    event.listen(session_class, "after_commit", committed)
    return durations


def arrivals(n: int, rate: float, seed: int) -> list[float]:
    """
    ``n`` Poisson arrival times at ``rate`` per second, in seconds from the start: seeded, so every
    variant of a round gets the same schedule.
    """
    rng = random.Random(seed)
    return list(itertools.accumulate(rng.expovariate(rate) for _ in range(n)))


async def open_loop(
    submit: Callable[[int], Any], schedule: list[float], p: Probe, errors: list[str]
) -> tuple[list[float], list[float]]:
    """
    Request ``k`` starts as a task at ``schedule[k]`` and awaits ``submit(k)`` once; the schedule
    never waits for earlier requests.  Returns each request's ``submit()`` latency (from its call
    to its return) and how late each started after its arrival time (the event loop's delay).
    """
    latencies: list[float] = []
    lags: list[float] = []

    async def request(k: int, due: float) -> None:
        start = time.perf_counter()
        lags.append(max(0.0, start - due))
        try:
            await submit(k)
        except Exception as exc:
            errors.append(f"{type(exc).__name__}: {exc}"[:200])
            return
        latencies.append(time.perf_counter() - start)
        p.tick()

    tasks = []
    t0 = time.perf_counter()
    for k, at in enumerate(schedule):
        if (delay := t0 + at - time.perf_counter()) > 0:
            await asyncio.sleep(delay)
        tasks.append(asyncio.create_task(request(k, t0 + at)))
    await asyncio.gather(*tasks)
    return latencies, lags
