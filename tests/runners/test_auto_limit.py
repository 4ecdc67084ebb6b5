"""limit="auto" on the real database: the bound holds while the limit moves, and it goes where it should."""

from __future__ import annotations

from typing import Any

import pytest
from sqlalchemy import text
from sqlalchemy.ext.asyncio import async_sessionmaker
from sqlalchemy.orm import sessionmaker

from boundeddb import AutoLimit, ChunkedRunner, SemaphoreRunner, ThreadOffloadRunner
from tests.support.kits import CASE_IDS, CASES, Kit, scalar_unit
from tests.support.probes import ActivitySampler

AUTO_CASES = [(k, b) for k, b in CASES if k != "chunked"]
AUTO_IDS = [i for i, (k, _) in zip(CASE_IDS, CASES, strict=False) if k != "chunked"]
#: Where the limit climbs: each runner on each event loop, on one driver each (the climb is the
#: runner's; psycopg2 runs the same path in the other tests here).
CLIMB_CASES = [(k, b) for k, b in AUTO_CASES if k != "threads-psycopg2"]
CLIMB_IDS = [i for i, (k, _) in zip(AUTO_IDS, AUTO_CASES, strict=True) if k != "threads-psycopg2"]
CAPACITY = 12

pytestmark = [pytest.mark.anyio]
every_kind = pytest.mark.parametrize(("kind", "anyio_backend"), AUTO_CASES, ids=AUTO_IDS)
climb_kinds = pytest.mark.parametrize(("kind", "anyio_backend"), CLIMB_CASES, ids=CLIMB_IDS)
asyncio_only = pytest.mark.parametrize("anyio_backend", ["asyncio"])


#: Mostly waits on the server (50 ms): more in flight is better, up to the pool.
WAITING = text("SELECT CAST(:i AS integer) FROM pg_sleep(0.05)")
#: Keeps a server core busy: on 2 cores, more than a few in flight only queue.
BUSY = text("SELECT count(*) * 0 + CAST(:i AS integer) FROM generate_series(1, 400000)")
#: Busy units per run: the climb's first window (which doubles the limit) ended after about 36 of them
#: (0.9 s) on a quiet machine here, of 400 then; 150 leave it room on a busy one.
BUSY_UNITS = 150


def sql_unit(kit: Kit, sql: Any, i: int) -> Any:
    """A unit of the kit's shape that runs ``sql`` and returns its one value (``i``)."""
    return scalar_unit(kit.is_async, sql, {"i": i})


@pytest.mark.serial  # how far it climbs is measured: an idle machine's (the serial group)
@climb_kinds
async def test_units_that_wait_raise_the_limit_towards_the_pool_and_never_past_it(
    kit: Kit, sampler: ActivitySampler
) -> None:
    runner = kit.runner(limit="auto", pool_size=CAPACITY, errors="collect")
    assert runner.limit == 4  # where an auto limit starts
    with sampler:
        report = await runner.run([sql_unit(kit, WAITING, i) for i in range(600)])
    stats = report.stats
    assert [o.value for o in report.outcomes] == list(range(600))
    assert stats.peak_connections <= CAPACITY
    assert sampler.peak <= CAPACITY
    assert stats.peak_in_flight <= stats.limit_max <= CAPACITY
    assert stats.limit_max >= CAPACITY - 2, stats.limit_trace
    assert stats.limit_trace[0][0] == 0.0
    assert len(stats.limit_trace) > 2


@pytest.mark.serial  # how far it climbs is measured: an idle machine's (the serial group)
@climb_kinds
async def test_a_stream_of_units_that_wait_lets_the_limit_rise_past_its_start(kit: Kit) -> None:
    """stream() pulls ahead for the limit's ceiling, not for where it starts (4: 8 pulled ahead)."""
    runner = kit.runner(limit="auto", pool_size=CAPACITY, errors="collect")
    limits, in_flight, values = [], [], []
    async for outcome in runner.stream(sql_unit(kit, WAITING, i) for i in range(600)):
        values.append(outcome.value)
        limits.append(runner.limit)
        in_flight.append(runner.in_flight)
    assert sorted(values) == list(range(600))
    assert max(limits) >= CAPACITY - 2, limits
    assert max(in_flight) > 2 * 4  # more in flight than a lookahead of twice the initial limit allows
    assert all(n <= CAPACITY for n in limits)


