"""
``batch=``: many units in one transaction, each with its own outcome, on every runner and database.

Each test runs on PostgreSQL (asyncpg, psycopg 3, psycopg2), MariaDB (aiomysql, asyncmy, pymysql) and
SQLite (aiosqlite, pysqlite), for SemaphoreRunner, ChunkedRunner and ThreadOffloadRunner (see
tests/support/batches.py). COMMITs are counted with SQLAlchemy's ``commit`` event on the runner's
engine; rows are read from another connection.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from typing import Any

import anyio
import anyio.to_thread
import pytest
from sqlalchemy import text

from boundeddb import BatchPolicy, RunFailed
from tests.support.batches import (  # noqa: F401 -- the *_fixture names are fixtures pytest finds here
    ALL_CASES,
    ONE_OF_EACH,
    PG_CASES,
    SERVER_CASES,
    BatchKit,
    assert_no_leaks,
    bkit_fixture,
    every,
    make_sqlite_async_engine_fixture,
    make_sqlite_sync_engine_fixture,
    sqlite_file_fixture,
    sync_params,
    violated,
)
from tests.support.faults import wait_until

pytestmark = [pytest.mark.usefixtures("collect_garbage")]


# -- one COMMIT per batch ---------------------------------------------------------------------------------


@pytest.mark.anyio
@every()
async def test_a_batch_commits_many_units_with_one_commit(bkit: BatchKit) -> None:
    """map() of 200 items with batch=50: about 4 COMMITs, not 200; each row once; values in order."""
    n, size, limit = 200, 50, 4
    runner = bkit.runner(limit=limit, batch=size)
    report = await runner.map(bkit.map_fn(), range(n))
    commits = bkit.commits.n
    assert n // size <= commits <= 2 * n // size, f"{commits} COMMITs for {n} units in batches of {size}"
    assert report.values() == [10 * i for i in range(n)]
    assert [o.index for o in report.outcomes] == list(range(n))
    assert bkit.rows() == dict.fromkeys(range(n), 1)
    stats = report.stats
    assert (stats.submitted, stats.succeeded, stats.failed) == (n, n, 0)
    assert stats.batches_committed == commits
    assert stats.units_rerun == 0
    assert 1 <= stats.peak_connections <= runner.limit
    assert_no_leaks(bkit)


@pytest.mark.anyio
@pytest.mark.parametrize("batch", [None, 1], ids=["None", "1"])
@every(ONE_OF_EACH)
async def test_without_batches_every_unit_commits_alone(bkit: BatchKit, batch: int | None) -> None:
    """batch=None and batch=1 keep one transaction per unit: N COMMITs, no batch counted."""
    n = 30
    runner = bkit.runner(limit=4, batch=batch)
    report = await runner.run([bkit.good(i) for i in range(n)])
    assert report.values() == [10 * i for i in range(n)]
    assert bkit.commits.n == n
    assert bkit.rows() == dict.fromkeys(range(n), 1)
    assert (report.stats.batches_committed, report.stats.units_rerun) == (0, 0)
    assert runner.statistics().batches_committed == 0


@pytest.mark.anyio
@every()
async def test_units_of_one_batch_share_a_transaction(bkit: BatchKit) -> None:
    """Units of one batch see each other's uncommitted rows (one session), none of which commit alone."""
    # Two units, one batch: the second finds the first one's row through its own session.
    seen: list[int] = []
    table_count = "SELECT count(*) FROM items WHERE unit = 0"

    if bkit.is_async:

        async def second(session: Any) -> int:
            seen.append(int((await session.execute(text(table_count))).scalar_one()))
            seen.append(bkit.visible(0))  # from another connection: not committed yet
            return 10

    else:

        def second(session: Any) -> int:
            seen.append(int(session.execute(text(table_count)).scalar_one()))
            seen.append(bkit.visible(0))
            return 10

    runner = bkit.runner(limit=1, batch=BatchPolicy(size=2))
    report = await runner.run([bkit.good(0, flush=True), second])
    assert report.values() == [0, 10]
    assert seen == [1, 0], "the second unit ran in the first one's transaction, before its COMMIT"
    assert bkit.commits.n == 1
    assert bkit.visible(0) == 1


@pytest.mark.anyio
@every(SERVER_CASES)
async def test_the_limit_bounds_batches_in_flight_so_connections(bkit: BatchKit) -> None:
    """1,000 units in batches of 20 with limit=3: at most 3 connections, by the server's own count."""
    n, limit, size = 1000, 3, 20
    runner = bkit.runner(limit=limit, pool_size=2 * limit, batch=size)
    with bkit.db.sampler() as sampler:
        report = await runner.run([bkit.good(i, flush=i % 5 == 0) for i in range(n)])
    assert report.stats.succeeded == n
    assert sampler.samples > 0
    assert 1 <= sampler.peak <= limit, f"{sampler.peak} connections open at once for limit={limit}"
    assert report.stats.peak_in_flight <= limit * size  # units: up to limit batches of size
    assert bkit.commits.n <= 2 * n // size


