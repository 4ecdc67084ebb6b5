"""ProcessRunner with ``batch=``: each worker batches its share; every unit commits once, faults included."""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import Any

import anyio
import pytest
from sqlalchemy import text
from sqlalchemy.engine import Engine

from boundeddb import ProcessRunner, WorkerLostError
from tests.runners.test_process_runner import both_ready, committed, kill_a_worker_when
from tests.support import process_units as units

pytestmark = [pytest.mark.anyio, pytest.mark.postgres, pytest.mark.usefixtures("collect_garbage")]


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def transactions(admin: Engine) -> int:
    """The transactions that committed process_rows' rows: a row's ``xmin`` is its inserting one's id."""
    with admin.connect() as connection:
        found = connection.execute(text("SELECT count(DISTINCT xmin::text) FROM process_rows"))
        return int(found.scalar_one())


@pytest.mark.parametrize(
    ("driver", "fn"),
    [("asyncpg", units.insert), ("psycopg", units.insert_sync)],
    ids=["async-asyncpg", "sync-psycopg"],
)
async def test_each_worker_batches_its_share_and_every_unit_commits_once(
    rows: Engine, make_runner: Callable[..., ProcessRunner], driver: str, fn: Any
) -> None:
    """400 units in batches of 50 over 2 workers: each row once, in about 8 transactions, not 400."""
    async with make_runner(driver, limit=4, processes=2, batch=50) as runner:
        await both_ready(runner)
        report = await runner.map(fn, range(400))
    assert [value[0] for value in report.values()] == list(range(400))
    assert committed(rows) == dict.fromkeys(range(400), 1)
    assert 8 <= transactions(rows) <= 40  # batches not full: those of a worker's last units
    assert (report.stats.batches_committed, report.stats.units_rerun) == (transactions(rows), 0)
    statistics = runner.statistics()
    assert (statistics.batches_committed, statistics.units_rerun) == (transactions(rows), 0)


async def test_a_failing_unit_fails_alone_in_its_worker_and_the_rest_commit_once(
    rows: Engine, make_runner: Callable[..., ProcessRunner]
) -> None:
    """errors="collect" with batches: exactly the failing units fail, every other row commits once."""
    async with make_runner(limit=4, processes=2, errors="collect", batch=20) as runner:
        report = await runner.map(units.fail_some, range(200))
    assert [o.index for o in report.failures] == [n for n in range(200) if n % 7 == 3]
    assert all(isinstance(o.error, ValueError) for o in report.failures)
    assert committed(rows) == {n: 1 for n in range(200) if n % 7 != 3}
    assert report.stats.units_rerun > 0, "the failing units' neighbours ran again"
    assert report.stats.batches_committed == transactions(rows)


async def test_a_worker_killed_mid_batch_loses_and_repeats_nothing(
    rows: Engine, make_runner: Callable[..., ProcessRunner]
) -> None:
    """SIGKILL a worker while it runs batches: its begun units fail, none commits twice, none is lost."""
    async with make_runner("psycopg", limit=4, processes=2, errors="collect", batch=10) as runner:
        await both_ready(runner)
        killer, killed = kill_a_worker_when(rows, 60)
        report = await runner.map(partial(units.insert_and_sleep_sync, seconds=0.01), range(600))
        await anyio.to_thread.run_sync(killer.join)
    assert len(killed) == 1
    assert [o.index for o in report.outcomes] == list(range(600))
    in_doubt = report.failures
    assert 1 <= len(in_doubt) <= 2 * 10 * 3, [o.error for o in in_doubt]  # at most what it was handed
    assert all(isinstance(o.error, WorkerLostError) for o in in_doubt)
    rows_by_unit = committed(rows)
    assert set(rows_by_unit.values()) == {1}
    assert {o.index for o in report.outcomes if o.ok} <= set(rows_by_unit)
    for outcome in in_doubt:
        assert outcome.index not in rows_by_unit or outcome.commit_unknown


def test_bad_batch_is_refused_before_any_worker_starts() -> None:
    """batch=0 names batch and the fix, before any process starts."""
    with pytest.raises(ValueError, match=r"^batch must be an int >= 1 or a boundeddb.BatchPolicy, got 0"):
        ProcessRunner("postgresql+asyncpg://postgres@127.0.0.1/test", limit=2, batch=0)
