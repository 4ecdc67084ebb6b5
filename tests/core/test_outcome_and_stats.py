"""Outcome and RunReport as values; RunStats and the probes that fill it (the pool gauge)."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from typing import Any

import anyio
import pytest
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession, async_sessionmaker

from boundeddb import Outcome, RunnerClosedError, RunReport, RunStats, SemaphoreRunner
from boundeddb._executors.checkouts import _gauges
from boundeddb._outcome import committed_outcome
from boundeddb._stats import percentile
from tests.support.kits import StartGate


def make_stats(**changes: Any) -> RunStats:
    fields: dict[str, Any] = {
        "submitted": 3,
        "succeeded": 1,
        "failed": 2,
        "elapsed_s": 1.5,
        "throughput": 2.0,
        "latency_p50_s": 0.1,
        "latency_p95_s": 0.2,
        "latency_p99_s": 0.3,
        "latency_max_s": 0.4,
        "peak_in_flight": 2,
        "peak_connections": 2,
    }
    fields.update(changes)
    return RunStats(**fields)


# -- Outcome ---------------------------------------------------------------------------------------


def test_outcome_is_frozen_and_slotted() -> None:
    """An Outcome cannot be changed after the fact, and carries no per-instance __dict__."""
    outcome = Outcome(0, 1, None, 0.1, 0.0)
    with pytest.raises(dataclasses.FrozenInstanceError):
        outcome.value = 2  # type: ignore[misc]
    assert not hasattr(outcome, "__dict__")


def test_a_committed_outcome_made_on_the_fast_path_equals_the_dataclass_one() -> None:
    """``_outcome.committed_outcome()`` sets every field, as ``Outcome(...)`` with an error of None does."""
    fast = committed_outcome(7, "v", 0.25, 0.5, 3, True)
    assert fast == Outcome(7, "v", None, 0.25, 0.5, 3, commit_verified=True)
    assert [getattr(fast, f.name) for f in dataclasses.fields(Outcome)] == [
        7,
        "v",
        None,
        0.25,
        0.5,
        3,
        False,
        True,
        False,
    ]
    assert committed_outcome(1, None, 0.0, 0.0) == Outcome(1, None, None, 0.0, 0.0)
    with pytest.raises(dataclasses.FrozenInstanceError):
        fast.value = "w"  # type: ignore[misc]


def test_outcome_ok_and_unwrap_for_a_value() -> None:
    """A committed unit's outcome is ok and unwraps to its value (None is a fine value)."""
    assert Outcome(0, 42, None, 0.1, 0.0).ok
    assert Outcome(0, 42, None, 0.1, 0.0).unwrap() == 42
    assert Outcome(1, None, None, 0.1, 0.0).unwrap() is None
    assert Outcome(0, 42, None, 0.1, 0.0).attempts == 1


def test_outcome_unwrap_raises_the_very_error_object() -> None:
    """unwrap() of a failed unit raises its own exception object, not a copy or a wrapper."""
    error = LookupError("gone")
    outcome: Outcome[int] = Outcome(3, None, error, 0.1, 0.0, attempts=2)
    assert not outcome.ok
    with pytest.raises(LookupError) as caught:
        outcome.unwrap()
    assert caught.value is error


def test_outcomes_compare_as_values() -> None:
    """Two outcomes with equal fields are equal; any differing field makes them differ."""
    assert Outcome(0, "a", None, 0.1, 0.0) == Outcome(0, "a", None, 0.1, 0.0)
    assert Outcome(0, "a", None, 0.1, 0.0) != Outcome(0, "a", None, 0.1, 0.0, attempts=2)


# -- RunReport -------------------------------------------------------------------------------------


@pytest.fixture
def mixed_report() -> RunReport[str]:
    return RunReport(
        [
            Outcome(0, "a", None, 0.1, 0.0),
            Outcome(1, None, KeyError("first"), 0.1, 0.0),
            Outcome(2, "c", None, 0.1, 0.0),
            Outcome(3, None, ValueError("second"), 0.1, 0.0),
        ],
        make_stats(submitted=4, succeeded=2, failed=2),
    )


def test_report_values_in_input_order() -> None:
    """values() of a report without failures is the values in input order."""
    report = RunReport([Outcome(i, i * 10, None, 0.1, 0.0) for i in range(4)], make_stats(failed=0))
    assert report.values() == [0, 10, 20, 30]
    assert report.failures == []


def test_report_values_raises_the_first_failures_own_exception(mixed_report: RunReport[str]) -> None:
    """values() raises the exception object of the first failed unit in input order."""
    with pytest.raises(KeyError) as caught:
        mixed_report.values()
    assert caught.value is mixed_report.outcomes[1].error


