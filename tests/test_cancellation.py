"""Cancellation: a unit in flight when its run is cancelled is rolled back, whatever it does after."""

from __future__ import annotations

import asyncio
import collections
import gc
import random
import threading
import time
from typing import Any

import anyio
import anyio.lowlevel
import pytest
from sqlalchemy import event, text
from sqlalchemy.engine import Engine
from sqlalchemy.ext.asyncio import AsyncSession
from sqlalchemy.orm import Session

from boundeddb import RetryPolicy
from tests.conftest import Item
from tests.faults import assert_no_open_transactions
from tests.kits import CASE_IDS, CASES, Kit

pytestmark = [pytest.mark.postgres, pytest.mark.anyio, pytest.mark.usefixtures("items_table")]


def rows_per_unit(admin: Engine) -> dict[int, int]:
    with admin.connect() as connection:
        return dict(collections.Counter(connection.execute(text("SELECT unit FROM items")).scalars()))


class Finished:
    """When each unit's last statement returned (time.monotonic, from any thread)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.at: dict[int, float] = {}

    def mark(self, i: int) -> None:
        with self._lock:
            self.at[i] = time.monotonic()


def pausing_unit(kit: Kit, i: int, pause: float, finished: Finished, *, swallow: bool = False) -> Any:
    """Insert a row, wait ``pause`` s in Python (not in a statement), insert a second row."""
    if kit.is_async:

        async def unit(session: AsyncSession) -> int:
            session.add(Item(key=f"k{i}a", unit=i))
            await session.flush()
            try:
                await asyncio.sleep(pause)
            except asyncio.CancelledError:
                if not swallow:
                    raise
            session.add(Item(key=f"k{i}b", unit=i))
            await session.flush()
            finished.mark(i)
            return i

        return unit

    def sync_unit(session: Session) -> int:
        session.add(Item(key=f"k{i}a", unit=i))
        session.flush()
        time.sleep(pause)  # a thread cannot be interrupted here: the cancellation must wait
        session.add(Item(key=f"k{i}b", unit=i))
        session.flush()
        finished.mark(i)
        return i

    return sync_unit


@pytest.fixture
def kit(kind: str, request: pytest.FixtureRequest, make_sync_engine: Any) -> Kit:
    async_factory = None if kind.startswith("threads") else request.getfixturevalue("make_async_engine")
    return Kit(kind, async_factory, make_sync_engine)


@pytest.mark.parametrize(("kind", "anyio_backend"), CASES, ids=CASE_IDS)
async def test_units_in_flight_when_the_run_is_cancelled_never_commit(kit: Kit, admin: Engine) -> None:
    """Units still running when the run is cancelled roll back, even if they go on and return."""
    runner = kit.runner(limit=5)
    rng = random.Random(8)
    finished = Finished()
    # An async unit may swallow the cancellation and go on: it must not be committed either.
    units = [
        pausing_unit(kit, i, rng.uniform(0.1, 0.3), finished, swallow=kit.is_async and i % 2 == 0)
        for i in range(60)
    ]
    cancelled_at = 0.0
    with anyio.fail_after(30):
        async with anyio.create_task_group() as group:
            group.start_soon(runner.run, units)
            await anyio.sleep(0.7)
            cancelled_at = time.monotonic()
            group.cancel_scope.cancel()
    assert kit.pool.checkedout() == 0, "connections are back when the cancellation propagates"
    assert runner.in_flight == 0
    rows = rows_per_unit(admin)
    assert all(count == 2 for count in rows.values()), f"half-written units: {rows}"
    late = sorted(i for i in rows if finished.at[i] > cancelled_at)
    assert late == [], f"units that finished after the cancellation were committed: {late}"
    assert rows, "some units finished before the cancellation (the test needs them as a control)"
    # The runner is still usable.
    assert (await runner.run([kit.select(7)])).values() == [7]


# -- repeated random cancellation, with retries and timeouts, on the default (TLS-probing) engine -------

REPEATED_CASES = [("semaphore", "asyncio"), ("chunked", "asyncio")]
REPEATED_RUNS = 25


def two_inserts(run: int, i: int, pauses: tuple[float, float]) -> Any:
    async def unit(session: AsyncSession) -> int:
        await asyncio.sleep(pauses[0])
        session.add(Item(key=f"r{run}u{i}a", unit=run * 1000 + i))
        await session.flush()
        await asyncio.sleep(pauses[1])
        session.add(Item(key=f"r{run}u{i}b", unit=run * 1000 + i))
        await session.flush()
        return i

    return unit


@pytest.mark.slow
@pytest.mark.parametrize(("kind", "anyio_backend"), REPEATED_CASES, ids=[k for k, _ in REPEATED_CASES])
async def test_repeated_random_cancellation_leaks_nothing_into_the_loop(
    kit: Kit, admin: Engine, app_name: str
) -> None:
    """25 runs cancelled at random: no error reaches the loop's handler, no misuse is invented."""
    loop = asyncio.get_running_loop()
    seen: list[dict[str, Any]] = []
    previous = loop.get_exception_handler()
    loop.set_exception_handler(lambda _loop, context: seen.append(context))
    try:
        runner = kit.runner(limit=10, retry=RetryPolicy(attempts=3), timeout=5)
        rng = random.Random(2)
        for run in range(REPEATED_RUNS):
            units = [two_inserts(run, i, (rng.uniform(0, 0.05), rng.uniform(0, 0.05))) for i in range(500)]
            with anyio.fail_after(60):
                with anyio.move_on_after(rng.uniform(0, 0.25)):
                    await runner.run(units)
            where = f"run {run}"
            assert kit.pool.checkedout() == 0, where
            assert runner.in_flight == 0, where
            assert_no_open_transactions(admin, app_name, where)
        for _ in range(3):
            gc.collect()  # "Future exception was never retrieved" is reported when the future is freed
            await asyncio.sleep(0.05)
    finally:
        loop.set_exception_handler(previous)
    assert [c.get("message") for c in seen] == []
    rows = rows_per_unit(admin)
    assert all(count == 2 for count in rows.values()), "half-written units"
    assert (await runner.run([kit.select(3)])).values() == [3]


