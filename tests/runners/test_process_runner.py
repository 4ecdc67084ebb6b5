"""ProcessRunner on the real servers: every unit once, the bound over all workers, faults, cancellation."""

from __future__ import annotations

import os
import secrets
import signal
import socket
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from functools import partial
from pathlib import Path
from typing import Any

import anyio
import pytest
from sqlalchemy import create_engine, text
from sqlalchemy.engine import URL, Engine
from sqlalchemy.pool import NullPool

from boundeddb import (
    BoundedDBError,
    Journal,
    ProcessRunner,
    RetryPolicy,
    RunFailed,
    RunnerClosedError,
    RunReport,
    UnpicklableError,
    WorkerLostError,
)
from boundeddb._processes.backends import LocalProcesses
from boundeddb.testing import PostgresServer, driver_url
from tests.runners.conftest import connect_args
from tests.support import process_units as units
from tests.support.faults import active_queries, wait_until
from tests.support.kits import eventually
from tests.support.probes import ActivitySampler, backends, terminate_backends

pytestmark = [pytest.mark.anyio, pytest.mark.postgres, pytest.mark.usefixtures("collect_garbage")]


@pytest.fixture
def anyio_backend() -> str:
    """asyncio, unless a test says trio too: the caller's side is the same code on both."""
    return "asyncio"


@pytest.fixture(params=[True, False], ids=["shared-marks", "message-marks"])
def marks(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> bool:
    """Both ways a worker marks its units begun and committing: in memory it shares with the parent,
    or by message (as a Dask task does)."""
    share: bool = request.param
    monkeypatch.setattr(LocalProcesses, "share_marks", share)
    return share


async def both_ready(runner: ProcessRunner) -> None:
    """Until both of the runner's workers serve (started, imports done): what the runner's repr says."""
    assert await anyio.to_thread.run_sync(eventually, lambda: "ready=2" in repr(runner), 120)


def committed(admin: Engine) -> dict[int, int]:
    """unit -> how many rows it committed."""
    with admin.connect() as connection:
        found = connection.execute(text("SELECT unit, count(*) FROM process_rows GROUP BY unit"))
        return {int(unit): int(count) for unit, count in found}


def pids(admin: Engine) -> set[int]:
    with admin.connect() as connection:
        return {
            int(pid) for pid in connection.execute(text("SELECT DISTINCT pid FROM process_rows")).scalars()
        }


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


# -- the contract ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("driver", "fn"),
    [("asyncpg", units.insert), ("psycopg", units.insert_sync), ("psycopg", units.insert)],
    ids=["async-asyncpg", "sync-psycopg", "async-psycopg"],
)
async def test_every_unit_runs_once_in_a_worker_and_comes_back_in_input_order(
    rows: Engine, make_runner: Callable[..., ProcessRunner], driver: str, fn: Any
) -> None:
    """300 units over 2 workers: values in input order, from the workers, each row committed once."""
    async with make_runner(driver, limit=4, processes=2) as runner:
        await both_ready(runner)  # else, on a busy machine, the first may do all 300 alone
        report = await runner.map(fn, range(300))
    assert [value[0] for value in report.values()] == list(range(300))
    workers = {value[1] for value in report.values()}
    assert len(workers) == 2
    assert os.getpid() not in workers
    assert committed(rows) == dict.fromkeys(range(300), 1)
    stats = report.stats
    assert (stats.submitted, stats.succeeded, stats.failed) == (300, 300, 0)
    assert 1 <= stats.peak_connections <= 4
    assert 1 <= stats.peak_in_flight <= 4


async def test_workers_serve_many_calls_with_the_engine_they_built_once(
    rows: Engine, make_runner: Callable[..., ProcessRunner], app_name: str
) -> None:
    """Three calls on one runner: the same two processes, and no more connections than the limit."""
    async with make_runner(limit=2, processes=2) as runner:
        await both_ready(runner)
        seen = set()
        for call in range(3):
            report = await runner.map(units.insert, range(call * 50, call * 50 + 50))
            seen |= {pid for _, pid in report.values()}
        assert backends(rows, app_name) <= 2
    assert len(seen) == 2
    assert committed(rows) == dict.fromkeys(range(150), 1)


