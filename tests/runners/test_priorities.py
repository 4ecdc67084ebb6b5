"""Priorities and a reserve on the real database: interactive units go ahead of bulk runs; the bound holds."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Iterator
from typing import Any

import anyio
import pytest
from anyio import wait_all_tasks_blocked
from sqlalchemy import text

from boundeddb import AutoLimit, RunnerStatistics
from tests.support.kits import CASE_IDS, CASES, Kit, StartGate, scalar_unit
from tests.support.probes import ActivitySampler

pytestmark = [pytest.mark.anyio, pytest.mark.postgres, pytest.mark.usefixtures("items_table")]
every_kind = pytest.mark.parametrize(("kind", "anyio_backend"), CASES, ids=CASE_IDS)

#: A bulk unit: 200 ms on the server, holding its connection.
BULK = text("SELECT CAST(:i AS integer) FROM pg_sleep(0.2)")
QUICK = text("SELECT CAST(:i AS integer)")
#: The issue's bound for an interactive unit's wait beside a saturating bulk run: "a few
#: milliseconds", generously; a bulk unit lasts four times as long. The typical (median) wait must
#: meet it; the longest must stay under a bulk unit's length (BULK_S: it never waited for a bulk unit
#: to end), since on a machine whose cores other processes want, the event loop itself waits for a
#: core now and then.
INTERACTIVE_WAIT_S = 0.05
BULK_S = 0.2


def timed_unit(kit: Kit, i: int, started: list[float]) -> Callable[[Any], Any]:
    """A quick unit that notes when it started (``perf_counter``) before it asks the server."""
    inner = scalar_unit(kit.is_async, QUICK, {"i": i})
    if kit.is_async:

        async def unit(session: Any) -> int:
            started.append(time.perf_counter())
            return int(await inner(session))

        return unit

    def sync_unit(session: Any) -> int:
        started.append(time.perf_counter())
        return int(inner(session))

    return sync_unit


def in_flight(stats: RunnerStatistics, priority: int) -> int:
    return stats.in_flight_by_priority.get(priority, 0)


@pytest.mark.serial  # interactive units' waits are measured: an idle machine's (the serial group)
@every_kind
async def test_interactive_submits_start_at_once_beside_a_bulk_run_that_fills_its_share(
    kit: Kit, sampler: ActivitySampler
) -> None:
    """
    limit=4, reserve=1: a bulk run of 200 ms units keeps 3 connections busy; 50 submits with
    priority=1 each start within a few milliseconds, and never more than 4 connections are open.
    """
    runner = kit.runner(limit=4, reserve=1)  # errors="raise": a failing bulk unit ends the test at once
    # Four connections in the pool first, so that no submit below pays for opening one.
    warm = await runner.run([scalar_unit(kit.is_async, BULK, {"i": i}) for i in range(4)], priority=1)
    assert warm.stats.peak_connections == 4
    done = False
    filled = StartGate(3)

    def bulk_units() -> Iterator[Callable[[Any], Any]]:
        i = 0
        while not done:
            yield kit.sleep_then_insert(i, BULK_S, filled)
            i += 1

    waits: list[float] = []
    peaks: list[RunnerStatistics] = []
    with sampler, anyio.fail_after(60):
        async with anyio.create_task_group() as group:
            bulk: list[Any] = []

            async def run_bulk() -> None:
                bulk.append(await runner.run(bulk_units()))

            group.start_soon(run_bulk)
            await filled.event.wait()
            for i in range(50):
                started: list[float] = []
                called = time.perf_counter()
                assert await runner.submit(timed_unit(kit, i, started), priority=1) == i
                waits.append(started[0] - called)
                peaks.append(runner.statistics())
                await anyio.sleep(0.01)  # a steady trickle of requests, not a synchronisation
            done = True
    report = bulk[0]
    assert report.stats.failed == 0
    assert report.stats.peak_in_flight == 3  # the reserve was never lent to the bulk run
    assert max(in_flight(stats, 0) for stats in peaks) <= 3
    assert statistics.median(waits) < INTERACTIVE_WAIT_S, sorted(waits)
    assert max(waits) < BULK_S, sorted(waits)[-5:]
    assert report.stats.peak_connections <= 4
    assert sampler.peak <= 4
    assert kit.pool.checkedout() == 0


@every_kind
async def test_a_cancelled_high_priority_waiter_gives_nothing_away(kit: Kit) -> None:
    """limit=2, reserve=1, both slots busy: a priority-1 submit cancelled while it waits takes no slot."""
    runner = kit.runner(limit=2, reserve=1, errors="collect")
    busy = StartGate(2)
    async with anyio.create_task_group() as group:
        group.start_soon(runner.run, [kit.sleep_then_insert(0, 0.5, busy)])
        group.start_soon(lambda: runner.submit(kit.sleep_then_insert(1, 0.5, busy), priority=1))
        await busy.event.wait()
        seen: list[RunnerStatistics] = []
        with anyio.CancelScope() as scope:
            group.start_soon(_cancel_once_blocked, runner, scope, seen)
            await runner.submit(kit.select(2), priority=1)
        assert scope.cancelled_caught
        assert seen[0].waiting_by_priority == {1: 1}  # it was waiting for a slot when cancelled
        stats = runner.statistics()
        assert (stats.in_flight, stats.waiting, dict(stats.waiting_by_priority)) == (2, 0, {})
    stats = runner.statistics()
    assert (stats.in_flight, stats.waiting) == (0, 0)
    assert repr(runner) == f"<{type(runner).__name__} limit=2 reserve=1 in_flight=0 waiting=0>"
    assert kit.pool.checkedout() == 0
    # Every slot is still there: both kinds of work run again.
    assert await runner.submit(kit.select(3), priority=1) == 3
    report = await runner.run([kit.select(i) for i in range(4)])
    assert report.values() == [0, 1, 2, 3]
    assert report.stats.peak_in_flight == 1


async def _cancel_once_blocked(runner: Any, scope: anyio.CancelScope, seen: list[RunnerStatistics]) -> None:
    await wait_all_tasks_blocked()
    seen.append(runner.statistics())
    scope.cancel()


@pytest.mark.parametrize(("kind", "anyio_backend"), [("semaphore", "asyncio")], ids=["semaphore"])
async def test_an_auto_limit_keeps_the_reserve_out_of_what_moves(kit: Kit) -> None:
    """AutoLimit(min_limit=1, max_limit=6), reserve=2: the limit moves within [3, 6], bulk gets it less 2."""
    runner = kit.runner(limit=AutoLimit(min_limit=1, max_limit=6), pool_size=6, reserve=2, errors="collect")
    assert runner.statistics().reserve == 2
    assert runner.limit == 6  # the default initial 4, plus the reserve, within the ceiling
    report = await runner.run([scalar_unit(kit.is_async, QUICK, {"i": i}) for i in range(300)])
    stats = report.stats
    assert 3 <= stats.limit_min <= stats.limit_max <= 6, stats.limit_trace
    assert stats.peak_in_flight <= stats.limit_max - 2
    assert stats.peak_connections <= 4
