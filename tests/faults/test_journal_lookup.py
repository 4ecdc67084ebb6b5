"""
A journal's lookups that fail: retried as units are, and what stops the call.

Each drop is real: just before a lookup's statement goes out, :class:`Drops` ends its connection from
the server's side, from an admin connection (PostgreSQL's ``pg_terminate_backend(pid, 5000)``, which
waits until the backend is gone, MariaDB's ``KILL CONNECTION``), so the statement fails with the
driver's own lost-connection error. A ProcessRunner's worker runs its lookups in another process:
there the lookup waits on a locked journal table, and the test terminates its backend
(``runners/test_process_runner.py::test_a_process_worker_s_dropped_lookup_is_retried``).
"""

from __future__ import annotations

import collections
import re
import secrets
import threading
from collections.abc import Iterator
from typing import Any

import anyio
import anyio.to_thread
import pytest
from sqlalchemy import Column, Integer, MetaData, String, Table, event, text
from sqlalchemy import exc as sa_exc
from sqlalchemy.engine import Engine
from sqlalchemy.ext.asyncio import AsyncEngine
from sqlalchemy.orm import Session

from boundeddb import Journal, LoadFailed, RetryPolicy, RunFailed, is_transient
from tests.loads.conftest import item_rows
from tests.support.batches import (  # noqa: F401 -- the *_fixture names are fixtures pytest finds here
    BatchKit,
    bkit_fixture,
    every,
    make_sqlite_async_engine_fixture,
    make_sqlite_sync_engine_fixture,
    sqlite_file_fixture,
    sync_params,
)
from tests.support.kits import Boom
from tests.support.models import Item
from tests.support.servers import PostgreSQL

pytestmark = [pytest.mark.usefixtures("collect_garbage")]

#: The journal table of these tests (PostgreSQL's schema is shared by a worker's tests: dropped after each).
TABLE = "bdbt_lookup_journal"
#: A lookup: the SELECT of a load's committed positions or of a map()'s keys, quotes taken out.
LOOKUP = re.compile(rf"^\s*SELECT\b.*\bFROM\s+(\w+\.)?{TABLE}\b", re.S | re.I)
#: The journal table's creation, on the first lookup.
CREATE = re.compile(rf"^\s*CREATE\s+TABLE\s+(\w+\.)?{TABLE}\b", re.I)

#: asyncpg, psycopg 3 in threads, and MariaDB's asyncmy and pymysql: where a connection can be dropped.
SERVER_CASES = [
    ("semaphore", "asyncio"),
    ("threads-psycopg", "asyncio"),
    ("chunked-asyncmy", "asyncio"),
    ("threads-pymysql", "asyncio"),
]


def unique_job(name: str) -> str:
    return f"{name}-{secrets.token_hex(3)}"


class Drops:
    """
    Ends the connection of chosen statements of an engine that match ``pattern``, from the server's side,
    just before each goes out; counts every statement that matches.

    Made before the engine opens a connection: each one's server id (backend pid, thread id) is read as
    it is opened.
    """

    def __init__(self, kit: BatchKit, pattern: re.Pattern[str]) -> None:
        self._db = kit.db
        self._pattern = pattern
        self._lock = threading.Lock()
        #: Statements that matched, and how many of them were dropped.
        self.seen = 0
        self.dropped = 0
        self._drop: set[int] = set()
        engine: Engine | AsyncEngine = kit.engine
        sync_engine = engine.sync_engine if isinstance(engine, AsyncEngine) else engine
        event.listen(sync_engine, "connect", self._on_connect)
        event.listen(sync_engine, "before_cursor_execute", self._before)

    def arm(self, n: int, *, after: int = 0) -> None:
        """Drop the ``n`` matching statements that come after the next ``after`` ones."""
        with self._lock:
            self._drop = set(range(self.seen + after + 1, self.seen + after + n + 1))

    def _on_connect(self, dbapi_connection: Any, record: Any) -> None:
        if self._db.name == "sqlite":  # a file has no connection to end: only counted there
            return
        ask = "SELECT pg_backend_pid()" if isinstance(self._db, PostgreSQL) else "SELECT CONNECTION_ID()"
        cursor = dbapi_connection.cursor()
        cursor.execute(ask)
        record.info["server_id"] = int(cursor.fetchone()[0])
        cursor.close()
        dbapi_connection.rollback()

    def _before(self, connection: Any, _cursor: Any, statement: str, *_: Any) -> None:
        if not self._pattern.match(re.sub(r"[`\"]", "", statement)):
            return
        with self._lock:
            self.seen += 1
            if self.seen not in self._drop:
                return
            self.dropped += 1
        server_id = int(connection.info["server_id"])
        with self._db.admin.connect() as admin:
            if isinstance(self._db, PostgreSQL):
                ended = admin.execute(text("SELECT pg_terminate_backend(:pid, 5000)"), {"pid": server_id})
                assert ended.scalar_one() is True
            else:
                admin.execute(text(f"KILL CONNECTION {server_id}"))