@pytest.mark.parametrize(
    ("driver", "fn"),
    [("asyncpg", units.insert_and_sleep), ("psycopg", units.insert_and_sleep_sync)],
    ids=["async", "sync"],
)
async def test_the_limit_bounds_the_server_connections_of_all_workers(
    rows: Engine, make_runner: Callable[..., ProcessRunner], app_name: str, driver: str, fn: Any
) -> None:
    """limit=6 over 3 workers of 2: pg_stat_activity never sees more than 6, and more than one worker's 2."""
    runner = make_runner(driver, limit=6, processes=3)
    with ActivitySampler(rows, app_name) as sampler:
        async with runner:
            report = await runner.map(fn, range(240))
    assert sampler.samples > 10
    assert 2 < sampler.peak <= 6
    assert report.stats.peak_connections <= 6
    assert eventually(lambda: backends(rows, app_name) == 0), "connections left after the runner closed"


@pytest.mark.parametrize(
    ("driver", "fn"),
    [("asyncpg", units.insert_and_sleep), ("psycopg", units.insert_and_sleep_sync)],
    ids=["async", "sync"],
)
async def test_a_journal_s_lookups_run_in_the_workers_inside_the_limit(
    rows: Engine,
    make_runner: Callable[..., ProcessRunner],
    app_name: str,
    pg_schema: str,
    driver: str,
    fn: Any,
) -> None:
    """limit=2 over 2 workers, with a journal: its keys looked up on the workers' connections, no third."""
    table = "bdbt_process_journal"
    journal = Journal(f"process-{secrets.token_hex(4)}", key=lambda item: item, table=table)
    runner = make_runner(driver, limit=2, processes=2)
    try:
        with ActivitySampler(rows, app_name) as sampler:
            async with runner:
                first = await runner.map(fn, range(80), journal=journal)
                again = await runner.map(fn, range(100), journal=journal)
        assert sampler.samples > 10
        assert sampler.peak == 2, "the workers' two connections, no lookup connection beside them"
        assert (first.stats.succeeded, first.stats.skipped) == (80, 0)
        assert (again.stats.succeeded, again.stats.skipped) == (20, 80)
        assert committed(rows) == dict.fromkeys(range(100), 1)
    finally:
        with rows.begin() as connection:
            connection.execute(text(f'DROP TABLE IF EXISTS "{pg_schema}".{table}'))


async def test_a_journal_table_missing_with_create_table_false_fails_the_call_with_its_ddl(
    rows: Engine, make_runner: Callable[..., ProcessRunner]
) -> None:
    """The workers' lookup meets the missing table: the call raises the journal's error, no unit ran."""
    journal = Journal(
        "process-missing", key=lambda item: item, table="bdbt_no_such_journal", create_table=False
    )
    runner = make_runner("asyncpg", limit=2, processes=2)
    async with runner:
        with pytest.raises(BoundedDBError, match=r"does not exist and create_table=False(.|\n)*CREATE TABLE"):
            await runner.map(units.insert, range(10), journal=journal)
    assert committed(rows) == {}


async def test_collect_reports_each_failure_and_commits_the_rest(
    rows: Engine, make_runner: Callable[..., ProcessRunner]
) -> None:
    """errors="collect": the failed units' own exceptions, with the worker's traceback; the others commit."""
    async with make_runner(limit=4, processes=2, errors="collect") as runner:
        report = await runner.map(units.fail_some, range(40))
    failed = [outcome.index for outcome in report.failures]
    assert failed == [n for n in range(40) if n % 7 == 3]
    for outcome in report.failures:
        assert isinstance(outcome.error, ValueError)
        assert f"unit {outcome.index} fails on purpose" in str(outcome.error)
        assert "fail_some" in str(outcome.error.__cause__)  # the traceback from the worker
    assert sorted(committed(rows)) == [n for n in range(40) if n % 7 != 3]