def test_report_failures_are_the_failed_outcomes_in_order(mixed_report: RunReport[str]) -> None:
    """failures lists the failed units' outcomes, in input order."""
    assert mixed_report.failures == [mixed_report.outcomes[1], mixed_report.outcomes[3]]


def test_a_reports_repr_counts_its_outcomes_instead_of_listing_them(mixed_report: RunReport[str]) -> None:
    """The repr stays short for a million outcomes (asyncio.Runner takes it twice on Python 3.11)."""
    assert repr(mixed_report).startswith(
        "RunReport(outcomes=<4 outcomes, 2 failed>, stats=RunStats(submitted=4"
    )
    big = RunReport([Outcome(i, i, None, 0.1, 0.0) for i in range(100_000)], make_stats(failed=0))
    assert len(repr(big)) < 1000


def test_report_is_frozen(mixed_report: RunReport[str]) -> None:
    """A RunReport cannot be changed after the run."""
    with pytest.raises(dataclasses.FrozenInstanceError):
        mixed_report.stats = make_stats()  # type: ignore[misc]


# -- RunStats and percentile -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("values", "fraction", "expected"),
    [
        ([], 0.5, 0.0),
        ([], 0.99, 0.0),
        ([7.0], 0.0, 7.0),
        ([7.0], 0.99, 7.0),
        # Wikipedia's nearest-rank example: 15, 20, 35, 40, 50.
        ([15.0, 20.0, 35.0, 40.0, 50.0], 0.05, 15.0),
        ([15.0, 20.0, 35.0, 40.0, 50.0], 0.30, 20.0),
        ([15.0, 20.0, 35.0, 40.0, 50.0], 0.40, 20.0),
        ([15.0, 20.0, 35.0, 40.0, 50.0], 0.50, 35.0),
        ([15.0, 20.0, 35.0, 40.0, 50.0], 1.00, 50.0),
        ([float(i) for i in range(1, 101)], 0.50, 50.0),
        ([float(i) for i in range(1, 101)], 0.95, 95.0),
        ([float(i) for i in range(1, 101)], 0.99, 99.0),
        ([float(i) for i in range(1, 11)], 0.0, 1.0),
        ([float(i) for i in range(1, 11)], 0.95, 10.0),
    ],
)
def test_percentile_is_nearest_rank(values: list[float], fraction: float, expected: float) -> None:
    """percentile() picks the value at rank ceil(fraction * n), at least 1; none gives 0.0."""
    assert percentile(values, fraction) == expected


def test_run_stats_is_frozen_with_defaults() -> None:
    """RunStats is a frozen value; loop lag is None and retried 0 unless measured."""
    stats = make_stats()
    assert stats.loop_lag_p99_s is None
    assert stats.loop_lag_max_s is None
    assert stats.retried == 0
    with pytest.raises(dataclasses.FrozenInstanceError):
        stats.failed = 0  # type: ignore[misc]
    assert stats == make_stats()
    assert dataclasses.replace(stats, retried=1) != stats


# -- the pool gauge (real PostgreSQL) --------------------------------------------------------------


async def select_one(session: AsyncSession) -> int:
    return int((await session.execute(text("SELECT 1"))).scalar_one())


@pytest.fixture
def anyio_backend() -> str:
    """asyncpg and AsyncSession run on asyncio only."""
    return "asyncio"


@pytest.fixture
def engine(make_async_engine: Any) -> AsyncEngine:
    engine: AsyncEngine = make_async_engine(pool_size=6)
    return engine


@pytest.mark.postgres
@pytest.mark.anyio
async def test_two_runs_at_once_each_see_their_own_peak(engine: AsyncEngine) -> None:
    """A run's peak counts the whole pool during its own lifetime, and nothing after it ended."""
    sessions = async_sessionmaker(engine)
    first, second = SemaphoreRunner(sessions, limit=1), SemaphoreRunner(sessions, limit=3)
    first_holds, first_may_finish = anyio.Event(), anyio.Event()
    second_holding = StartGate(3)
    reports: dict[str, RunReport[int]] = {}

    async def first_unit(session: AsyncSession) -> int:
        await select_one(session)  # a unit holds its connection from its start
        first_holds.set()
        await first_may_finish.wait()
        return 1

    async def second_unit(session: AsyncSession) -> int:
        await select_one(session)
        second_holding.arrive(from_thread=False)
        await second_holding.event.wait()  # all three hold a connection at once
        return 2

    async def run_first() -> None:
        reports["first"] = await first.run([first_unit])

    with anyio.fail_after(20):
        async with anyio.create_task_group() as group:
            group.start_soon(run_first)
            await first_holds.wait()
            reports["second"] = await second.run([second_unit] * 3)  # 1 + 3 checked out at once
            first_may_finish.set()
        reports["third"] = await first.run([first_unit])  # both earlier runs have ended
    assert reports["first"].stats.peak_connections == 4  # its own 1, and the second run's 3
    assert reports["second"].stats.peak_connections == 4
    assert reports["first"].stats.peak_in_flight == 1
    assert reports["second"].stats.peak_in_flight == 3
    assert reports["third"].stats.peak_connections == 1  # not charged for what came before


