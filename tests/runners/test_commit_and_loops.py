"""A timeout during COMMIT, the chunk barrier, one runner on two event loops, a stream on a busy loop."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator
from typing import Any

import anyio
import anyio.to_thread
import pytest
from sqlalchemy import text
from sqlalchemy.engine import Engine
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker
from sqlalchemy.orm import Session, sessionmaker

from boundeddb import (
    ChunkedRunner,
    RunnerBusyElsewhereError,
    SemaphoreRunner,
    ThreadOffloadRunner,
    UnitTimeout,
)
from tests.support.faults import wait_until
from tests.support.models import Item
from tests.support.probes import committed_units

pytestmark = [pytest.mark.postgres]


@pytest.fixture
def slow_commit(admin: Engine, items_table: None) -> Iterator[None]:
    """A deferred constraint trigger that sleeps 2 s when a transaction that inserted an item commits."""
    with admin.connect() as connection:
        connection.execute(
            text(
                "CREATE FUNCTION slow_commit() RETURNS trigger LANGUAGE plpgsql AS "
                "$$ BEGIN PERFORM pg_sleep(2); RETURN NULL; END $$"
            )
        )
        connection.execute(
            text(
                "CREATE CONSTRAINT TRIGGER slow_commit AFTER INSERT ON items "
                "DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION slow_commit()"
            )
        )
    yield
    with admin.connect() as connection:
        connection.execute(text("DROP TRIGGER IF EXISTS slow_commit ON items"))
        connection.execute(text("DROP FUNCTION IF EXISTS slow_commit()"))


async def insert_item(session: AsyncSession) -> int:
    session.add(Item(key="k0", unit=0))
    await session.flush()  # fast: the trigger is deferred to COMMIT
    return 0


@pytest.mark.anyio
@pytest.mark.parametrize("anyio_backend", ["asyncio"])
@pytest.mark.usefixtures("slow_commit")
async def test_a_timeout_during_commit_is_reported_as_commit_unknown(
    make_async_engine: Any, admin: Engine
) -> None:
    """An async unit whose COMMIT outlives the timeout fails with commit_unknown set, unretried."""
    from boundeddb import RetryPolicy, SemaphoreRunner

    retry_all = RetryPolicy(attempts=5, initial_delay=0.01, retry_on=lambda error: True)
    runner = SemaphoreRunner(
        async_sessionmaker(make_async_engine(pool_size=2)),
        limit=2,
        timeout=0.5,
        errors="collect",
        retry=retry_all,
    )
    report = await runner.run([insert_item])
    [outcome] = report.outcomes
    assert isinstance(outcome.error, UnitTimeout)
    assert outcome.commit_unknown is True
    assert outcome.attempts == 1, "a commit of unknown fate is never retried, whatever the policy"
    # Here the cancel request reached the server in time, so the commit did not happen.
    assert committed_units(admin) == []


@pytest.mark.usefixtures("slow_commit")
def test_a_thread_units_slow_commit_is_not_interrupted_and_is_reported_truthfully(
    make_sync_engine: Any, admin: Engine
) -> None:
    """A thread unit's COMMIT is not cut short (a thread cannot be): it committed, and says so."""
    # statement_timeout (SET LOCAL) bounds the unit's statements; observed on PostgreSQL 15/16, it
    # does not stop deferred work at COMMIT. The transaction commits after 2 s, past timeout=0.5:
    # reporting UnitTimeout would claim a rollback that did not happen, so the outcome is ok.

    def insert(session: Session) -> int:
        session.add(Item(key="k0", unit=0))
        session.flush()
        return 0

    runner = ThreadOffloadRunner(
        sessionmaker(make_sync_engine("psycopg", pool_size=2)), limit=2, timeout=0.5, errors="collect"
    )
    report = runner.run_sync([insert])
    [outcome] = report.outcomes
    assert outcome.ok
    assert outcome.latency_s > 0.5
    assert committed_units(admin) == [0]


@pytest.mark.anyio
@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_chunked_runner_waits_for_the_whole_chunk(make_async_engine: Any) -> None:
    """No unit of chunk k+1 starts before every unit of chunk k has finished (the barrier)."""
    chunk = 4
    runner = ChunkedRunner(async_sessionmaker(make_async_engine(pool_size=chunk)), chunk_size=chunk)
    events: list[tuple[str, int]] = []

    def unit_for(i: int) -> Any:
        async def unit(session: AsyncSession) -> int:
            events.append(("start", i))
            # The first unit of each chunk is slow, so a sliding window would overtake it.
            seconds = 0.2 if i % chunk == 0 else 0.0
            await session.execute(text("SELECT pg_sleep(CAST(:s AS float))"), {"s": seconds})
            events.append(("end", i))
            return i

        return unit

    report = await runner.run(unit_for(i) for i in range(3 * chunk))
    assert report.values() == list(range(3 * chunk))
    for k in range(1, 3):
        first_start = events.index(("start", k * chunk))
        previous_ends = [events.index(("end", i)) for i in range((k - 1) * chunk, k * chunk)]
        assert max(previous_ends) < first_start