@pytest.fixture
def lkit(bkit: BatchKit) -> Iterator[BatchKit]:
    """The batch tests' kit; on PostgreSQL the journal table is dropped before and after."""
    if isinstance(bkit.db, PostgreSQL):
        with bkit.db.admin.connect() as connection:
            connection.execute(text(f"DROP TABLE IF EXISTS {TABLE}"))
    yield bkit
    if isinstance(bkit.db, PostgreSQL):
        bkit.db.terminate()
        with bkit.db.admin.connect() as connection:
            connection.execute(text(f"DROP TABLE IF EXISTS {TABLE}"))


def no_wait(attempts: int) -> RetryPolicy:
    """The default predicate (is_transient), ``attempts`` tries, no back-off: the tests stay quick."""
    return RetryPolicy(attempts=attempts, initial_delay=0, jitter=False)


# -- load() ---------------------------------------------------------------------------------------------


@pytest.mark.anyio
@every(SERVER_CASES)
async def test_a_load_s_dropped_lookup_is_retried_on_a_fresh_connection(lkit: BatchKit) -> None:
    """The lookup's connection ended once: retried on a new one, as a chunk is; each row loaded once."""
    retries: list[tuple[str, int, int]] = []

    def on_retry(error: Exception, attempt: int, _delay: float) -> None:
        retries.append((type(error).__name__, attempt, lkit.pool.checkedout()))

    policy = RetryPolicy(attempts=2, initial_delay=0, jitter=False, on_retry=on_retry)
    runner = lkit.runner(limit=2, retry=policy)
    drops = Drops(lkit, LOOKUP)
    job = Journal(unique_job("load"), table=TABLE)
    rows = item_rows(100)
    first = await runner.load(Item, rows[:40], batch=20, journal=job)
    assert (first.loaded, drops.seen) == (40, 1)
    drops.arm(1)
    report = await runner.load(Item, rows, batch=20, journal=job)
    assert (drops.seen, drops.dropped) == (3, 1), "the lookup ran again after its drop"
    assert (report.loaded, report.skipped, report.rejected, report.transactions) == (60, 40, [], 3)
    assert lkit.rows() == dict.fromkeys(range(100), 1)
    assert len(retries) == 1
    assert retries[0][1:] == (1, 0), "attempt 1 failed; no connection held while it backed off"
    assert lkit.pool.checkedout() == 0


@pytest.mark.anyio
@every(SERVER_CASES)
async def test_a_load_whose_lookup_is_dropped_past_the_policy_raises_load_failed(lkit: BatchKit) -> None:
    """Dropped on each of its 2 attempts: LoadFailed, nothing loaded, the driver's error as its cause."""
    runner = lkit.runner(limit=2, retry=no_wait(2))
    drops = Drops(lkit, LOOKUP)
    drops.arm(2)
    job = Journal(unique_job("load-past"), table=TABLE)
    with pytest.raises(LoadFailed) as raised:
        await runner.load(Item, item_rows(50), batch=20, journal=job)
    failed = raised.value
    assert drops.seen == 2
    cause = failed.__cause__
    assert isinstance(cause, sa_exc.DBAPIError), repr(cause)
    assert is_transient(cause)
    message = str(failed)
    assert message.startswith(
        f"the load stopped before its first chunk: the lookup of journal {job.job!r} failed "
        f"({type(cause).__name__}: "
    ), message
    assert message.endswith("no row was loaded: rerun with the same journal once its cause is fixed")
    report = failed.report
    assert (report.loaded, report.skipped, report.rejected, report.transactions) == (0, 0, [], 0)
    assert report.stats.submitted == 0
    assert lkit.rows() == {}
    assert lkit.pool.checkedout() == 0
    again = await runner.load(Item, item_rows(50), batch=20, journal=job)
    assert (again.loaded, again.skipped) == (50, 0)
    assert lkit.rows() == dict.fromkeys(range(50), 1)


