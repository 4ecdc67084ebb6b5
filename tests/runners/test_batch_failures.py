"""
``batch=`` when things go wrong: a unit that overruns its timeout, a run cancelled mid-batch, a COMMIT
whose connection is lost (``verify_commits``).

Timeouts sleep on the server (PostgreSQL, MariaDB); cancellation runs on every database; the lost
COMMIT is PostgreSQL's (the proxy of tests/runners/test_verify_commits.py cuts it).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

import anyio
import anyio.to_thread
import pytest
from sqlalchemy.engine import Engine

from boundeddb import BatchPolicy, RetryPolicy, UnitTimeout
from boundeddb.testing import PostgresServer
from tests.runners.test_verify_commits import DRIVER_CASES, DRIVER_IDS, CommitCutter, ProxiedRunners
from tests.support.batches import (  # noqa: F401 -- the *_fixture names are fixtures pytest finds here
    PG_CASES,
    SERVER_CASES,
    BatchKit,
    assert_no_leaks,
    bkit_fixture,
    every,
    make_sqlite_async_engine_fixture,
    make_sqlite_sync_engine_fixture,
    sqlite_file_fixture,
)
from tests.support.faults import Progress, inserting, wait_until
from tests.support.probes import committed_units

pytestmark = [pytest.mark.usefixtures("collect_garbage")]


# -- a per-unit timeout inside a batch -------------------------------------------------------------------


@pytest.mark.anyio
@every(SERVER_CASES)
async def test_a_unit_that_overruns_its_timeout_fails_alone(bkit: BatchKit) -> None:
    """timeout= stays per unit: the one in a 30 s server sleep fails with UnitTimeout, the rest commit."""
    n, slow = 30, 14
    runner = bkit.runner(limit=3, batch=10, timeout=1.0, errors="collect")
    units = [bkit.sleeper(i, 30) if i == slow else bkit.good(i) for i in range(n)]
    with anyio.fail_after(25):
        report = await runner.run(units)
    assert [o.index for o in report.outcomes if not o.ok] == [slow]
    assert isinstance(report.outcomes[slow].error, UnitTimeout)
    assert [o.value for o in report.outcomes if o.ok] == [10 * i for i in range(n) if i != slow]
    assert bkit.rows() == {i: 1 for i in range(n) if i != slow}
    assert bkit.commits.n < n / 2
    assert report.stats.units_rerun > 0, "the slow unit's neighbours ran again without it"
    assert_no_leaks(bkit)  # the sleep was stopped on the server too


# -- cancellation ------------------------------------------------------------------------------------------


class Finished:
    """When each unit's last statement returned (time.monotonic, from any thread)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.at: dict[int, float] = {}

    def mark(self, i: int) -> None:
        with self._lock:
            self.at[i] = time.monotonic()


@pytest.mark.anyio
@every()
async def test_a_run_cancelled_mid_batch_commits_no_partial_unit_and_leaks_nothing(bkit: BatchKit) -> None:
    """Cancelled once 2 batches committed: whole units only, none that finished after, nothing left open."""
    n, size = 300, 10
    runner = bkit.runner(limit=3, batch=size)
    finished = Finished()
    units = [bkit.pair(i, 0.01, finished.mark) for i in range(n)]
    cancelled_at = 0.0
    with anyio.fail_after(30):
        async with anyio.create_task_group() as group:
            group.start_soon(runner.run, units)
            await anyio.to_thread.run_sync(
                wait_until, lambda: len(bkit.rows()) >= 2 * size, 20, "two batches committed, then the cancel"
            )
            group.cancel_scope.cancel()
            # The runner has seen the cancellation once every task is blocked again (see
            # test_cancellation.py): a unit that finishes after that must not commit.
            with anyio.CancelScope(shield=True):
                await anyio.wait_all_tasks_blocked()
            cancelled_at = time.monotonic()
    assert bkit.pool.checkedout() == 0, "connections are back when the cancellation propagates"
    assert runner.in_flight == 0
    rows = bkit.rows()
    assert all(count == 2 for count in rows.values()), f"half-written units: {rows}"
    late = sorted(i for i in rows if finished.at[i] > cancelled_at)
    assert late == [], f"units that finished after the cancellation were committed: {late}"
    assert 2 * size <= len(rows) < n, "cancelled mid-run, after the control batches"
    assert_no_leaks(bkit)
    # The runner goes on as usual.
    assert (await runner.run([bkit.good(1000), bkit.good(1001)])).values() == [10000, 10010]