def test_a_runner_busy_on_one_loop_refuses_another(make_sync_engine: Any) -> None:
    """While a run is in flight on one event loop, a call from another loop is refused clearly."""
    runner = ThreadOffloadRunner(sessionmaker(make_sync_engine("psycopg", pool_size=2)), limit=2)
    started = threading.Event()
    release = threading.Event()

    def blocking_unit(session: Session) -> int:
        session.execute(text("SELECT 1"))
        started.set()
        release.wait(30)
        return 1

    result: list[Any] = []
    other = threading.Thread(target=lambda: result.append(runner.run_sync([blocking_unit])))
    other.start()
    try:
        assert started.wait(30)
        with pytest.raises(RunnerBusyElsewhereError, match="has work in flight on another event loop"):
            anyio.run(runner.run, [lambda session: 2])
    finally:
        release.set()
        other.join(30)
    assert result[0].values() == [1]
    # Once the first loop is done, the runner serves the next loop.
    assert runner.run_sync([lambda session: 3]).values() == [3]


def insert_item_sync(session: Session) -> int:
    session.add(Item(key="k0", unit=0))
    session.flush()
    return 0


@pytest.mark.anyio
@pytest.mark.parametrize(("kind", "anyio_backend"), [("async", "asyncio"), ("threads", "asyncio")])
@pytest.mark.usefixtures("slow_commit")
async def test_a_commit_under_way_when_the_run_is_cancelled_finishes(
    kind: str, make_async_engine: Any, make_sync_engine: Any, admin: Engine, app_name: str
) -> None:
    """Cancelled while the server runs its COMMIT: the commit completes (its outcome is known), then the
    cancellation propagates, with the connection back in the pool."""
    runner: Any
    if kind == "async":
        engine = make_async_engine(pool_size=1)
        pool = engine.sync_engine.pool
        runner = SemaphoreRunner(async_sessionmaker(engine), limit=1)
        unit: Any = insert_item
    else:
        sync_engine = make_sync_engine("psycopg", pool_size=1)
        pool = sync_engine.pool
        runner = ThreadOffloadRunner(sessionmaker(sync_engine), limit=1)
        unit = insert_item_sync

    def committing() -> bool:
        with admin.connect() as connection:
            return bool(
                connection.execute(
                    text(
                        "SELECT count(*) FROM pg_stat_activity WHERE application_name = :app "
                        "AND state = 'active' AND query LIKE 'COMMIT%'"
                    ),
                    {"app": app_name},
                ).scalar_one()
            )

    with anyio.fail_after(20):
        async with anyio.create_task_group() as group:
            group.start_soon(runner.run, [unit])
            await anyio.to_thread.run_sync(wait_until, committing, 15, "the runner's COMMIT to begin")
            group.cancel_scope.cancel()
    assert committed_units(admin) == [0]
    assert pool.checkedout() == 0


@pytest.mark.anyio
@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_a_stream_hands_over_outcomes_that_settled_together_in_one_turn_of_the_loop(
    make_async_engine: Any,
) -> None:
    """
    Eight units released at once reach the consumer within two turns of the event loop, not one per
    turn (which on a busy loop filled the lookahead window and left slots idle).
    """
    loop = asyncio.get_running_loop()
    turns, ticking = 0, True

    def tick() -> None:  # once per turn of the loop: call_soon runs it in the next one
        nonlocal turns
        turns += 1
        if ticking:
            loop.call_soon(tick)

    limit, bursts = 8, 5
    gates = [anyio.Event() for _ in range(bursts)]
    all_in = [anyio.Event() for _ in range(bursts)]
    arrived = [0] * bursts

    def unit_for(i: int) -> Any:
        burst = i // limit

        async def unit(session: AsyncSession) -> int:
            arrived[burst] += 1
            if arrived[burst] == limit:
                all_in[burst].set()
            await gates[burst].wait()
            return i

        return unit

    async def release() -> None:
        for gate, ready in zip(gates, all_in, strict=True):
            await ready.wait()
            gate.set()

    runner = SemaphoreRunner(async_sessionmaker(make_async_engine(pool_size=limit)), limit=limit)
    seen: dict[int, set[int]] = {}
    loop.call_soon(tick)
    async with anyio.create_task_group() as group:
        group.start_soon(release)
        async for outcome in runner.stream(unit_for(i) for i in range(limit * bursts)):
            seen.setdefault(outcome.index // limit, set()).add(turns)
    ticking = False
    assert sorted(seen) == list(range(bursts))
    assert all(len(at) <= 2 for at in seen.values()), seen


@pytest.mark.anyio
@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_a_stream_keeps_its_limit_filled_on_a_busy_event_loop(make_async_engine: Any) -> None:
    """
    A stream's worker takes its next unit without a turn of the event loop while the lookahead has
    room: on a loop that another task keeps busy, waiting a turn per unit left a slot idle about one
    unit in eight (7.0 of 8 in flight, below the 0.9 an auto limit's window needs to count as filled).
    """
    limit = 8
    runner = SemaphoreRunner(async_sessionmaker(make_async_engine(pool_size=limit)), limit=limit)
    in_flight: list[int] = []

    async def unit(session: AsyncSession) -> int:
        await asyncio.sleep(0.001)
        in_flight.append(runner.in_flight)
        return 1

    async def busy(stop: anyio.Event) -> None:  # the rest of an application on the same loop
        while not stop.is_set():
            time.sleep(0.0003)  # noqa: ASYNC251 - it holds the loop, as a busy application does
            await asyncio.sleep(0)

    stop = anyio.Event()
    async with anyio.create_task_group() as group:
        group.start_soon(busy, stop)
        done = [outcome async for outcome in runner.stream(unit for _ in range(1000))]
        stop.set()
    assert len(done) == 1000
    assert sum(in_flight) / len(in_flight) >= limit - 0.5