@climb_kinds
async def test_units_that_make_the_server_work_move_the_limit_within_the_pool_and_never_past_it(
    kit: Kit, sampler: ActivitySampler
) -> None:
    """
    Units that keep a server core busy: the limit moves (the climb's first window doubles it) and
    neither it nor the connections ever pass the pool. Where it ends is the machine's business: on
    2 quiet cores more than a few only queue, but beside busy processes more units in flight win
    more of the cores (limit 16 of 24 in one run on a loaded machine), so that part is tested on
    throughput models in test_core_adaptive.py
    (test_beside_busy_processes_the_limit_rises_only_as_far_as_more_units_win_more_of_the_cores).
    """
    runner = kit.runner(limit="auto", pool_size=CAPACITY * 2, errors="collect")
    with sampler:
        report = await runner.run([sql_unit(kit, BUSY, i) for i in range(BUSY_UNITS)])
    stats = report.stats
    assert stats.failed == 0
    assert [o.value for o in report.outcomes] == list(range(BUSY_UNITS))
    assert sampler.peak <= CAPACITY * 2
    assert stats.peak_connections <= CAPACITY * 2
    assert stats.peak_in_flight <= stats.limit_max <= CAPACITY * 2, stats.limit_trace
    assert stats.limit_trace[:2] == ((0.0, 4), (stats.limit_trace[1][0], 8)), stats.limit_trace


@every_kind
async def test_a_fixed_limit_reports_itself_as_its_trace(kit: Kit) -> None:
    runner = kit.runner(limit=3)
    report = await runner.run([kit.select(i) for i in range(10)])
    stats = report.stats
    assert (stats.limit_min, stats.limit_max, stats.limit_final) == (3, 3, 3)
    assert stats.limit_trace == ((0.0, 3),)


@every_kind
async def test_max_limit_above_the_pool_names_both_numbers(kit: Kit) -> None:
    with pytest.raises(ValueError, match=r"max_limit=9 .*capacity is 6"):
        kit.runner(limit=AutoLimit(max_limit=9), pool_size=6)
    with pytest.raises(TypeError, match=r"limit must be an int >= 1, got 'automatic'"):
        kit.runner(limit="automatic", pool_size=6)
    runner = kit.runner(limit=AutoLimit(min_limit=2, max_limit=5, initial=3), pool_size=6)
    assert runner.limit == 3


@asyncio_only
async def test_auto_needs_a_ceiling_on_a_pool_without_capacity(make_async_engine: Any) -> None:
    engine = make_async_engine(max_overflow=-1)  # a QueuePool without a cap
    with pytest.raises(ValueError, match=r"needs a ceiling.*QueuePool.*AutoLimit\(max_limit=N\)"):
        SemaphoreRunner(async_sessionmaker(engine), limit="auto")
    runner = SemaphoreRunner(async_sessionmaker(engine), limit=AutoLimit(max_limit=8))
    assert runner.limit == 4


@asyncio_only
async def test_chunked_runner_says_auto_is_not_for_it(make_async_engine: Any) -> None:
    engine = make_async_engine(pool_size=5)
    with pytest.raises((TypeError, ValueError), match="chunk_size"):
        ChunkedRunner(async_sessionmaker(engine), chunk_size="auto")  # type: ignore[arg-type]


def test_bad_auto_settings_are_refused_with_the_fix(make_sync_engine: Any) -> None:
    engine = make_sync_engine("psycopg", pool_size=5)
    with pytest.raises(ValueError, match=r"min_limit=...\) must be >= 1, got 0"):
        AutoLimit(min_limit=0)
    with pytest.raises(ValueError, match=r"max_limit=2\) is below min_limit=3"):
        AutoLimit(min_limit=3, max_limit=2)
    with pytest.raises(TypeError, match=r"initial=...\) must be an int"):
        AutoLimit(initial=2.5)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"min_limit=6\) is above the most the limit may reach, 5"):
        ThreadOffloadRunner(sessionmaker(engine), limit=AutoLimit(min_limit=6))