def wrong_shape(kit: BatchKit) -> None:
    """A journal table without the columns a journal reads: its lookup fails on the server, every time."""
    table = Table(TABLE, MetaData(), Column("job", String(100)), Column("other", Integer))
    table.create(kit.admin())


@pytest.mark.anyio
@every([*SERVER_CASES, ("threads-pysqlite", "asyncio")])
async def test_a_load_whose_lookup_fails_for_good_stops_at_once_with_load_failed(lkit: BatchKit) -> None:
    """A lookup error the policy does not retry (a journal table of the wrong shape): LoadFailed, one try."""
    wrong_shape(lkit)
    runner = lkit.runner(limit=2, retry=no_wait(3))
    drops = Drops(lkit, LOOKUP)
    job = Journal(unique_job("load-shape"), table=TABLE)
    with pytest.raises(LoadFailed) as raised:
        await runner.load(Item, item_rows(30), batch=10, journal=job)
    assert drops.seen == 1, "not retried"
    cause = raised.value.__cause__
    assert isinstance(cause, sa_exc.DBAPIError), repr(cause)
    assert not is_transient(cause)
    assert f"({type(cause).__name__}: " in str(raised.value)
    report = raised.value.report
    assert (report.loaded, report.skipped, report.transactions) == (0, 0, 0)
    assert lkit.rows() == {}
    assert lkit.pool.checkedout() == 0


@pytest.mark.anyio
@every([("semaphore", "asyncio"), ("threads-pymysql", "asyncio")])
async def test_the_journal_table_s_creation_dropped_is_retried_with_the_lookup(lkit: BatchKit) -> None:
    """The first lookup creates the table: its CREATE TABLE's connection ended once, it is retried."""
    runner = lkit.runner(limit=2, retry=no_wait(2))
    drops = Drops(lkit, CREATE)
    drops.arm(1)
    journal = Journal(unique_job("create"), table=TABLE)
    report = await runner.load(Item, item_rows(30), batch=10, journal=journal)
    assert (drops.seen, drops.dropped) == (2, 1)
    assert (report.loaded, report.transactions) == (30, 3)
    assert lkit.rows() == dict.fromkeys(range(30), 1)


@pytest.mark.parametrize("case", sync_params([("threads-psycopg", "asyncio")]))
def test_load_sync_s_dropped_lookup_past_the_policy_raises_load_failed(lkit: BatchKit) -> None:
    """load_sync() too: LoadFailed with the driver's error as its cause."""
    runner = lkit.runner(limit=2, retry=no_wait(2))
    drops = Drops(lkit, LOOKUP)
    drops.arm(2)
    with pytest.raises(LoadFailed) as raised:
        runner.load_sync(Item, item_rows(20), batch=10, journal=Journal(unique_job("sync"), table=TABLE))
    assert drops.seen == 2
    assert is_transient(raised.value.__cause__)
    assert raised.value.report.loaded == 0


# -- map() ----------------------------------------------------------------------------------------------


@pytest.mark.anyio
@every(SERVER_CASES)
async def test_a_map_s_later_lookup_dropped_is_retried_and_each_item_runs_once(lkit: BatchKit) -> None:
    """200 items, 3 lookups; the second one's connection ended once: each item runs once."""
    runner = lkit.runner(limit=3, retry=no_wait(2))
    drops = Drops(lkit, LOOKUP)
    drops.arm(1, after=1)
    journal = Journal[int](unique_job("map"), key=int, table=TABLE)
    report = await runner.map(lkit.map_fn(), range(200), journal=journal)
    assert (drops.seen, drops.dropped) == (4, 1)
    assert report.values() == [10 * i for i in range(200)]
    assert lkit.executions == collections.Counter(range(200))
    assert lkit.rows() == dict.fromkeys(range(200), 1)
    assert lkit.pool.checkedout() == 0