@pytest.mark.anyio
@every(ONE_OF_EACH)
async def test_an_outcome_is_reported_only_once_its_batch_committed(bkit: BatchKit) -> None:
    """on_outcome and stream() see an ok outcome only once its row is visible from another connection."""
    n = 60
    hooked: dict[int, int] = {}
    streamed: dict[int, int] = {}

    def settled(outcome: Any) -> None:
        if outcome.ok:
            hooked[outcome.index] = bkit.visible(outcome.index)

    runner = bkit.runner(limit=2, batch=BatchPolicy(size=15, linger=0.01), errors="collect")
    units = [bkit.raising(i) if i == 20 else bkit.good(i, flush=i % 2 == 0) for i in range(n)]
    async for outcome in runner.stream(units, on_outcome=settled):
        if outcome.ok:
            streamed[outcome.index] = bkit.visible(outcome.index)  # before the stream goes on
    good = [i for i in range(n) if i != 20]
    assert hooked == dict.fromkeys(good, 1), "on_outcome saw an ok unit whose row was not committed"
    assert streamed == dict.fromkeys(good, 1), "stream() yielded an ok unit whose row was not committed"


@pytest.mark.anyio
@every(ONE_OF_EACH)
async def test_a_raising_stream_yields_the_failure_then_raises(bkit: BatchKit) -> None:
    """errors="raise" with batches: the stream yields the failing unit's outcome, then raises RunFailed."""
    runner = bkit.runner(limit=2, batch=10)
    seen: list[Any] = []

    async def consume() -> None:
        async for outcome in runner.stream(bkit.raising(i) if i == 15 else bkit.good(i) for i in range(500)):
            seen.append(outcome)

    with pytest.raises(RunFailed) as caught:
        await consume()
    assert [type(e) for e in caught.value.exceptions] == [ValueError]
    assert [o.index for o in seen if not o.ok] == [15]
    assert len(seen) < 500, "the run stopped after the failure"
    assert bkit.rows() == dict.fromkeys((o.index for o in seen if o.ok), 1)
    assert_no_leaks(bkit)


# -- a failing unit never takes the others' writes with it -----------------------------------------------

#: Units that raise, insert a duplicate key (flushing it, or leaving it to COMMIT's flush), and that
#: break a deferred foreign key (PostgreSQL, SQLite), some of them in the same batch of 20.
RAISING = {5, 46}
DUPLICATE = {6, 27}
DUPLICATE_AT_COMMIT = {61}
DEFERRED = {28, 62}


def failing_units(kit: BatchKit, n: int) -> tuple[list[Any], dict[int, str]]:
    """``n`` units with the bad ones above among them; and what each bad one must fail with."""
    deferred = DEFERRED if kit.supports_deferred else set()
    if deferred:
        kit.add_deferred_ref()
    units: list[Any] = []
    expected: dict[int, str] = {}
    for i in range(n):
        if i in RAISING:
            units.append(kit.raising(i))
            expected[i] = "ValueError"
        elif i in DUPLICATE or i in DUPLICATE_AT_COMMIT:
            units.append(kit.duplicate(i, flush=i in DUPLICATE))
            expected[i] = "unique"
        elif i in deferred:
            units.append(kit.deferred_violation(i))
            expected[i] = "foreign key"
        else:
            units.append(kit.good(i, flush=i % 2 == 0))
    return units, expected


def failure_of(error: BaseException | None) -> str:
    return "ValueError" if isinstance(error, ValueError) else violated(error)


@pytest.mark.anyio
@every()
async def test_failing_units_fail_alone_and_every_good_unit_commits_once(bkit: BatchKit) -> None:
    """errors="collect": each bad unit fails with its own error; every good unit's row is there once."""
    n = 80
    units, expected = failing_units(bkit, n)
    runner = bkit.runner(limit=4, batch=20, errors="collect")
    report = await runner.run(units)
    assert [o.index for o in report.outcomes] == list(range(n))
    assert {o.index: failure_of(o.error) for o in report.outcomes if not o.ok} == expected
    for i in RAISING:
        assert report.outcomes[i].error.args == (i,), "a unit's own exception, not a neighbour's"
    good = [i for i in range(n) if i not in expected]
    assert [o.value for o in report.outcomes if o.ok] == [10 * i for i in good]
    assert bkit.rows() == dict.fromkeys(good, 1)
    stats = report.stats
    assert (stats.succeeded, stats.failed) == (len(good), len(expected))
    assert stats.batches_committed > 0
    assert stats.units_rerun > 0, "the failing units' neighbours ran again"
    assert bkit.commits.n < n / 2, f"{bkit.commits.n} COMMITs: failures should not undo the batching"
    runner_stats = runner.statistics()
    assert (runner_stats.batches_committed, runner_stats.units_rerun) == (
        stats.batches_committed,
        stats.units_rerun,
    )
    assert_no_leaks(bkit)


