"""
The public API as users see it, checked with `mypy --strict tests/typing/api.py`; never executed.

pytest does not collect this file (its name does not start with ``test_``). Each ``assert_type``
pins an inferred type; each ``# type: ignore[code]`` pins a mistake the checker must catch
(``warn_unused_ignores``, part of ``--strict``, fails if it no longer does).
"""

from __future__ import annotations

import sys
from collections.abc import AsyncIterator
from typing import Any

from rich.progress import Progress
from sqlalchemy import Column, Integer, MetaData, String, Table, create_engine
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker, create_async_engine
from sqlalchemy.orm import Session, sessionmaker

import boundeddb
from boundeddb import (
    BoundedDBError,
    ChunkedRunner,
    Journal,
    LoadFailed,
    LoadReport,
    Outcome,
    ProcessRunner,
    RejectedRow,
    RetryPolicy,
    RowRefused,
    RunFailed,
    RunnerStatistics,
    RunReport,
    RunStats,
    SemaphoreRunner,
    ThreadOffloadRunner,
    UnitTimeout,
    UnpicklableError,
    WorkerLostError,
    WorkerStartError,
    is_transient,
    pgbouncer_engine_options,
)

if sys.version_info >= (3, 11):
    from typing import assert_type
else:
    from typing_extensions import assert_type

async_sessions = async_sessionmaker(create_async_engine("postgresql+asyncpg://localhost/test"))
sync_sessions = sessionmaker(create_engine("postgresql+psycopg://localhost/test"))


async def unit(session: AsyncSession) -> int:
    return 1


async def fn(session: AsyncSession, item: str) -> float:
    return float(len(item))


def sync_unit(session: Session) -> str:
    return "s"


def sync_fn(session: Session, item: int) -> bytes:
    return bytes(item)


async def items() -> AsyncIterator[str]:
    yield "a"


async def semaphore_runner() -> None:
    runner = SemaphoreRunner(async_sessions, limit=3, errors="collect", retry=RetryPolicy(), timeout=1.5)
    assert_type(runner.limit, int)
    assert_type(runner.in_flight, int)

    report = await runner.run([unit])
    assert_type(report, RunReport[int])
    assert_type(report.values(), list[int])
    assert_type(report.failures, list[Outcome[int]])
    assert_type(report.stats, RunStats)
    assert_type(await runner.run(unit for _ in range(3)), RunReport[int])

    assert_type(await runner.map(fn, ["a", "b"]), RunReport[float])
    assert_type(await runner.map(fn, items()), RunReport[float])
    assert_type(await runner.submit(unit), int)

    async for outcome in runner.stream([unit]):
        assert_type(outcome, Outcome[int])
        assert_type(outcome.value, int | None)
        assert_type(outcome.error, Exception | None)
        assert_type(outcome.unwrap(), int)
        assert_type(outcome.ok, bool)
        assert_type(outcome.index, int)
        assert_type(outcome.attempts, int)
        assert_type(outcome.latency_s, float)
        assert_type(outcome.commit_unknown, bool)
        assert_type(outcome.commit_verified, bool)

    async with SemaphoreRunner(async_sessions) as entered:
        assert_type(entered, SemaphoreRunner)
    await runner.aclose()


async def priorities_and_reserve() -> None:
    runner = SemaphoreRunner(async_sessions, limit=4, reserve=1)
    assert_type(await runner.run([unit], priority=1), RunReport[int])
    assert_type(await runner.map(fn, ["a"], priority=-1), RunReport[float])
    assert_type(await runner.submit(unit, priority=2), int)
    async for outcome in runner.stream([unit], priority=1):
        assert_type(outcome, Outcome[int])
    stats = runner.statistics()
    assert_type(stats, RunnerStatistics)
    assert_type(stats.waiting_by_priority[1], int)
    assert_type(stats.in_flight_by_priority.get(0, 0), int)
    assert_type((stats.limit, stats.reserve, stats.in_flight, stats.waiting), tuple[int, int, int, int])
    await runner.submit(unit, priority="high")  # type: ignore[arg-type]
    ChunkedRunner(async_sessions, chunk_size=4, reserve=1)
    threads = ThreadOffloadRunner(sync_sessions, limit=4, reserve=1)
    assert_type(await threads.submit(sync_unit, priority=1), str)
    assert_type(threads.run_sync([sync_unit], priority=1), RunReport[str])
    assert_type(threads.statistics(), RunnerStatistics)
    stats.limit = 3  # type: ignore[misc]