@pytest.mark.anyio
@every()
async def test_move_on_after_around_a_batched_map_leaks_nothing(bkit: BatchKit) -> None:
    """anyio.move_on_after around map() with batches, 5 times at varied points: pairs only, nothing left."""
    runner = bkit.runner(limit=3, batch=BatchPolicy(size=10, linger=0.01))
    finished = Finished()

    async def pairs(session: Any, i: int) -> int:
        return await bkit.pair(i, 0.005, finished.mark)(session)

    def pairs_sync(session: Any, i: int) -> int:
        return bkit.pair(i, 0.005, finished.mark)(session)  # type: ignore[no-any-return]

    fn = pairs if bkit.is_async else pairs_sync
    for attempt in range(5):
        with anyio.fail_after(30), anyio.move_on_after(0.05 + 0.05 * attempt) as scope:
            await runner.map(fn, range(attempt * 1000, attempt * 1000 + 500))
        assert scope.cancelled_caught, "the map was cut short"
        assert bkit.pool.checkedout() == 0, attempt
        assert runner.in_flight == 0, attempt
        bkit.db.assert_no_open_transactions(f"after cancelled map {attempt}")
    rows = bkit.rows()
    assert all(count == 2 for count in rows.values()), f"half-written units: {rows}"
    assert_no_leaks(bkit)


@pytest.mark.anyio
@every()
async def test_leaving_a_batched_stream_early_leaks_nothing(bkit: BatchKit) -> None:
    """Breaking out of stream() mid-run: batches in flight roll back, whole units only, nothing left open."""
    runner = bkit.runner(limit=3, batch=10)
    finished = Finished()
    yielded: list[int] = []
    outcomes = runner.stream(bkit.pair(i, 0.005, finished.mark) for i in range(1000))
    async for outcome in outcomes:
        assert outcome.ok
        yielded.append(outcome.index)
        if len(yielded) >= 25:
            break
    await outcomes.aclose()
    assert bkit.pool.checkedout() == 0
    rows = bkit.rows()
    assert all(count == 2 for count in rows.values()), f"half-written units: {rows}"
    assert set(yielded) <= set(rows), "a unit yielded as ok has no rows"
    assert len(rows) < 1000
    assert_no_leaks(bkit)


# -- verify_commits with batches (PostgreSQL) -----------------------------------------------------------


@pytest.mark.anyio
@every(PG_CASES)
async def test_verify_commits_with_batches_commits_in_batches(bkit: BatchKit) -> None:
    """verify_commits=True beside batch=25: a plain run commits every unit once, 4 COMMITs or so."""
    n = 100
    runner = bkit.runner(limit=4, batch=25, verify_commits=True)
    report = await runner.run([bkit.good(i, flush=i % 3 == 0) for i in range(n)])
    assert report.values() == [10 * i for i in range(n)]
    assert bkit.rows() == dict.fromkeys(range(n), 1)
    assert bkit.commits.n <= 8
    assert report.stats.commits_verified == 0, "no COMMIT was lost"
    assert_no_leaks(bkit)


@pytest.fixture
def cutter(pg_server: PostgresServer) -> Iterator[CommitCutter]:
    url = pg_server.url
    proxy = CommitCutter(url.host or "127.0.0.1", url.port or 5432)
    yield proxy
    proxy.close()


@pytest.fixture
async def proxied(pg_server: PostgresServer, pg_schema: str, app_name: str, cutter: CommitCutter) -> Any:
    """Runners whose engines connect through the cutter (disposed of on the test's loop)."""
    runners = ProxiedRunners(pg_server.url, cutter.port, pg_schema, app_name)
    yield runners
    cutter.close()
    for engine in runners.engines:
        if hasattr(engine, "sync_engine"):
            await engine.dispose()
        else:
            engine.dispose()


@pytest.mark.postgres
@pytest.mark.anyio
@pytest.mark.usefixtures("items_table")
@pytest.mark.parametrize("anyio_backend", ["asyncio"])
@pytest.mark.parametrize("verify", [True, False], ids=["verify", "no-verify"])
@pytest.mark.parametrize(("kind", "driver"), DRIVER_CASES, ids=DRIVER_IDS)
async def test_a_batch_whose_commit_is_lost_is_resolved_once_for_all_its_units(
    proxied: ProxiedRunners, cutter: CommitCutter, admin: Engine, kind: str, driver: str, verify: bool
) -> None:
    """A batch's cut COMMIT (the server committed): verified, all 10 units ok; else all commit_unknown."""
    retry = RetryPolicy(attempts=5, initial_delay=0.01)
    runner = proxied.runner(kind, driver, limit=1, batch=10, verify_commits=verify, retry=retry)
    is_async = kind != "threads"
    progress = Progress()
    assert (await runner.run([inserting(is_async, 0, progress)])).values() == [0]  # connected, warm
    cutter.arm(1)
    with anyio.fail_after(30):
        report = await runner.run([inserting(is_async, i, progress) for i in range(1, 11)])
    assert cutter.cuts == 1
    outcomes = report.outcomes
    if verify:
        assert [(o.ok, o.value, o.commit_verified, o.attempts) for o in outcomes] == [
            (True, i, True, 1) for i in range(1, 11)
        ]
        assert report.stats.commits_verified == 10
    else:
        assert [(o.ok, o.commit_unknown) for o in outcomes] == [(False, True)] * 10
        assert await anyio.to_thread.run_sync(cutter.answered.wait, 10)
    assert progress.value == 11, "no unit ran twice: the lost COMMIT was never retried"
    assert committed_units(admin) == list(range(11))
    assert proxied.pool().checkedout() == 0