async def test_raise_stops_at_the_first_failure_and_reports_only_started_units(
    rows: Engine, make_runner: Callable[..., ProcessRunner]
) -> None:
    """errors="raise": RunFailed of the units' own errors; every unit in its report committed or failed."""
    async with make_runner("psycopg", limit=2, processes=2) as runner:
        with pytest.raises(RunFailed) as raised:
            await runner.map(units.fail_some_sync, range(2000))
    report = raised.value.report
    assert all(isinstance(error, ValueError) for error in raised.value.exceptions)
    assert len(report.outcomes) < 2000  # it stopped
    assert [o.index for o in report.outcomes] == sorted({o.index for o in report.outcomes})
    assert sorted(committed(rows)) == [o.index for o in report.outcomes if o.ok]


# -- what cannot be pickled ---------------------------------------------------------------------------


async def test_what_cannot_cross_the_process_boundary_fails_only_its_own_unit(
    rows: Engine, make_runner: Callable[..., ProcessRunner]
) -> None:
    """An unpicklable value rolls back; an exception that cannot be unpickled is named; others commit."""
    async with make_runner(limit=2, processes=2, errors="collect") as runner:
        value = (await runner.map(units.return_a_lock, [1])).outcomes[0]
        error = (await runner.map(units.raise_two_argument_error, [2])).outcomes[0]
        items = await runner.map(units.insert, [3, threading.Lock(), 5])
    assert isinstance(value.error, UnpicklableError)
    assert "unit 0 returned lock, which cannot be pickled" in str(value.error)
    assert isinstance(error.error, UnpicklableError)
    assert "TwoArgumentError: 2 and 3" in str(error.error)
    assert [outcome.ok for outcome in items.outcomes] == [True, False, True]
    assert isinstance(items.outcomes[1].error, UnpicklableError)
    assert "item 1 (lock) cannot be pickled" in str(items.outcomes[1].error)
    assert items.outcomes[1].attempts == 0  # never started
    assert committed(rows) == {3: 1, 5: 1}  # unit 1's row was rolled back


# -- bad input ------------------------------------------------------------------------------------------


def local_units() -> Any:
    async def local(session: Any, item: int) -> int:
        return item

    return local


@pytest.mark.parametrize(
    ("options", "error", "match"),
    [
        ({"limit": 0}, ValueError, r"limit must be >= 1, got 0"),
        ({"limit": "8"}, TypeError, r"limit must be an int >= 1, got '8'"),
        ({"limit": 4, "processes": 0}, ValueError, r"processes must be >= 1"),
        ({"limit": 2, "processes": 3}, ValueError, r"processes=3 is more than limit=2.*processes <= 2"),
        (
            {"limit": 2, "engine_options": {"pool_size": 5}},
            ValueError,
            r"engine_options must not set pool_size",
        ),
        (
            {"limit": 2, "engine_options": {"creator": lambda: None}},
            TypeError,
            r"engine_options must be picklable",
        ),
        ({"limit": 2, "errors": "ignore"}, ValueError, r"errors must be 'raise'"),
        ({"limit": 2, "cluster": object()}, TypeError, r"cluster must be a distributed.Client"),
        ({"limit": 2, "timeout": -1}, ValueError, r"timeout must be a finite number"),
    ],
)
def test_bad_arguments_are_refused_before_any_worker_starts(
    pg_url: URL, options: dict[str, Any], error: type[Exception], match: str
) -> None:
    """Each bad argument: an error that names it and the fix, and no process started."""
    before = threading.active_count()
    with pytest.raises(error, match=match):
        ProcessRunner(driver_url(pg_url, "asyncpg"), **options)
    assert threading.active_count() == before


@pytest.mark.parametrize(
    ("fn", "match"),
    [
        (
            lambda session, item: item,
            r"fn must be a module-level function: workers import it by name, and a lambda",
        ),
        (
            local_units(),
            r"fn must be a module-level function.*a local function \(local_units.<locals>.local\)",
        ),
        (partial(units.insert_and_sleep, seconds=threading.Lock()), r"fn must be picklable"),
        ("insert", r"fn must be callable"),
    ],
    ids=["lambda", "local", "unpicklable-partial", "not-callable"],
)
def test_a_function_workers_cannot_import_is_refused(pg_url: URL, fn: Any, match: str) -> None:
    """fn is checked in the caller, before any worker sees it."""
    runner = ProcessRunner(driver_url(pg_url, "asyncpg"), limit=2)  # not entered: no worker starts
    with pytest.raises(TypeError, match=match):
        runner.map_sync(fn, [1])
    assert "ready=0" in repr(runner)
    runner.close()