@pytest.mark.anyio
@every(SERVER_CASES)
async def test_a_map_s_lookup_dropped_past_the_policy_raises_the_driver_s_error(lkit: BatchKit) -> None:
    """The second lookup dropped on both its attempts: the driver's own error, after the first chunk ran."""
    runner = lkit.runner(limit=3, retry=no_wait(2), errors="collect")
    drops = Drops(lkit, LOOKUP)
    drops.arm(2, after=1)
    journal = Journal[int](unique_job("map-past"), key=int, table=TABLE)
    with pytest.raises(sa_exc.DBAPIError) as raised:
        await runner.map(lkit.map_fn(), range(200), journal=journal)
    assert is_transient(raised.value)
    assert drops.seen == 3, "the second lookup was tried twice"
    assert lkit.executions == collections.Counter(range(32)), "the first chunk ran, nothing after it"
    assert lkit.rows() == dict.fromkeys(range(32), 1)
    assert lkit.pool.checkedout() == 0
    report = await runner.map(lkit.map_fn(), range(200), journal=journal)
    assert (report.stats.succeeded, report.stats.skipped) == (168, 32)
    assert lkit.rows() == dict.fromkeys(range(200), 1)


# -- what stops a lookup's back-off ------------------------------------------------------------------------


def backing_off_for_a_minute(event: threading.Event) -> RetryPolicy:
    """A policy whose one back-off lasts 60 s, far longer than the test: ``event`` is set as it begins."""
    return RetryPolicy(
        attempts=2, initial_delay=60, max_delay=60, jitter=False, on_retry=lambda *_: event.set()
    )


@pytest.mark.anyio
@pytest.mark.parametrize("verb", ["map", "load"])
@every([("semaphore", "asyncio"), ("threads-psycopg", "asyncio"), ("threads-psycopg", "trio")])
async def test_a_call_cancelled_while_its_lookup_backs_off_ends_at_once(lkit: BatchKit, verb: str) -> None:
    """Cancelled in a lookup's 60 s back-off, in a thread or on the loop: it ends at once, leaks nothing."""
    backing_off = threading.Event()
    runner = lkit.runner(limit=2, retry=backing_off_for_a_minute(backing_off))
    drops = Drops(lkit, LOOKUP)
    drops.arm(1)
    job = unique_job("cancel")

    async def call() -> None:
        if verb == "map":
            await runner.map(lkit.map_fn(), range(50), journal=Journal[int](job, key=int, table=TABLE))
        else:
            await runner.load(Item, item_rows(50), batch=10, journal=Journal(job, table=TABLE))

    with anyio.fail_after(20):  # a third of the back-off
        async with anyio.create_task_group() as tasks:
            tasks.start_soon(call)
            assert await anyio.to_thread.run_sync(backing_off.wait, 15, abandon_on_cancel=True)
            tasks.cancel_scope.cancel()
    assert drops.seen == 1
    assert lkit.rows() == {}
    assert lkit.pool.checkedout() == 0


@pytest.mark.anyio
@every([("threads-psycopg", "asyncio"), ("threads-pymysql", "asyncio")])
async def test_a_unit_failing_while_a_lookup_backs_off_in_a_thread_raises_run_failed(lkit: BatchKit) -> None:
    """errors="raise", a unit fails while the next lookup backs off: RunFailed at once, not the lookup's."""
    backing_off = threading.Event()
    runner = lkit.runner(limit=3, retry=backing_off_for_a_minute(backing_off))
    drops = Drops(lkit, LOOKUP)
    drops.arm(1, after=1)

    def fn(session: Session, item: int) -> int:
        if item == 31:  # the first chunk's last: pulled before the second chunk is looked up
            assert backing_off.wait(15)
            raise Boom(item)
        session.add(Item(key=f"k{item}", unit=item))
        return item

    with anyio.fail_after(20), pytest.raises(RunFailed) as raised:
        await runner.map(fn, range(200), journal=Journal[int](unique_job("raise"), key=int, table=TABLE))
    assert [type(error) for error in raised.value.exceptions] == [Boom]
    assert drops.seen == 2
    assert lkit.rows() == dict.fromkeys(range(31), 1)
    assert lkit.pool.checkedout() == 0