async def watching_a_run() -> None:
    runner = SemaphoreRunner(async_sessions, limit=4)
    seen: list[int] = []

    def log_int(outcome: Outcome[int]) -> None:
        seen.append(outcome.index)

    assert_type(await runner.run([unit], progress=True, on_outcome=log_int), RunReport[int])
    assert_type(await runner.map(fn, ["a"], progress="backfill", on_outcome=print), RunReport[float])
    assert_type(await runner.run([unit], progress=Progress()), RunReport[int])
    async for outcome in runner.stream([unit], on_outcome=log_int, progress=False):
        assert_type(outcome, Outcome[int])
    threads = ThreadOffloadRunner(sync_sessions, limit=4)
    assert_type(threads.run_sync([sync_unit], progress=True, on_outcome=lambda o: None), RunReport[str])
    assert_type(await threads.map(sync_fn, [1], progress="x"), RunReport[bytes])
    await runner.run([unit], on_outcome=log_str)  # type: ignore[misc]
    await runner.run([unit], progress=3)  # type: ignore[arg-type]


def log_str(outcome: Outcome[str]) -> None:
    pass


def verified_commits() -> None:
    SemaphoreRunner(async_sessions, verify_commits=True, retry=RetryPolicy())
    ChunkedRunner(async_sessions, chunk_size=4, verify_commits=True)
    ThreadOffloadRunner(sync_sessions, limit=4, verify_commits=False)
    SemaphoreRunner(async_sessions, verify_commits="yes")  # type: ignore[arg-type]


async def chunked_runner() -> None:
    runner = ChunkedRunner(async_sessions, chunk_size=10)
    assert_type(runner.chunk_size, int)
    assert_type(await runner.run([unit]), RunReport[int])
    assert_type(await runner.map(fn, ["a"]), RunReport[float])
    assert_type(await runner.submit(unit), int)
    async with ChunkedRunner(async_sessions, chunk_size=10) as entered:
        assert_type(entered, ChunkedRunner)


async def thread_offload_runner() -> None:
    runner = ThreadOffloadRunner(sync_sessions, limit=4)
    assert_type(await runner.run([sync_unit]), RunReport[str])
    assert_type(await runner.map(sync_fn, [1, 2]), RunReport[bytes])
    assert_type(await runner.submit(sync_unit), str)
    async for outcome in runner.stream([sync_unit]):
        assert_type(outcome, Outcome[str])
    async with ThreadOffloadRunner(sync_sessions) as entered:
        assert_type(entered, ThreadOffloadRunner)


def thread_offload_runner_from_sync_code() -> None:
    with ThreadOffloadRunner(sync_sessions, limit=4) as runner:
        assert_type(runner, ThreadOffloadRunner)
        report = runner.run_sync([sync_unit])
        assert_type(report, RunReport[str])
        assert_type(report.values(), list[str])
    runner.close()


def stats(report: RunReport[int]) -> None:
    s = report.stats
    assert_type(s.submitted, int)
    assert_type(s.succeeded, int)
    assert_type(s.failed, int)
    assert_type(s.retried, int)
    assert_type(s.commits_verified, int)
    assert_type(s.peak_in_flight, int)
    assert_type(s.peak_connections, int)
    assert_type(s.elapsed_s, float)
    assert_type(s.throughput, float)
    assert_type(s.latency_p50_s, float)
    assert_type(s.latency_p95_s, float)
    assert_type(s.latency_p99_s, float)
    assert_type(s.latency_max_s, float)
    assert_type(s.loop_lag_p99_s, float | None)
    assert_type(s.loop_lag_max_s, float | None)


def behind_a_pooler() -> None:
    options = pgbouncer_engine_options("postgresql+asyncpg://app@pgbouncer:6432/app")
    assert_type(options, dict[str, Any])
    create_async_engine("postgresql+asyncpg://app@pgbouncer:6432/app", pool_size=5, **options)
    pgbouncer_engine_options(5)  # type: ignore[arg-type]


def errors_and_retry(error: Exception) -> None:
    assert_type(is_transient(error), bool)
    policy = RetryPolicy(attempts=5, retry_on=lambda e: isinstance(e, KeyError))
    assert_type(policy.delay(2), float)
    assert_type(policy.should_retry(error, 1), bool)
    try:
        pass
    except RunFailed as failed:
        assert_type(failed.report, RunReport[Any])
        assert_type(failed.exceptions, tuple[Exception, ...])
    except UnitTimeout as timeout:
        assert_type(timeout.index, int)
        assert_type(timeout.timeout, float)
    except BoundedDBError:
        pass
    assert_type(boundeddb.__version__, str)