@pytest.mark.parametrize(
    ("driver", "fn", "match"),
    [
        ("asyncpg", units.insert_sync, r"fn is a plain def, but the driver of url \(asyncpg\) is async only"),
        ("psycopg2", units.insert, r"fn is an async def, but the driver of url \(psycopg2\) is sync"),
    ],
)
def test_a_function_of_the_other_kind_than_the_driver_is_refused(
    pg_url: URL, driver: str, fn: Any, match: str
) -> None:
    """An async def needs an async driver and a plain def a sync one: said before any unit runs."""
    runner = ProcessRunner(driver_url(pg_url, driver), limit=2)  # not entered: no worker starts
    with pytest.raises(TypeError, match=match):
        runner.map_sync(fn, [1])
    runner.close()


def test_the_runner_refuses_misuse(pg_url: URL) -> None:
    """Not an iterable, a closed runner, map_sync from async code: each says what to do."""
    runner = ProcessRunner(driver_url(pg_url, "asyncpg"), limit=2)
    with pytest.raises(TypeError, match=r"items must be an iterable"):
        runner.map_sync(units.insert, 5)  # type: ignore[arg-type]

    async def from_async() -> None:
        runner.map_sync(units.insert, [1])

    with pytest.raises(RuntimeError, match=r"map_sync\(\) was called from async code"):
        anyio.run(from_async)
    runner.close()
    with pytest.raises(RunnerClosedError, match="closed: create a new runner"):
        runner.map_sync(units.insert, [1])


# -- a worker that dies ----------------------------------------------------------------------------------


async def test_a_journal_lookup_whose_workers_die_is_asked_of_their_successors(
    rows: Engine, make_runner: Callable[..., ProcessRunner], app_name: str, pg_schema: str
) -> None:
    """Both workers killed while a lookup waits on a locked journal: the next workers answer it, once."""
    table = "bdbt_process_journal_lost"
    journal = Journal(f"process-{secrets.token_hex(4)}", key=lambda item: item, table=table)
    runner = make_runner("asyncpg", limit=2, processes=2)
    try:
        async with runner:
            first = await runner.map(units.insert, range(10), journal=journal)
            await both_ready(runner)
            workers = [seat.link.started.process.pid for seat in runner._fleet.seats if seat.link is not None]
            assert len(workers) == 2
            with rows.connect() as locker:  # the admin engine autocommits: its own transaction
                locker.exec_driver_sql("BEGIN")
                locker.exec_driver_sql(f'LOCK TABLE "{pg_schema}".{table} IN ACCESS EXCLUSIVE MODE')
                async with anyio.create_task_group() as tasks:
                    reports: list[Any] = []

                    async def rerun() -> None:
                        reports.append(await runner.map(units.insert, range(20), journal=journal))

                    tasks.start_soon(rerun)
                    lookup = f"%{table}%"
                    await anyio.to_thread.run_sync(
                        wait_until, lambda: active_queries(rows, app_name, lookup) == 1, 30, "a lookup waits"
                    )
                    for pid in workers:
                        os.kill(pid, signal.SIGKILL)
                    await anyio.to_thread.run_sync(
                        eventually, lambda: not any(alive(pid) for pid in workers), 30
                    )
                    locker.exec_driver_sql("ROLLBACK")  # the lock goes: the next workers' lookup answers
        assert (first.stats.succeeded, first.stats.skipped) == (10, 0)
        assert (reports[0].stats.succeeded, reports[0].stats.skipped) == (10, 10)
        assert committed(rows) == dict.fromkeys(range(20), 1)
    finally:
        with rows.begin() as connection:
            connection.execute(text(f'DROP TABLE IF EXISTS "{pg_schema}".{table}'))