@pytest.mark.anyio
@every()
async def test_a_unit_that_raises_costs_its_batch_one_attempt_more(bkit: BatchKit) -> None:
    """
    The units before a raising unit run twice: in the attempt it failed, and in the one without it.
    The raising unit runs twice too, the second time alone. The units after it run once.
    """
    n, bad = 10, 4
    units = [bkit.raising(i) if i == bad else bkit.good(i) for i in range(n)]
    runner = bkit.runner(limit=1, batch=n, errors="collect")
    report = await runner.run(units)
    assert [o.index for o in report.outcomes if not o.ok] == [bad]
    assert dict(bkit.executions) == {i: 2 if i <= bad else 1 for i in range(n)}
    assert (report.stats.units_rerun, report.stats.batches_committed, bkit.commits.n) == (bad + 1, 1, 1)
    assert bkit.rows() == {i: 1 for i in range(n) if i != bad}
    assert_no_leaks(bkit)


@pytest.mark.anyio
@every()
async def test_errors_raise_reports_ok_exactly_the_committed_units(bkit: BatchKit) -> None:
    """errors="raise": RunFailed, and in its report a unit is ok if and only if its row committed."""
    n = 80
    units, expected = failing_units(bkit, n)
    runner = bkit.runner(limit=4, batch=20)
    with pytest.raises(RunFailed) as caught:
        await runner.run(units)
    report = caught.value.report
    indices = [o.index for o in report.outcomes]
    assert indices == sorted(set(indices)), "one outcome per unit, in input order"
    ok = {o.index for o in report.outcomes if o.ok}
    rows = bkit.rows()
    assert set(rows) == ok, f"committed but not ok: {set(rows) - ok}; ok but not committed: {ok - set(rows)}"
    assert all(count == 1 for count in rows.values()), rows
    assert not ok & set(expected), "a bad unit is ok"
    failed = [o for o in report.outcomes if not o.ok and o.error is not None]
    assert caught.value.exceptions, "RunFailed holds the units' own exceptions"
    for error in caught.value.exceptions:
        assert any(error is o.error for o in failed), error
        assert failure_of(error) in ("ValueError", "unique", "foreign key"), error
    assert 5 in indices, "the first batch's failing unit started"
    assert failure_of(report.outcomes[indices.index(5)].error) == "ValueError"
    assert_no_leaks(bkit)


# -- retries --------------------------------------------------------------------------------------------


@pytest.mark.anyio
@every()
async def test_a_transient_error_is_retried_and_every_unit_commits_once(bkit: BatchKit) -> None:
    """A unit failing once with a transient error (40001, MySQL 1213): all commit once, in few COMMITs."""
    n, flaky = 40, {13, 27}
    runner = bkit.runner(limit=2, batch=10, retry=bkit.retry_policy(attempts=3))
    report = await runner.run([bkit.flaky(i) if i in flaky else bkit.good(i) for i in range(n)])
    assert report.values() == [10 * i for i in range(n)]
    assert bkit.rows() == dict.fromkeys(range(n), 1)
    assert all(bkit.executions[i] == 2 for i in flaky), bkit.executions
    assert all(report.outcomes[i].attempts == 2 for i in flaky)
    assert report.stats.retried >= len(flaky)
    assert bkit.commits.n < n / 2
    assert_no_leaks(bkit)


FLAKY_COMMIT = [
    "DROP SEQUENCE IF EXISTS batch_flaky_commits",
    "CREATE SEQUENCE batch_flaky_commits",
    "CREATE OR REPLACE FUNCTION batch_flaky_commit() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN "
    "IF NEW.unit = 7 AND nextval('batch_flaky_commits') = 1 THEN "
    "RAISE EXCEPTION 'forced serialization failure at COMMIT' USING ERRCODE = '40001'; "
    "END IF; RETURN NULL; END $$",
    "CREATE CONSTRAINT TRIGGER batch_flaky_commit AFTER INSERT ON items "
    "DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION batch_flaky_commit()",
]