@pytest.mark.postgres
@pytest.mark.anyio
async def test_peak_connections_counts_other_code_using_the_same_pool(engine: AsyncEngine) -> None:
    """peak_connections is pool-wide: it counts what other code checks out of the same pool during the run."""
    runner = SemaphoreRunner(async_sessionmaker(engine), limit=1)
    holding, others_hold = anyio.Event(), anyio.Event()

    async def unit(session: AsyncSession) -> int:
        value = await select_one(session)
        holding.set()
        await others_hold.wait()
        return value

    async def run() -> None:
        report = await runner.run([unit])
        assert report.stats.peak_in_flight == 1
        assert report.stats.peak_connections == 3  # the unit's one, plus the two below

    with anyio.fail_after(20):
        async with anyio.create_task_group() as group:
            group.start_soon(run)
            await holding.wait()
            async with engine.connect() as one, engine.connect() as two:
                await one.execute(text("SELECT 1"))
                await two.execute(text("SELECT 1"))
                others_hold.set()


# -- the pool gauge lets go of runs that ended -----------------------------------------------------
#
# Known bug (the three tests after the first fail today): StatsRecorder.__init__ registers a watch
# on the pool's gauge (_stats.py, watch_pool) and only StatsRecorder.finish() removes it, but
# BaseRunner._run_units and _stream_units (_runners/base.py) call finish() only on the normal
# path. A cancelled run, a stream the consumer leaves early, and a call refused by _bound()
# (closed runner, RunnerBusyElsewhereError) leave their watch behind for the life of the pool:
# memory grows, and every checkout walks every dead watch under the gauge's lock.
# Unwatching in a `finally` (or creating the recorder inside `with self._bound()`) fixes all three.


def watches(engine: AsyncEngine) -> int:
    """How many runs the pool's gauge still reports checkouts to."""
    gauge = _gauges.get(engine.sync_engine.pool)
    return 0 if gauge is None else len(gauge._trackers)


async def slow(session: AsyncSession) -> None:
    await session.execute(text("SELECT pg_sleep(30)"))


@pytest.mark.postgres
@pytest.mark.anyio
async def test_a_finished_run_stops_watching_the_pool(engine: AsyncEngine) -> None:
    """After a run (even one whose units failed), the gauge no longer updates its stats."""
    runner = SemaphoreRunner(async_sessionmaker(engine), limit=2, errors="collect")

    async def failing(session: AsyncSession) -> None:
        raise KeyError(session)

    await runner.run([select_one, failing])
    assert watches(engine) == 0


@pytest.mark.postgres
@pytest.mark.anyio
async def test_a_cancelled_run_stops_watching_the_pool(engine: AsyncEngine) -> None:
    """A cancelled run must unwatch the pool, or every checkout walks an ever-growing set of dead runs."""
    runner = SemaphoreRunner(async_sessionmaker(engine), limit=2)
    gate = StartGate(1)

    async def started_then_slow(session: AsyncSession) -> None:
        gate.arrive(from_thread=False)
        await slow(session)

    with anyio.fail_after(20):
        async with anyio.create_task_group() as group:
            group.start_soon(runner.run, [started_then_slow])
            await gate.event.wait()
            group.cancel_scope.cancel()
    assert watches(engine) == 0


@pytest.mark.postgres
@pytest.mark.anyio
async def test_a_stream_left_early_stops_watching_the_pool(engine: AsyncEngine) -> None:
    """Breaking out of stream() (its documented use) must unwatch the pool too."""
    runner = SemaphoreRunner(async_sessionmaker(engine), limit=2)

    def units() -> Iterator[Any]:
        while True:
            yield select_one

    outcomes = runner.stream(units())
    async for _ in outcomes:
        break
    await outcomes.aclose()
    assert watches(engine) == 0


@pytest.mark.postgres
@pytest.mark.anyio
async def test_a_refused_run_stops_watching_the_pool(engine: AsyncEngine) -> None:
    """A run refused by a closed runner must not leave a watch on the pool behind."""
    runner = SemaphoreRunner(async_sessionmaker(engine), limit=2)
    await runner.aclose()
    with pytest.raises(RunnerClosedError):
        await runner.run([select_one])
    assert watches(engine) == 0