@pytest.mark.parametrize(
    ("driver", "fn"), [("asyncpg", units.insert), ("psycopg", units.insert_sync)], ids=["async", "sync"]
)
async def test_a_process_worker_s_dropped_lookup_is_retried(
    rows: Engine,
    make_runner: Callable[..., ProcessRunner],
    app_name: str,
    pg_schema: str,
    driver: str,
    fn: Any,
) -> None:
    """A worker's lookup waiting on a locked journal has its backend terminated: it asks again, then runs."""
    table = "bdbt_process_lookup"
    Journal.create(rows, table=table)
    journal = Journal(f"process-{secrets.token_hex(4)}", key=lambda item: item, table=table)
    try:
        async with make_runner(
            driver, limit=2, processes=1, retry=RetryPolicy(attempts=2, initial_delay=0)
        ) as runner:
            outcome = await _map_with_one_lookup_dropped(runner, fn, journal, rows, app_name, pg_schema)
        assert isinstance(outcome, RunReport), repr(outcome)
        assert (outcome.stats.succeeded, outcome.stats.skipped) == (20, 0)
        assert committed(rows) == dict.fromkeys(range(20), 1)
    finally:
        with rows.begin() as connection:
            connection.execute(text(f'DROP TABLE IF EXISTS "{pg_schema}".{table}'))


async def _map_with_one_lookup_dropped(
    runner: ProcessRunner, fn: Any, journal: Journal[Any], rows: Engine, app: str, schema: str
) -> Any:
    """
    ``runner.map(fn, range(20))`` with ``journal``, whose table is locked until its first lookup was
    terminated on the server and a second one waits (or the call ended): the report, or what it raised.
    """
    table = journal.table
    ended: list[Any] = []

    def waiting() -> list[int]:
        with rows.connect() as connection:
            found = connection.execute(
                text(
                    "SELECT pid FROM pg_stat_activity WHERE application_name = :app AND state = 'active' "
                    "AND wait_event_type = 'Lock' AND query LIKE :like"
                ),
                {"app": app, "like": f"%{table}%"},
            )
            return [int(pid) for pid in found.scalars()]

    with rows.connect() as locker:  # the admin engine autocommits: its own transaction
        locker.exec_driver_sql("BEGIN")
        locker.exec_driver_sql(f'LOCK TABLE "{schema}".{table} IN ACCESS EXCLUSIVE MODE')
        async with anyio.create_task_group() as tasks:

            async def call() -> None:
                try:
                    ended.append(await runner.map(fn, range(20), journal=journal))
                except Exception as error:  # the test's to show, once the lock is gone
                    ended.append(error)

            tasks.start_soon(call)
            first: list[int] = []

            def first_waits() -> bool:
                first[:] = waiting()
                return len(first) == 1

            await anyio.to_thread.run_sync(wait_until, first_waits, 60, "a worker's lookup waits")
            with rows.connect() as connection:
                terminate = text("SELECT pg_terminate_backend(:pid, 5000)")
                assert connection.execute(terminate, {"pid": first[0]}).scalar_one() is True

            def again_or_over() -> bool:
                return bool(ended) or any(pid != first[0] for pid in waiting())

            await anyio.to_thread.run_sync(wait_until, again_or_over, 30, "the lookup asked again")
            locker.exec_driver_sql("ROLLBACK")
    return ended[0]


def kill_a_worker_when(admin: Engine, rows_at_least: int) -> tuple[threading.Thread, list[int]]:
    """A thread that SIGKILLs the worker of a committed row once ``rows_at_least`` rows are in."""
    killed: list[int] = []

    def kill() -> None:
        wait_until(lambda: sum(committed(admin).values()) >= rows_at_least, 60, f"{rows_at_least} rows")
        victim = next(iter(pids(admin)))
        os.kill(victim, signal.SIGKILL)
        killed.append(victim)

    thread = threading.Thread(target=kill, daemon=True)
    thread.start()
    return thread, killed