@pytest.mark.anyio
@every(PG_CASES)
async def test_a_transient_error_at_commit_retries_the_batch(bkit: BatchKit) -> None:
    """A deferred trigger fails unit 7's batch's first COMMIT with 40001: retried, every unit commits once."""
    with bkit.admin().begin() as connection:
        for statement in FLAKY_COMMIT:
            connection.execute(text(statement))
    n, size = 30, 10
    runner = bkit.runner(limit=2, batch=size, retry=bkit.retry_policy(attempts=3))
    report = await runner.run([bkit.good(i) for i in range(n)])
    assert report.values() == [10 * i for i in range(n)]
    assert bkit.rows() == dict.fromkeys(range(n), 1)
    assert bkit.executions[7] == 2, "the failed COMMIT's units ran again"
    assert report.stats.retried >= 1
    assert bkit.commits.n <= 2 * n // size
    assert_no_leaks(bkit)


# -- inputs: async iterables, linger, laziness ----------------------------------------------------------


async def slowly(kit: BatchKit, n: int) -> AsyncIterator[Any]:
    """Units from an async iterator that makes its consumer wait a little every 10 units."""
    for i in range(n):
        if i % 10 == 9:
            await anyio.sleep(0.002)
        yield kit.good(i)


@pytest.mark.anyio
@pytest.mark.parametrize("verb", ["run", "stream"])
@every(ONE_OF_EACH)
async def test_an_async_iterable_fills_batches_while_they_linger(bkit: BatchKit, verb: str) -> None:
    """run()/stream() of a slow async iterator with linger: every unit once, batches (not units) committed."""
    n = 100
    runner = bkit.runner(limit=2, batch=BatchPolicy(size=20, linger=0.05))
    if verb == "run":
        outcomes = list((await runner.run(slowly(bkit, n))).outcomes)
        assert [o.index for o in outcomes] == list(range(n))
    else:
        outcomes = [outcome async for outcome in runner.stream(slowly(bkit, n))]
        assert sorted(o.index for o in outcomes) == list(range(n))
    assert all(o.ok and o.value == 10 * o.index for o in outcomes)
    assert bkit.rows() == dict.fromkeys(range(n), 1)
    assert bkit.commits.n <= n / 5, f"{bkit.commits.n} COMMITs for {n} units: the batches did not fill"
    assert_no_leaks(bkit)


@pytest.mark.anyio
@every(ONE_OF_EACH)
async def test_a_batch_that_is_not_full_starts_once_its_linger_runs_out(bkit: BatchKit) -> None:
    """An async input that stalls after 3 units: those 3 commit while it stalls (linger=0.05, size=50)."""
    resume = anyio.Event()
    reports: list[Any] = []

    async def units() -> AsyncIterator[Any]:
        for i in range(3):
            yield bkit.good(i)
        await resume.wait()  # until the test has seen the first three committed
        for i in range(3, 6):
            yield bkit.good(i)

    async def run() -> None:
        reports.append(await runner.run(units()))

    runner = bkit.runner(limit=2, batch=BatchPolicy(size=50, linger=0.05))
    with anyio.fail_after(30):
        async with anyio.create_task_group() as group:
            group.start_soon(run)
            await anyio.to_thread.run_sync(
                wait_until, lambda: bkit.rows() == dict.fromkeys(range(3), 1), 10, "3 units committed"
            )
            resume.set()
    assert reports[0].values() == [10 * i for i in range(6)]
    assert bkit.rows() == dict.fromkeys(range(6), 1)


@pytest.mark.anyio
@every(ONE_OF_EACH)
async def test_input_is_pulled_at_most_a_few_batches_ahead(bkit: BatchKit) -> None:
    """Memory stays O(limit x size): a generator of 1,000 units is never pulled far ahead of execution."""
    n, size = 1000, 10
    runner = bkit.runner(limit=2, batch=size)
    ahead: list[int] = []

    def units() -> Iterator[Any]:
        for i in range(n):
            ahead.append(i + 1 - sum(bkit.executions.values()))
            yield bkit.good(i)

    report = await runner.run(units())
    assert report.stats.succeeded == n
    bound = 4 * runner.limit * size
    assert max(ahead) <= bound, f"pulled {max(ahead)} units ahead of those executed (bound {bound})"


# -- run_sync -------------------------------------------------------------------------------------------

THREAD_CASES = [case for case in ALL_CASES if case[0].startswith("threads")]


@pytest.mark.parametrize("case", sync_params(THREAD_CASES))
def test_run_sync_batches_too(bkit: BatchKit) -> None:
    """ThreadOffloadRunner.run_sync with batch: few COMMITs, a failing unit alone, the rest once."""
    n = 100
    runner = bkit.runner(limit=3, batch=25, errors="collect")
    report = runner.run_sync([bkit.raising(i) if i == 40 else bkit.good(i) for i in range(n)])
    assert [o.index for o in report.outcomes if not o.ok] == [40]
    assert isinstance(report.outcomes[40].error, ValueError)
    assert bkit.rows() == {i: 1 for i in range(n) if i != 40}
    assert bkit.commits.n < n / 4
    assert report.stats.batches_committed > 0
    assert_no_leaks(bkit)