async def mistakes_the_checker_catches() -> None:
    runner = SemaphoreRunner(async_sessions)
    threads = ThreadOffloadRunner(sync_sessions)
    SemaphoreRunner(async_sessions, errors="ignore")  # type: ignore[arg-type]
    SemaphoreRunner(async_sessions, 3)  # type: ignore[call-arg]
    SemaphoreRunner(sync_sessions)  # type: ignore[arg-type]
    ThreadOffloadRunner(async_sessions)  # type: ignore[arg-type]
    await runner.run([sync_unit])  # type: ignore[arg-type]
    await runner.submit(sync_unit)  # type: ignore[arg-type]
    threads.run_sync([unit])  # type: ignore[list-item]
    _ = await threads.submit(unit)  # type: ignore[arg-type]
    await runner.map(fn, [1, 2])  # type: ignore[arg-type]
    RetryPolicy(retry_on=3)  # type: ignore[arg-type]


async def async_item(session: AsyncSession, item: int) -> str:
    return str(item)


def sync_item(session: Session, item: int) -> bytes:
    return b""


async def across_processes() -> None:
    async with ProcessRunner("postgresql+psycopg://app@db/app", limit=8, processes=2) as runner:
        assert_type(await runner.map(async_item, [1, 2]), RunReport[str])
        assert_type(await runner.map(sync_item, range(3)), RunReport[bytes])
        assert_type(runner.limit, int)
        assert_type(runner.processes, int)
    with ProcessRunner("postgresql+psycopg://app@db/app", limit=8, errors="collect") as sync_runner:
        assert_type(sync_runner.map_sync(sync_item, [1]), RunReport[bytes])
        assert_type(sync_runner.map_sync(async_item, [1]), RunReport[str])
    ProcessRunner("postgresql://db/app")  # type: ignore[call-arg]
    ProcessRunner("postgresql://db/app", limit=2, errors="ignore")  # type: ignore[arg-type]
    try:
        pass
    except WorkerLostError as lost:
        assert_type(lost, WorkerLostError)
    except (WorkerStartError, UnpicklableError):
        pass


async def observed(seen: list[Outcome[Any]]) -> None:
    boundeddb.instrument()
    boundeddb.instrument(meter_provider=None, tracer_provider=None)
    runner = SemaphoreRunner(async_sessions, limit=4, on_outcome=seen.append)
    threads = ThreadOffloadRunner(sync_sessions, limit=4, on_outcome=lambda outcome: None)
    assert_type(await runner.submit(unit, on_outcome=lambda outcome: None), int)
    assert_type(await threads.submit(sync_unit, on_outcome=print), str)
    stats = runner.statistics()
    assert_type(stats.succeeded, int)
    assert_type(stats.commit_unknown, int)
    assert_type(stats.slot_wait_s, float)
    RetryPolicy(on_retry=lambda error, attempt, delay: None)
    RetryPolicy(on_retry=3)  # type: ignore[arg-type]
    boundeddb.instrument(3)  # type: ignore[call-arg, arg-type]
    boundeddb.uninstrument()


async def loads() -> None:
    table = Table("customers", MetaData(), Column("id", Integer, primary_key=True), Column("email", String))
    rows = [{"id": 1, "email": "a@example.com"}]
    runner = SemaphoreRunner(async_sessions, limit=4)
    report = await runner.load(table, rows, batch=1000, journal=Journal("import"))
    assert_type(report, LoadReport)
    assert_type(report.loaded, int)
    assert_type(report.skipped, int)
    assert_type(report.transactions, int)
    for rejected in report.rejected:
        assert_type(rejected, RejectedRow)
        assert_type(rejected.index, int)
        assert_type(rejected.error, Exception)
        orig = getattr(rejected.error, "orig", None)
        if isinstance(orig, RowRefused):  # found in a set: reads as the server's error
            assert_type(orig.sqlstate, str)
            assert_type(orig.constraint_name, str)
            assert_type(orig.diag.constraint_name, str)
            assert_type(orig.pgcode, str)
    assert_type(await runner.load(table, [(1, "a")], columns=["id", "email"], errors="raise"), LoadReport)
    threads = ThreadOffloadRunner(sync_sessions, limit=4)
    assert_type(await threads.load(table, rows), LoadReport)
    assert_type(threads.load_sync(table, rows, journal=Journal("import")), LoadReport)
    assert_type(runner.statistics().rows_loaded, int)
    await runner.load(table, rows, errors="ignore")  # type: ignore[arg-type]
    try:
        pass
    except LoadFailed as failed:
        assert_type(failed.report, LoadReport)