@pytest.mark.parametrize(
    ("driver", "fn"),
    [("asyncpg", units.insert_and_sleep), ("psycopg", units.insert_and_sleep_sync)],
    ids=["async", "sync"],
)
@pytest.mark.usefixtures("marks")
async def test_a_worker_killed_mid_run_loses_and_repeats_nothing(
    rows: Engine, make_runner: Callable[..., ProcessRunner], driver: str, fn: Any
) -> None:
    """SIGKILL one of 2 workers mid-run: its started units fail (at most its share); others run elsewhere."""
    async with make_runner(driver, limit=4, processes=2, errors="collect") as runner:
        killer, killed = kill_a_worker_when(rows, 40)
        report = await runner.map(partial(fn, seconds=0.01), range(400))
        killer.join()
        await both_ready(runner)
        serving = {pid for pid in (await runner.map(units.select_pid, range(200))).values()}
    assert len(killed) == 1
    assert [o.index for o in report.outcomes] == list(range(400))  # nothing lost
    in_doubt = report.failures
    # What the dead worker had started: at most its share. None if it was between refills then (seen
    # beside two busy processes); the test below kills a worker mid-COMMIT, which always has one.
    assert len(in_doubt) <= 2, [o.error for o in in_doubt]
    assert all(isinstance(o.error, WorkerLostError) for o in in_doubt)
    assert all(f"killed by SIGKILL (pid {killed[0]})" in str(o.error) for o in in_doubt)
    rows_by_unit = committed(rows)
    assert set(rows_by_unit.values()) == {1}  # nothing committed twice
    assert {o.index for o in report.outcomes if o.ok} <= set(rows_by_unit)
    for outcome in in_doubt:  # a unit in doubt committed only if it may have (its COMMIT was sent)
        assert outcome.index not in rows_by_unit or outcome.commit_unknown
    assert len(serving) == 2  # a new worker took the dead one's place
    assert killed[0] not in serving


@pytest.fixture
def slow_commit(rows: Engine) -> Iterator[None]:
    """A deferred constraint trigger: the COMMIT of the transaction that inserted unit 0 sleeps 2 s."""
    with rows.begin() as connection:
        connection.execute(
            text(
                "CREATE FUNCTION process_slow_commit() RETURNS trigger AS $$ BEGIN "
                "IF NEW.unit = 0 THEN PERFORM pg_sleep(2); END IF; RETURN NULL; END $$ LANGUAGE plpgsql"
            )
        )
        connection.execute(
            text(
                "CREATE CONSTRAINT TRIGGER process_slow_commit AFTER INSERT ON process_rows "
                "DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION process_slow_commit()"
            )
        )
    yield
    with rows.begin() as connection:
        connection.execute(text("DROP TRIGGER process_slow_commit ON process_rows"))
        connection.execute(text("DROP FUNCTION process_slow_commit()"))


def victim_committing(admin: Engine, app: str) -> int | None:
    """The pid of the worker whose connection runs unit 0's COMMIT now, if it does."""
    with admin.connect() as connection:
        name = connection.execute(
            text(
                "SELECT application_name FROM pg_stat_activity WHERE application_name LIKE :like "
                "AND state = 'active' AND upper(query) LIKE 'COMMIT%'"
            ),
            {"like": f"{app}-victim-%"},
        ).scalar()
    return None if name is None else int(name.rsplit("-", 1)[1])


@pytest.mark.usefixtures("slow_commit", "marks")
@pytest.mark.parametrize("verify_commits", [False, True], ids=["unknown", "verified"])
async def test_a_worker_killed_while_committing(
    rows: Engine, make_runner: Callable[..., ProcessRunner], app_name: str, verify_commits: bool
) -> None:
    """
    SIGKILL the worker whose unit's COMMIT runs on the server (which finishes it): commit_unknown,
    never run again; with verify_commits=True the next worker asks the server: ok, with its value.
    """
    killed: list[int] = []

    def kill() -> None:
        wait_until(lambda: victim_committing(rows, app_name) is not None, 30, "unit 0 committing")
        pid = victim_committing(rows, app_name)
        assert pid is not None
        os.kill(pid, signal.SIGKILL)
        killed.append(pid)

    killer = threading.Thread(target=kill, daemon=True)
    killer.start()
    async with make_runner(limit=2, processes=2, errors="collect", verify_commits=verify_commits) as runner:
        report = await runner.map(partial(units.slow_commit_victim, app=app_name), range(20))
    killer.join()
    assert len(killed) == 1
    first = report.outcomes[0]
    if verify_commits:
        assert (first.ok, first.value, first.commit_verified, first.commit_unknown) == (True, 0, True, False)
    else:
        assert isinstance(first.error, WorkerLostError)
        assert first.commit_unknown
    assert eventually(lambda: committed(rows).get(0) == 1, 10)  # the server did commit it, once
    assert all(outcome.ok for outcome in report.outcomes[1:])


