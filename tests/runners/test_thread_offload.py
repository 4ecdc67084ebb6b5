"""ThreadOffloadRunner: the event loop stays free, its own limiter, run_sync from plain code."""

from __future__ import annotations

import threading
import time
from array import array
from time import perf_counter
from typing import Any

import anyio
import anyio.lowlevel
import anyio.to_thread
import pytest
from sqlalchemy import text
from sqlalchemy.orm import Session, sessionmaker

from boundeddb import ThreadOffloadRunner
from boundeddb._stats import percentile
from tests.support.kits import StartGate

pytestmark = [pytest.mark.postgres]

BACKENDS = ["asyncio", "trio"]
UNIT_S = 0.05


def sleeping_unit(session: Session) -> int:
    """Blocks in the driver (not in Python) for UNIT_S on the server."""
    return int(session.execute(text("SELECT 1 FROM pg_sleep(:s)"), {"s": UNIT_S}).scalar_one())


class Ticker:
    """Measures how late the event loop wakes a 5 ms timer: the test's own loop-lag probe."""

    def __init__(self) -> None:
        self.lags: array[float] = array("d")

    async def run(self) -> None:
        while True:
            start = perf_counter()
            await anyio.sleep(0.005)
            self.lags.append(perf_counter() - start - 0.005)

    def percentile(self, q: float) -> float:
        return percentile(sorted(self.lags), q)


@pytest.mark.anyio
@pytest.mark.parametrize("anyio_backend", BACKENDS)
async def test_loop_stays_free_while_units_block_in_the_driver(make_sync_engine: Any) -> None:
    """300 units blocking in pg_sleep never hold the loop up for anything near a unit's duration."""
    runner = ThreadOffloadRunner(sessionmaker(make_sync_engine("psycopg", pool_size=10)), limit=10)
    ticker = Ticker()
    async with anyio.create_task_group() as group:
        group.start_soon(ticker.run)
        report = await runner.run(sleeping_unit for _ in range(300))
        group.cancel_scope.cancel()
    assert report.stats.succeeded == 300
    # A unit run on the loop would hold it for as long as a unit takes (UNIT_S on the server, more
    # when the machine is busy: the run's median latency), and nearly every tick would be that late.
    # When other processes want the cores, the loop's own thread also waits for one now and then, so
    # the tail measures the machine: the test reads the ticker's median and p90, not its p99 (nor
    # the runner's probe's), against the units' own latency.
    blocked = max(UNIT_S, report.stats.latency_p50_s)
    assert len(ticker.lags) > 20, "too few ticks to tell"
    p50, p90 = ticker.percentile(0.5), ticker.percentile(0.9)
    lags = f"ticks' lag p50 {p50:.4f} s, p90 {p90:.4f} s; a unit's {blocked:.4f} s"
    assert p50 < blocked / 2, lags
    assert p90 < blocked, lags
    assert report.stats.loop_lag_p99_s is not None  # the runner's own probe ran


@pytest.mark.anyio
@pytest.mark.parametrize("anyio_backend", BACKENDS)
async def test_the_same_units_run_inline_block_the_loop(make_sync_engine: Any) -> None:
    """Control: the ticker does see a loop blocked by the same units run inline on it."""
    sessions = sessionmaker(make_sync_engine("psycopg", pool_size=2))
    ticker = Ticker()
    async with anyio.create_task_group() as group:
        group.start_soon(ticker.run)
        await anyio.sleep(0.02)  # let the ticker take its first timer
        for _ in range(10):
            with sessions() as session:
                sleeping_unit(session)
            await anyio.lowlevel.checkpoint()
        group.cancel_scope.cancel()
    assert max(ticker.lags) >= UNIT_S * 0.9


@pytest.mark.anyio
@pytest.mark.parametrize("anyio_backend", BACKENDS)
async def test_threads_run_under_the_runners_own_limiter(make_sync_engine: Any) -> None:
    """50 units meet at a barrier: only possible with 50 threads, above anyio's default of 40."""
    limit = 50
    engine = make_sync_engine("psycopg", pool_size=limit)
    runner = ThreadOffloadRunner(sessionmaker(engine), limit=limit)
    barrier = threading.Barrier(limit, timeout=30)
    default_limiter = anyio.to_thread.current_default_thread_limiter()

    def meet(session: Session) -> int:
        session.execute(text("SELECT 1"))
        return barrier.wait()

    report = await runner.run([meet] * limit)
    assert sorted(report.values()) == list(range(limit))
    assert default_limiter.borrowed_tokens == 0


def test_run_sync_from_plain_code(make_sync_engine: Any) -> None:
    """run_sync serves sync programs: values in order, no loop lag (no loop of the caller's ran)."""
    runner = ThreadOffloadRunner(sessionmaker(make_sync_engine("psycopg2", pool_size=4)))

    def unit_for(i: int) -> Any:
        def unit(session: Session) -> int:
            return int(session.execute(text("SELECT CAST(:i AS integer)"), {"i": i}).scalar_one())

        return unit

    report = runner.run_sync(unit_for(i) for i in range(100))
    assert report.values() == list(range(100))
    assert report.stats.peak_in_flight <= 4
    assert report.stats.loop_lag_p99_s is None
    # A second call works (a new private loop each time).
    assert runner.run_sync([unit_for(7)]).values() == [7]


def test_with_statement_closes_the_runner(make_sync_engine: Any) -> None:
    """A ThreadOffloadRunner is also a plain context manager for sync programs."""
    with ThreadOffloadRunner(sessionmaker(make_sync_engine("psycopg", pool_size=2))) as runner:
        assert runner.run_sync([lambda s: 1]).values() == [1]
    assert "closed" in repr(runner)


@pytest.mark.anyio
@pytest.mark.parametrize("anyio_backend", BACKENDS)
async def test_a_statement_sent_after_the_cancellation_is_stopped_too(make_sync_engine: Any) -> None:
    """
    A cancel request stops only the statement running when it arrives. Units that are busy in
    Python when their run is cancelled, and send a 60 s statement afterwards, must be stopped too.
    """
    engine = make_sync_engine("psycopg", pool_size=2)
    runner = ThreadOffloadRunner(sessionmaker(engine), limit=2)
    gate = StartGate(2)

    def unit(session: Session) -> int:
        session.execute(text("SELECT 1"))
        gate.arrive(from_thread=True)
        time.sleep(0.3)  # the unit's own work, in Python: the cancellation arrives meanwhile
        return int(session.execute(text("SELECT 1 FROM pg_sleep(60)")).scalar_one())

    with anyio.fail_after(20):  # 60 s statements: only a cancellation that reaches them ends this early
        async with anyio.create_task_group() as group:
            group.start_soon(runner.run, [unit] * 4)
            await gate.event.wait()
            group.cancel_scope.cancel()
    assert engine.pool.checkedout() == 0