@pytest.mark.parametrize(("kind", "anyio_backend"), REPEATED_CASES, ids=[k for k, _ in REPEATED_CASES])
async def test_a_run_cancelled_while_its_connections_open_leaks_nothing_into_the_loop(
    kit: Kit, admin: Engine, app_name: str
) -> None:
    """Cancelled as asyncpg opens connections (its TLS probe): no stray error, nothing left open."""
    loop = asyncio.get_running_loop()
    seen: list[dict[str, Any]] = []
    previous = loop.get_exception_handler()
    loop.set_exception_handler(lambda _loop, context: seen.append(context))
    runner = kit.runner(limit=4)
    opening = anyio.Event()

    def on_connect(*_: Any) -> None:
        opening.set()

    event.listen(kit.engine.sync_engine, "do_connect", on_connect)
    try:
        for attempt in range(30):
            await kit.engine.dispose()  # every run opens its connections anew
            opening = anyio.Event()
            with anyio.fail_after(30):
                async with anyio.create_task_group() as group:
                    group.start_soon(runner.run, [kit.select(i) for i in range(8)])
                    await opening.wait()  # a connect has begun
                    for _ in range(attempt % 6):  # let it get as far as the TLS probe (or not)
                        await anyio.lowlevel.checkpoint()
                    group.cancel_scope.cancel()
            assert kit.pool.checkedout() == 0, attempt
            assert runner.in_flight == 0, attempt
        for _ in range(3):
            gc.collect()
            await asyncio.sleep(0.05)
    finally:
        loop.set_exception_handler(previous)
        event.remove(kit.engine.sync_engine, "do_connect", on_connect)
    assert [c.get("message") for c in seen] == []
    assert_no_open_transactions(admin, app_name, "after the cancelled runs")
    assert (await runner.run([kit.select(3)])).values() == [3]