# -- cancellation ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("anyio_backend", ["asyncio", "trio"])
@pytest.mark.parametrize(
    ("driver", "fn"),
    [("asyncpg", units.insert_and_sleep), ("psycopg", units.insert_and_sleep_sync)],
    ids=["async", "sync"],
)
async def test_cancelling_the_call_rolls_back_every_worker_and_leaves_nothing(
    rows: Engine,
    make_runner: Callable[..., ProcessRunner],
    app_name: str,
    driver: str,
    fn: Any,
    anyio_backend: str,
) -> None:
    """Cancelled mid-run: nothing commits after it returns; after close, no process or connection is left."""
    runner = make_runner(driver, limit=4, processes=2)
    async with runner:
        with anyio.CancelScope() as scope:

            async def cancel_at_20_rows() -> None:
                await anyio.to_thread.run_sync(
                    wait_until, lambda: sum(committed(rows).values()) >= 20, 60, "20 rows"
                )
                scope.cancel()

            async with anyio.create_task_group() as tasks:
                tasks.start_soon(cancel_at_20_rows)
                await runner.map(partial(fn, seconds=0.05), range(1000))
        assert scope.cancelled_caught
        at_cancel = committed(rows)
        workers = pids(rows)
    assert committed(rows) == at_cancel  # nothing committed after the cancellation returned
    assert 20 <= len(at_cancel) < 1000
    assert set(at_cancel.values()) == {1}
    assert eventually(lambda: backends(rows, app_name) == 0), "connections left after close"
    assert not [pid for pid in workers if alive(pid)], "worker processes left after close"


CHILD = """
import os, sys
from boundeddb import ProcessRunner
from tests.support import process_units as units

if __name__ == "__main__":
    runner = ProcessRunner(
        os.environ["CHILD_URL"], limit=4, processes=2,
        engine_options={"connect_args": {"options": "-c search_path=" + os.environ["CHILD_SCHEMA"],
                                         "application_name": os.environ["CHILD_APP"]}},
    )
    print("started", flush=True)
    try:
        with runner:
            runner.map_sync(units.insert_and_sleep_sync, range(100000))
    except KeyboardInterrupt:
        print("interrupted", flush=True)
        sys.exit(3)
    print("finished without an interrupt", flush=True)
"""


def test_ctrl_c_in_map_sync_stops_every_worker(
    tmp_path: Path, rows: Engine, pg_url: URL, pg_schema: str
) -> None:
    """SIGINT to a program in map_sync: KeyboardInterrupt after the workers rolled back; nothing left."""
    script = tmp_path / "child.py"
    script.write_text(CHILD)
    app = f"bdbt-sigint-{secrets.token_hex(4)}"
    env = {
        **os.environ,
        "CHILD_URL": driver_url(pg_url, "psycopg").render_as_string(hide_password=False),
        "CHILD_SCHEMA": pg_schema,
        "CHILD_APP": app,
        "PYTHONPATH": os.pathsep.join([str(Path(__file__).parents[2]), os.environ.get("PYTHONPATH", "")]),
    }
    child = subprocess.Popen(
        [sys.executable, str(script)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),  # as from a terminal
    )
    try:
        wait_until(lambda: sum(committed(rows).values()) >= 20, 60, "20 rows")
        workers = pids(rows)
        child.send_signal(signal.SIGINT)
        out, err = child.communicate(timeout=60)
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
        terminate_backends(rows, app)
    assert child.returncode == 3, err[-3000:]
    assert out.splitlines()[-1] == "interrupted"
    at_exit = committed(rows)
    assert set(at_exit.values()) == {1}
    assert eventually(lambda: backends(rows, app) == 0, 10)
    assert committed(rows) == at_exit
    assert not [pid for pid in workers if alive(pid)]


# -- trio -------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("anyio_backend", ["trio"])
@pytest.mark.parametrize(
    ("driver", "fn"), [("asyncpg", units.insert), ("psycopg", units.insert_sync)], ids=["async", "sync"]
)
async def test_map_from_trio(
    rows: Engine, make_runner: Callable[..., ProcessRunner], driver: str, fn: Any, anyio_backend: str
) -> None:
    """Awaited from trio (the workers run their own loops): every unit once, in order."""
    async with make_runner(driver, limit=2, processes=2) as runner:
        report = await runner.map(fn, range(100))
    assert [value[0] for value in report.values()] == list(range(100))
    assert committed(rows) == dict.fromkeys(range(100), 1)


# -- MariaDB --------------------------------------------------------------------------------------------


@pytest.mark.mysql
@pytest.mark.parametrize(
    ("driver", "fn"), [("aiomysql", units.insert), ("pymysql", units.insert_sync)], ids=["async", "sync"]
)
async def test_every_unit_runs_once_on_mariadb(mysql_db: Any, driver: str, fn: Any) -> None:
    """aiomysql and pymysql workers: every unit once, in order, at most the limit of connections."""
    engine = create_engine(mysql_db.url("pymysql"), poolclass=NullPool)
    units.Base.metadata.create_all(engine)
    engine.dispose()
    with mysql_db.sampler() as sampler:
        async with ProcessRunner(mysql_db.url(driver), limit=4, processes=2) as runner:
            report = await runner.map(fn, range(200))
    assert [value[0] for value in report.values()] == list(range(200))
    with mysql_db.admin.connect() as connection:
        found = connection.execute(text(f"SELECT unit FROM `{mysql_db.database}`.process_rows")).scalars()
        assert sorted(found) == list(range(200))
    assert sampler.peak <= 4


# -- Dask --------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def dask_client() -> Iterator[Any]:
    """A LocalCluster of 2 worker processes on this machine, for the module."""
    from distributed import Client, LocalCluster

    with (
        LocalCluster(n_workers=2, threads_per_worker=2, processes=True, dashboard_address=None) as cluster,
        Client(cluster) as client,
    ):
        yield client


def no_delay(connection: Any) -> bool:
    """Whether a TCP connection sends each write at once (``TCP_NODELAY``)."""
    with socket.socket(fileno=os.dup(connection.fileno())) as duplicate:
        return bool(duplicate.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY))


async def test_map_on_a_dask_cluster(
    rows: Engine, dask_client: Any, pg_server: PostgresServer, pg_schema: str, app_name: str
) -> None:
    """On a LocalCluster: units run in the cluster's worker processes, once each, within the limit."""
    cluster_pids = set(dask_client.run(os.getpid).values())
    options = {"connect_args": connect_args("asyncpg", pg_schema, app_name)}
    with ActivitySampler(rows, app_name) as sampler:
        async with ProcessRunner(
            driver_url(pg_server.url, "asyncpg"), limit=4, cluster=dask_client, engine_options=options
        ) as runner:
            assert runner.processes == 2
            await both_ready(runner)
            report = await runner.map(partial(units.insert_and_sleep, seconds=0.01), range(200))
            # Small messages go out at once: with Nagle's algorithm each waited for an acknowledgement.
            links = [seat.link for seat in runner._fleet.seats]
            assert all(link is not None and no_delay(link.started.connection) for link in links)
    assert [outcome.value for outcome in report.outcomes] == list(range(200))
    assert pids(rows) == cluster_pids
    assert committed(rows) == dict.fromkeys(range(200), 1)
    assert sampler.peak <= 4
    assert eventually(lambda: backends(rows, app_name) == 0)
