"""
``map(fn, items, journal=Journal(...))``: each item's effects exactly once across reruns.

On the real databases, never a mock: PostgreSQL (asyncpg, psycopg 3 async and sync, psycopg2), MariaDB
(aiomysql, asyncmy, pymysql) and SQLite files (aiosqlite, pysqlite), with the batch tests' kit
(tests/support/batches.py), which gives each test its own items table (MariaDB: its own database,
SQLite: its own file; PostgreSQL: the run's schema, where :func:`jkit` drops the journal tables after
each test).

A lost COMMIT is made by :class:`CommitCut`, a TCP proxy that speaks enough of the PostgreSQL and of
the MySQL protocol to find a ``COMMIT`` on its way to the server, and either forwards it and cuts the
client off (the server commits, the client never hears it), or cuts both sides before it (the server
never gets it, and rolls back when the connection goes).
"""

from __future__ import annotations

import collections
import contextlib
import inspect as pyinspect
import re
import secrets
import socket
import threading
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

import anyio
import anyio.lowlevel
import anyio.to_thread
import pytest
from sqlalchemy import (
    Column,
    Integer,
    MetaData,
    String,
    Table,
    create_engine,
    event,
    func,
    inspect,
    select,
    text,
)
from sqlalchemy import exc as sa_exc
from sqlalchemy.engine import URL, Engine
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession, async_sessionmaker, create_async_engine
from sqlalchemy.orm import Session, sessionmaker

from boundeddb import (
    BatchPolicy,
    BoundedDBError,
    ChunkedRunner,
    Journal,
    Outcome,
    RetryPolicy,
    SemaphoreRunner,
    ThreadOffloadRunner,
    UnitMisuseError,
    UnitTimeout,
)
from boundeddb.testing import PostgresServer, driver_url
from tests.runners.test_progress import RecordingProgress
from tests.support.batches import (  # noqa: F401 -- the *_fixture names are fixtures pytest finds here
    ALL_CASES,
    ONE_OF_EACH,
    BatchKit,
    bkit_fixture,
    every,
    make_sqlite_async_engine_fixture,
    make_sqlite_sync_engine_fixture,
    sqlite_file_fixture,
    sync_params,
)
from tests.support.kits import Boom, parse_kind
from tests.support.models import Item
from tests.support.servers import Database, MariaDB, PostgreSQL
from tests.support.telemetry import Telemetry, telemetry_fixture  # noqa: F401 -- a fixture pytest finds here

pytestmark = [pytest.mark.usefixtures("collect_garbage")]

DEFAULT_TABLE = "boundeddb_journal"
#: A table name of the tests' own (Journal(table=...)).
CUSTOM_TABLE = "bdbt_custom_journal"
#: Every journal table a test here may create: dropped after each PostgreSQL test (the schema is shared).
TABLES = (DEFAULT_TABLE, CUSTOM_TABLE)

THREAD_CASES = [(case, backend) for case, backend in ALL_CASES if case.startswith("threads")]


# -- the journal's rows, seen from outside the runner ------------------------------------------------------


def rows_table(name: str = DEFAULT_TABLE) -> Table:
    """The journal table's columns that the tests read and write, in a MetaData of the tests' own."""
    return Table(name, MetaData(), Column("job", String(255)), Column("item_key", String(255)))


def text_of(value: object) -> str:
    """A key or job as read back: MySQL/MariaDB keep them as VARBINARY, the text's UTF-8 bytes."""
    return value.decode() if isinstance(value, bytes) else str(value)


def journal_keys(kit: BatchKit, job: str, table: str = DEFAULT_TABLE) -> set[str]:
    """The keys of ``job``'s rows in ``table``, from a connection beside the runner's."""
    rows = rows_table(table)
    with kit.admin().connect() as connection:
        return {
            text_of(key)
            for key in connection.execute(select(rows.c.item_key).where(rows.c.job == job)).scalars()
        }


def journal_counts(kit: BatchKit, table: str = DEFAULT_TABLE) -> dict[str, int]:
    """How many rows each job has in ``table``."""
    rows = rows_table(table)
    with kit.admin().connect() as connection:
        query = select(rows.c.job, func.count()).group_by(rows.c.job)
        return {text_of(job): int(n) for job, n in connection.execute(query)}


def insert_keys(kit: BatchKit, job: str, keys: list[str], table: str = DEFAULT_TABLE) -> None:
    """Write rows for ``keys`` as a run that committed them would have."""
    rows = rows_table(table)
    with kit.admin().begin() as connection:
        connection.execute(rows.insert(), [{"job": job, "item_key": key} for key in keys])


def table_exists(kit: BatchKit, name: str) -> bool:
    """Whether the table ``name`` exists where the runner's engine sees it."""
    db = kit.db
    if isinstance(db, MariaDB):
        return bool(inspect(db.admin).has_table(name, schema=db.database))
    if isinstance(db, PostgreSQL):
        return bool(inspect(db.admin).has_table(name))
    return bool(inspect(kit.admin()).has_table(name))


def drop_journal_tables(admin: Engine) -> None:
    """Drop every journal table a test may have made in PostgreSQL's shared schema."""
    with admin.connect() as connection:
        for name in TABLES:
            connection.execute(text(f"DROP TABLE IF EXISTS {name}"))


@pytest.fixture
def jkit(bkit: BatchKit) -> Iterator[BatchKit]:
    """The batch tests' kit, with no journal table yet; on PostgreSQL the journal tables are dropped after."""
    if isinstance(bkit.db, PostgreSQL):
        drop_journal_tables(bkit.db.admin)
    yield bkit
    if isinstance(bkit.db, PostgreSQL):
        bkit.db.terminate()  # a connection left in a transaction would block DROP TABLE
        drop_journal_tables(bkit.db.admin)


def unique_job(name: str) -> str:
    return f"{name}-{secrets.token_hex(3)}"


async def create_table(engine: Engine | AsyncEngine, table: str = DEFAULT_TABLE) -> None:
    """Journal.create(), awaited if the engine is an AsyncEngine."""
    if isinstance(engine, AsyncEngine):
        await Journal.create(engine, table=table)
    else:
        assert Journal.create(engine, table=table) is None


# -- map()'s function ------------------------------------------------------------------------------------


class Work:
    """
    ``fn(session, item)`` for a kit's runner: counts each item's executions, adds its Item row
    (``k<item>``) and flushes it, then raises Boom if the item is in ``failing``; returns 10 item.
    """

    def __init__(self, kit: BatchKit, *, writes: bool = True) -> None:
        self.is_async = kit.is_async
        self.writes = writes
        self.failing: set[int] = set()
        self.executions: collections.Counter[int] = collections.Counter()
        self._lock = threading.Lock()

    def _ran(self, item: int) -> None:
        with self._lock:
            self.executions[item] += 1

    def fn(self) -> Callable[..., Any]:
        if self.is_async:

            async def fn(session: AsyncSession, item: int) -> int:
                self._ran(item)
                if self.writes:
                    session.add(Item(key=f"k{item}", unit=item))
                    await session.flush()
                if item in self.failing:
                    raise Boom(item)
                return 10 * item

            return fn

        def sync_fn(session: Session, item: int) -> int:
            self._ran(item)
            if self.writes:
                session.add(Item(key=f"k{item}", unit=item))
                session.flush()
            if item in self.failing:
                raise Boom(item)
            return 10 * item

        return sync_fn


def keyed(prefix: str = "item-") -> Callable[[int], str]:
    return lambda item: f"{prefix}{item}"


def hook() -> tuple[list[Outcome[Any]], Callable[[Outcome[Any]], None]]:
    seen: list[Outcome[Any]] = []
    return seen, seen.append


def assert_skipped(outcome: Outcome[Any]) -> None:
    assert (outcome.ok, outcome.skipped, outcome.value, outcome.error, outcome.attempts) == (
        True,
        True,
        None,
        None,
        0,
    ), outcome
    assert (outcome.commit_unknown, outcome.commit_verified) == (False, False)


# -- skipped outcomes and counts ---------------------------------------------------------------------------


@pytest.mark.anyio
@every(ALL_CASES)
async def test_a_rerun_runs_only_what_failed_and_skips_the_rest_in_input_order(jkit: BatchKit) -> None:
    """
    Run, 4 of 50 items fail (collect): rerun runs those 4 and skips the 46 in input order, ok with no
    value and 0 attempts; RunStats/statistics().skipped count them, submitted/succeeded do not; the
    map's and the runner's on_outcome see them; a third run skips all 50. Effects once each.
    """
    n, failing = 50, {3, 17, 18, 41}
    runner_seen, runner_hook = hook()
    runner = jkit.runner(limit=4, errors="collect", on_outcome=runner_hook)
    work = Work(jkit)
    work.failing = set(failing)
    job = unique_job("rerun")
    journal = Journal[int](job, key=keyed())
    assert not table_exists(jkit, DEFAULT_TABLE)

    first = await runner.map(work.fn(), range(n), journal=journal)
    assert table_exists(jkit, DEFAULT_TABLE), "create_table=True creates it at the first map()"
    assert [o.index for o in first.outcomes] == list(range(n))
    assert {o.index for o in first.outcomes if not o.ok} == failing
    assert all(isinstance(o.error, Boom) for o in first.outcomes if not o.ok)
    assert not any(o.skipped for o in first.outcomes)
    ok = [i for i in range(n) if i not in failing]
    assert journal_keys(jkit, job) == {f"item-{i}" for i in ok}, "a unit that raised left no journal row"
    assert jkit.rows() == dict.fromkeys(ok, 1)
    assert (first.stats.skipped, first.stats.submitted, first.stats.succeeded) == (0, n, n - 4)

    work.failing.clear()
    seen, on_outcome = hook()
    runner_seen.clear()
    second = await runner.map(work.fn(), range(n), journal=journal, on_outcome=on_outcome)
    outcomes = second.outcomes
    assert [o.index for o in outcomes] == list(range(n))
    assert [o.skipped for o in outcomes] == [i not in failing for i in range(n)]
    for outcome in outcomes:
        if outcome.skipped:
            assert_skipped(outcome)
        else:
            assert (outcome.ok, outcome.value, outcome.attempts) == (True, 10 * outcome.index, 1)
    assert work.executions == collections.Counter({i: 2 if i in failing else 1 for i in range(n)})
    assert jkit.rows() == dict.fromkeys(range(n), 1)
    assert journal_keys(jkit, job) == {f"item-{i}" for i in range(n)}
    stats = second.stats
    assert (stats.skipped, stats.submitted, stats.succeeded, stats.failed) == (n - 4, 4, 4, 0)
    # Both hooks saw every outcome once, the skipped ones in input order.
    for hooked in (seen, runner_seen):
        assert sorted(o.index for o in hooked) == list(range(n))
        skipped = [o.index for o in hooked if o.skipped]
        assert skipped == sorted(skipped) == [i for i in range(n) if i not in failing]
    totals = runner.statistics()
    assert (totals.skipped, totals.succeeded, totals.failed) == (n - 4, n, 4)

    third = await runner.map(work.fn(), range(n), journal=journal)
    assert all(o.skipped for o in third.outcomes)
    assert (third.stats.skipped, third.stats.submitted, third.stats.succeeded) == (n, 0, 0)
    assert sum(work.executions.values()) == n + 4, "a run of skipped items runs nothing"
    assert runner.statistics().skipped == 2 * n - 4
    assert jkit.rows() == dict.fromkeys(range(n), 1)
    assert jkit.pool.checkedout() == 0


@pytest.mark.anyio
@every(ALL_CASES)
async def test_the_journal_row_is_written_first_in_the_units_own_transaction(jkit: BatchKit) -> None:
    """Inside fn its row is there already, in its own transaction only: another connection sees none."""
    runner = jkit.runner(limit=2)
    job = unique_job("own-transaction")
    rows = rows_table()
    inside: dict[int, tuple[int, set[str]]] = {}

    def outside() -> set[str]:
        return journal_keys(jkit, job)

    if jkit.is_async:

        async def fn(session: AsyncSession, item: int) -> int:
            query = select(func.count()).select_from(rows).where(rows.c.job == job)
            mine = int((await session.execute(query)).scalar_one())
            inside[item] = (mine, await anyio.to_thread.run_sync(outside))
            return item

        report = await runner.map(fn, [1], journal=Journal[int](job, key=str))
    else:

        def sync_fn(session: Session, item: int) -> int:
            query = select(func.count()).select_from(rows).where(rows.c.job == job)
            inside[item] = (int(session.execute(query).scalar_one()), outside())
            return item

        report = await runner.map(sync_fn, [1], journal=Journal[int](job, key=str))
    assert report.values() == [1]
    assert inside == {1: (1, set())}, "written first, in the unit's transaction, not yet committed"
    assert journal_keys(jkit, job) == {"1"}


@pytest.mark.anyio
@every(ALL_CASES)
async def test_with_batches_a_failing_unit_leaves_only_its_own_row_out(jkit: BatchKit) -> None:
    """batch=BatchPolicy(10), one of 30 units raises: the 29 others' rows and effects exactly once."""
    n, bad = 30, 13
    runner = jkit.runner(limit=3, batch=BatchPolicy(10), errors="collect")
    work = Work(jkit)
    work.failing = {bad}
    job = unique_job("batches")
    journal = Journal[int](job, key=keyed())
    first = await runner.map(work.fn(), range(n), journal=journal)
    assert [o.index for o in first.outcomes if not o.ok] == [bad]
    assert isinstance(first.outcomes[bad].error, Boom)
    assert jkit.rows() == {i: 1 for i in range(n) if i != bad}
    assert journal_keys(jkit, job) == {f"item-{i}" for i in range(n) if i != bad}
    assert first.stats.batches_committed >= 1

    work.failing.clear()
    before = work.executions[bad]
    second = await runner.map(work.fn(), range(n), journal=journal)
    assert [o.index for o in second.outcomes if not o.skipped] == [bad]
    assert second.outcomes[bad].ok
    assert second.stats.skipped == n - 1
    assert jkit.rows() == dict.fromkeys(range(n), 1)
    assert journal_keys(jkit, job) == {f"item-{i}" for i in range(n)}
    assert work.executions[bad] == before + 1, "run once more, alone"
    assert jkit.pool.checkedout() == 0


@pytest.mark.anyio
@every(ONE_OF_EACH)
async def test_an_async_iterable_of_items_is_journalled_too(jkit: BatchKit) -> None:
    """An async generator of items: the same skips, in input order, and effects once."""
    n = 40
    runner = jkit.runner(limit=3, errors="collect")
    work = Work(jkit)
    work.failing = {5, 6, 30}
    journal = Journal[int](unique_job("async-items"), key=int)

    async def items() -> AsyncIterator[int]:
        for i in range(n):
            if i % 7 == 0:
                await anyio.lowlevel.checkpoint()
            yield i

    first = await runner.map(work.fn(), items(), journal=journal)
    assert {o.index for o in first.outcomes if not o.ok} == {5, 6, 30}
    work.failing.clear()
    second = await runner.map(work.fn(), items(), journal=journal)
    assert [o.index for o in second.outcomes] == list(range(n))
    assert [o.index for o in second.outcomes if not o.skipped] == [5, 6, 30]
    assert all(o.ok for o in second.outcomes)
    assert jkit.rows() == dict.fromkeys(range(n), 1)
    assert journal_keys(jkit, journal.job) == {str(i) for i in range(n)}


@pytest.mark.parametrize("case", sync_params(THREAD_CASES))
def test_map_sync_with_a_journal(jkit: BatchKit) -> None:
    """ThreadOffloadRunner.map_sync(journal=...): failures rerun, the rest skipped, hooks served."""
    n = 30
    runner = jkit.runner(limit=3, errors="collect")
    assert isinstance(runner, ThreadOffloadRunner)
    work = Work(jkit)
    work.failing = {0, 29}
    journal = Journal[int](unique_job("map-sync"), key=keyed())
    first = runner.map_sync(work.fn(), range(n), journal=journal)
    assert {o.index for o in first.outcomes if not o.ok} == {0, 29}
    work.failing.clear()
    seen, on_outcome = hook()
    second = runner.map_sync(work.fn(), list(range(n)), journal=journal, on_outcome=on_outcome)
    assert [o.index for o in second.outcomes if not o.skipped] == [0, 29]
    assert all(o.ok for o in second.outcomes)
    assert second.stats.skipped == n - 2
    assert [o.index for o in seen if o.skipped] == list(range(1, n - 1))
    assert jkit.rows() == dict.fromkeys(range(n), 1)
    assert runner.statistics().skipped == n - 2


# -- lookups: in chunks, one query each --------------------------------------------------------------------


class Statements:
    """The statements an engine sends that name the journal table: lookups (with their key count), inserts."""

    LOOKUP = re.compile(rf"^\s*SELECT\b.*\bFROM\s+(\w+\.)?{DEFAULT_TABLE}\b", re.S | re.I)
    INSERT = re.compile(rf"^\s*INSERT\s+INTO\s+(\w+\.)?{DEFAULT_TABLE}\b", re.S | re.I)

    def __init__(self, engine: Engine | AsyncEngine) -> None:
        self.lookups: list[int] = []
        #: The thread each lookup ran in.
        self.lookup_threads: list[int] = []
        self.inserts = 0
        self.others: list[str] = []
        self._lock = threading.Lock()
        sync_engine = engine.sync_engine if isinstance(engine, AsyncEngine) else engine
        event.listen(sync_engine, "before_cursor_execute", self._on_statement)

    def _on_statement(self, _c: Any, _cursor: Any, statement: str, parameters: Any, *_: Any) -> None:
        bare = re.sub(r"[`\"]", "", statement)
        if DEFAULT_TABLE not in bare:
            return
        with self._lock:
            if self.LOOKUP.match(bare):
                self.lookups.append(_keys_bound(parameters))
                self.lookup_threads.append(threading.get_ident())
            elif self.INSERT.match(bare):
                self.inserts += 1
            else:
                self.others.append(bare)


def _keys_bound(parameters: Any) -> int:
    """How many keys a lookup binds: one array of them (PostgreSQL), or one parameter each and the job."""
    values = list(parameters.values()) if isinstance(parameters, dict) else list(parameters)
    arrays = [value for value in values if isinstance(value, (list, tuple))]
    return len(arrays[0]) if arrays else len(values) - 1


#: The most keys one lookup takes, once every key of the chunks before was done (a resume): PostgreSQL
#: binds one array, the others one parameter per key.
MOST_KEYS = {"postgresql": 10_000, "mariadb": 500, "sqlite": 500}


def chunks(n: int, done: set[int], most: int = 500) -> list[int]:
    """
    The sizes of the lookups of items ``0..n-1``, ``done`` of them done already: 32 first, then twice
    the size before, up to 500, or up to ``most`` after a chunk whose keys were all done.
    """
    sizes, size, start = [], 32, 0
    while start < n:
        chunk = range(start, min(start + size, n))
        sizes.append(len(chunk))
        start += len(chunk)
        size = min(2 * size, most if done.issuperset(chunk) else 500)
    return sizes


def test_chunk_sizes() -> None:
    assert chunks(2000, set()) == [32, 64, 128, 256, 500, 500, 500, 20]
    assert chunks(2000, set(range(2000)), 10_000) == [32, 64, 128, 256, 512, 1008]
    assert chunks(32, set()) == [32]
    assert chunks(33, set()) == [32, 1]


@pytest.mark.anyio
@every(ONE_OF_EACH)
async def test_keys_are_looked_up_in_doubling_chunks_never_per_item(jkit: BatchKit) -> None:
    """
    2,000 items, every other one done: 8 lookups of 32, 64, 128, 256, 500, 500, 500 and 20 keys, an
    INSERT per item run, no other query per item; the first 1,500 done (a resume): chunks grow past
    500 where the database takes more keys per query; 20 items: one lookup of 20.
    """
    n = 2000
    runner = jkit.runner(limit=8, errors="collect")
    assert jkit.engine is not None
    job = unique_job("chunks")
    await create_table(jkit.engine)
    insert_keys(jkit, job, [str(i) for i in range(0, n, 2)])
    statements = Statements(jkit.engine)
    work = Work(jkit, writes=False)
    with anyio.fail_after(120):
        report = await runner.map(work.fn(), range(n), journal=Journal[int](job, key=int))
    assert [o.skipped for o in report.outcomes] == [i % 2 == 0 for i in range(n)]
    assert all(o.ok for o in report.outcomes)
    assert sorted(work.executions) == list(range(1, n, 2))
    assert statements.lookups == chunks(n, set(range(0, n, 2))) == [32, 64, 128, 256, 500, 500, 500, 20]
    assert statements.inserts == n // 2
    assert len(statements.others) <= 1, statements.others[:5]  # the table's check, once per call
    assert report.stats.skipped == n // 2
    # The lookups take a connection of the runner's pool within a unit's slot: never more than limit.
    assert report.stats.peak_connections <= runner.limit
    if not jkit.is_async:  # the worker threads pull the items and look their keys up: never the loop
        assert threading.get_ident() not in statements.lookup_threads

    resumed = unique_job("resume")
    insert_keys(jkit, resumed, [str(i) for i in range(1500)])
    statements.lookups.clear()
    with anyio.fail_after(120):
        report = await runner.map(work.fn(), range(n), journal=Journal[int](resumed, key=int))
    assert report.stats.skipped == 1500
    assert statements.lookups == chunks(n, set(range(1500)), MOST_KEYS[jkit.db.name])

    statements.lookups.clear()
    again = await runner.map(work.fn(), range(n, n + 20), journal=Journal[int](job, key=int))
    assert again.stats.succeeded == 20
    assert statements.lookups == [20]


@pytest.mark.anyio
@every(ONE_OF_EACH)
@pytest.mark.parametrize("batch", [None, 8], ids=["unit", "batch"])
async def test_an_input_that_fails_during_a_resume_is_raised_after_what_came_before(
    jkit: BatchKit, batch: int | None
) -> None:
    """
    A resume of 3,000 done items whose input raises at item 3,000: the run raises that error, with
    errors="collect" too, after settling the chunks read before it (each chunk's items are looked
    up, and settled, while the next is read): skipped, in input order, none run; no connection left.
    """
    n = 3000
    runner = jkit.runner(limit=3, errors="collect", batch=batch)
    assert jkit.engine is not None
    job = unique_job("input-fails")
    await create_table(jkit.engine)
    insert_keys(jkit, job, [str(i) for i in range(n)])
    work = Work(jkit, writes=False)

    def items() -> Iterator[int]:
        yield from range(n)
        raise ValueError("the input's own error")

    seen, on_outcome = hook()
    with anyio.fail_after(120), pytest.raises(ValueError, match="the input's own error"):
        await runner.map(work.fn(), items(), journal=Journal[int](job, key=int), on_outcome=on_outcome)
    assert not work.executions
    # The chunk being read when the input raised is lost (its items were never keyed), no other.
    assert 1900 <= len(seen) < n
    assert [o.index for o in seen] == list(range(len(seen)))
    assert all(o.skipped for o in seen)
    assert jkit.pool.checkedout() == 0


@pytest.mark.anyio
@every(ONE_OF_EACH)
async def test_with_errors_raise_a_bad_key_among_done_items_stops_the_run(jkit: BatchKit) -> None:
    """
    A resume of 3,000 items, done but for item 2,500 whose key is wrong (errors="raise"): the run
    raises that UnitMisuseError once the items before it settled, and runs none; later ones unsettled.
    """
    n, bad = 3000, 2500
    runner = jkit.runner(limit=3)
    assert jkit.engine is not None
    job = unique_job("raise-among-done")
    await create_table(jkit.engine)
    insert_keys(jkit, job, [str(i) for i in range(n) if i != bad])
    work = Work(jkit, writes=False)
    seen, on_outcome = hook()

    def key(item: int) -> object:
        return 2.5 if item == bad else item

    with anyio.fail_after(120), pytest.raises(UnitMisuseError, match=re.escape("2.5")):
        await runner.map(work.fn(), range(n), journal=Journal[int](job, key=key), on_outcome=on_outcome)  # type: ignore[arg-type]
    assert not work.executions
    assert [o.index for o in seen] == list(range(bad + 1))
    assert all(o.skipped for o in seen[:bad])
    assert isinstance(seen[bad].error, UnitMisuseError)
    assert jkit.pool.checkedout() == 0


# -- bad input -------------------------------------------------------------------------------------------


@pytest.mark.anyio
@every(ONE_OF_EACH)
async def test_a_key_that_is_neither_str_nor_int_fails_its_item_only(jkit: BatchKit) -> None:
    """key(item) gives 2.5, None, True, b"x": those items fail with UnitMisuseError naming it; never run."""
    bad: dict[int, object] = {2: 2.5, 4: None, 6: True, 8: b"x"}
    runner = jkit.runner(limit=3, errors="collect")
    work = Work(jkit)
    job = unique_job("bad-keys")
    report = await runner.map(work.fn(), range(10), journal=Journal[int](job, key=lambda i: bad.get(i, i)))  # type: ignore[arg-type,return-value]
    for outcome in report.outcomes:
        if outcome.index in bad:
            assert isinstance(outcome.error, UnitMisuseError), outcome
            assert repr(bad[outcome.index]) in str(outcome.error)
            assert (outcome.attempts, outcome.skipped) == (0, False)
        else:
            assert outcome.ok
            assert outcome.value == 10 * outcome.index
    good = [i for i in range(10) if i not in bad]
    assert sorted(work.executions) == good
    assert journal_keys(jkit, job) == {str(i) for i in good}
    assert (report.stats.failed, report.stats.succeeded) == (4, 6)


@pytest.mark.anyio
@every(ONE_OF_EACH)
async def test_with_errors_raise_a_bad_key_is_raised_after_the_units_in_flight(jkit: BatchKit) -> None:
    """errors="raise": the UnitMisuseError for item 6's key is raised; items 0-5 committed, none after."""
    runner = jkit.runner(limit=3)
    work = Work(jkit)
    job = unique_job("raise")
    key: Callable[[int], Any] = lambda i: 2.5 if i == 6 else i  # noqa: E731
    with pytest.raises(UnitMisuseError, match=re.escape("2.5")):
        await runner.map(work.fn(), range(20), journal=Journal[int](job, key=key))
    assert sorted(work.executions) == list(range(6))
    assert jkit.rows() == dict.fromkeys(range(6), 1)
    assert journal_keys(jkit, job) == {str(i) for i in range(6)}
    assert jkit.pool.checkedout() == 0


@pytest.mark.anyio
@every(ONE_OF_EACH)
async def test_a_key_given_twice_in_a_run_fails_the_second_item(jkit: BatchKit) -> None:
    """Items 2 and 5 both "dup", item 7 the int 1 where item 1 is "1": 5 and 7 fail naming it, never run."""
    runner = jkit.runner(limit=3, errors="collect")
    work = Work(jkit)
    job = unique_job("twice")

    def key(item: int) -> str | int:
        if item in (2, 5):
            return "dup"
        return 1 if item == 7 else str(item)

    report = await runner.map(work.fn(), range(10), journal=Journal[int](job, key=key))
    failed = {o.index: o.error for o in report.outcomes if not o.ok}
    assert sorted(failed) == [5, 7]
    assert isinstance(failed[5], UnitMisuseError)
    assert "'dup'" in str(failed[5])
    assert isinstance(failed[7], UnitMisuseError)
    assert "'1'" in str(failed[7])
    assert sorted(work.executions) == [0, 1, 2, 3, 4, 6, 8, 9]
    assert journal_keys(jkit, job) == {"dup", "0", "1", "3", "4", "6", "8", "9"}


@pytest.mark.anyio
@every(ONE_OF_EACH)
async def test_a_key_function_that_raises_fails_its_item_with_that_error(jkit: BatchKit) -> None:
    """key(item) raises for item 3: item 3 fails with the key function's own exception, never runs."""
    runner = jkit.runner(limit=3, errors="collect")
    work = Work(jkit)
    raised = LookupError("no key for item 3")

    def key(item: int) -> int:
        if item == 3:
            raise raised
        return item

    report = await runner.map(work.fn(), range(6), journal=Journal[int](unique_job("key-fn"), key=key))
    assert [o.index for o in report.outcomes if not o.ok] == [3]
    assert report.outcomes[3].error is raised
    assert report.outcomes[3].attempts == 0
    assert sorted(work.executions) == [0, 1, 2, 4, 5]


@pytest.mark.anyio
@every(ALL_CASES)
async def test_a_key_longer_than_255_characters_fails_its_item_one_of_255_works(jkit: BatchKit) -> None:
    """A 256-character key is a UnitMisuseError; a 255-character one (non-ASCII too) runs, then is skipped."""
    keys = {0: "a" * 256, 1: "b" * 255, 2: "é" * 255, 3: "3"}
    runner = jkit.runner(limit=3, errors="collect")
    work = Work(jkit)
    job = unique_job("long")
    journal = Journal[int](job, key=keys.__getitem__)
    report = await runner.map(work.fn(), range(4), journal=journal)
    assert [o.index for o in report.outcomes if not o.ok] == [0]
    error = report.outcomes[0].error
    assert isinstance(error, UnitMisuseError)
    assert "256 characters" in str(error)
    assert journal_keys(jkit, job) == {keys[1], keys[2], keys[3]}
    again = await runner.map(work.fn(), range(1, 4), journal=journal)
    assert [o.skipped for o in again.outcomes] == [True, True, True]


@pytest.mark.anyio
@every(ALL_CASES)
async def test_keys_that_differ_only_in_case_accents_or_trailing_spaces_are_distinct(
    jkit: BatchKit,
) -> None:
    """ "a" and "A", "e" and "é", "x" and "x ": six items, six keys: each runs once, then each is skipped."""
    keys = ["a", "A", "e", "é", "x", "x "]
    runner = jkit.runner(limit=1, errors="collect")
    work = Work(jkit)
    job = unique_job("collation")
    journal = Journal[int](job, key=keys.__getitem__)
    first = await runner.map(work.fn(), range(len(keys)), journal=journal)
    assert [(o.index, o.error) for o in first.outcomes if not o.ok] == []
    assert journal_keys(jkit, job) == set(keys)
    second = await runner.map(work.fn(), range(len(keys)), journal=journal)
    assert [o.skipped for o in second.outcomes] == [True] * len(keys)


@pytest.mark.anyio
@every([("semaphore", "asyncio"), ("chunked", "asyncio"), ("semaphore-aiosqlite", "asyncio")])
async def test_a_plain_function_given_to_an_async_runner_is_misuse_with_a_journal_too(
    jkit: BatchKit,
) -> None:
    """A `def fn` mapped on an async runner fails as UnitMisuseError with a journal, as without; no row."""
    runner = jkit.runner(limit=2, errors="collect")

    def plain(session: Any, item: int) -> int:
        return item

    without = await runner.map(plain, [1])
    assert isinstance(without.outcomes[0].error, UnitMisuseError)
    job = unique_job("plain")
    report = await runner.map(plain, [1], journal=Journal[int](job, key=int))
    error = report.outcomes[0].error
    assert isinstance(error, UnitMisuseError), f"{type(error).__name__}: {error}"
    assert journal_keys(jkit, job) == set()


RUNNERS = ["SemaphoreRunner", "ChunkedRunner", "ThreadOffloadRunner.map", "ThreadOffloadRunner.map_sync"]


@pytest.mark.parametrize("verb", RUNNERS)
def test_journal_must_be_a_journal(tmp_path: Any, verb: str) -> None:
    """journal="my-job" is a TypeError naming the fix, before anything connects."""
    path = tmp_path / "never-opened.sqlite3"
    pool: Any
    message = "journal must be a boundeddb.Journal, got str"
    if verb.startswith("ThreadOffloadRunner"):
        engine = create_engine(f"sqlite:///{path}", pool_size=2, max_overflow=0)
        runner = ThreadOffloadRunner(sessionmaker(engine), limit=2)

        def fn(session: Session, item: int) -> int:
            return item

        if verb.endswith("map_sync"):
            with pytest.raises(TypeError, match=message):
                runner.map_sync(fn, [1], journal="my-job")  # type: ignore[arg-type]
        else:
            with pytest.raises(TypeError, match=message):
                anyio.run(lambda: runner.map(fn, [1], journal="my-job"))  # type: ignore[arg-type]
        pool = engine.pool
    else:
        async_engine = create_async_engine(f"sqlite+aiosqlite:///{path}", pool_size=2, max_overflow=0)
        sessions = async_sessionmaker(async_engine)
        made: Any = (
            ChunkedRunner(sessions, chunk_size=2)
            if verb == "ChunkedRunner"
            else SemaphoreRunner(sessions, limit=2)
        )

        async def afn(session: AsyncSession, item: int) -> int:
            return item

        with pytest.raises(TypeError, match=message):
            anyio.run(lambda: made.map(afn, [1], journal="my-job"))
        pool = async_engine.sync_engine.pool
    assert (pool.checkedin(), pool.checkedout()) == (0, 0), "a connection was opened"
    assert not path.exists()


@pytest.mark.parametrize(
    ("arguments", "error", "match"),
    [
        ({"job": ""}, TypeError, "job"),
        ({"job": None}, TypeError, "job"),
        ({"job": 7}, TypeError, "job"),
        ({"job": "j" * 256}, ValueError, "255"),
        ({"key": "id"}, TypeError, "key"),
        ({"key": 7}, TypeError, "key"),
        ({"create_table": 1}, TypeError, "create_table"),
        ({"create_table": "yes"}, TypeError, "create_table"),
        ({"table": ""}, TypeError, "table"),
        ({"table": "t" * 256}, ValueError, "255"),
    ],
    ids=[
        "job-empty",
        "job-None",
        "job-int",
        "job-long",
        "key-str",
        "key-int",
        "create-int",
        "create-str",
        "table-empty",
        "table-long",
    ],
)
def test_a_bad_journal_is_refused(arguments: dict[str, Any], error: type[Exception], match: str) -> None:
    """Journal(job="") and the like: TypeError or ValueError naming the argument."""
    given: dict[str, Any] = {"job": "job", "key": str, **arguments}
    job = given.pop("job")
    with pytest.raises(error, match=match):
        Journal(job, **given)


def test_a_journals_properties() -> None:
    key = keyed("x")
    journal = Journal[int]("recompute", key=key, table=CUSTOM_TABLE, create_table=False)
    assert (journal.job, journal.key, journal.table, journal.create_table) == (
        "recompute",
        key,
        CUSTOM_TABLE,
        False,
    )
    default = Journal[int]("j" * 255, key=str)
    assert (default.table, default.create_table) == (DEFAULT_TABLE, True)
    assert "recompute" in repr(journal)


# -- the table -------------------------------------------------------------------------------------------


@pytest.mark.anyio
@every(ONE_OF_EACH)
async def test_a_missing_table_with_create_table_false_is_an_error_with_its_ddl(jkit: BatchKit) -> None:
    """create_table=False and no table: BoundedDBError with the CREATE TABLE; nothing ran, nothing made."""
    runner = jkit.runner(limit=2, errors="collect")
    assert jkit.engine is not None
    work = Work(jkit)
    journal = Journal[int](unique_job("no-table"), key=int, create_table=False)
    with pytest.raises(BoundedDBError) as raised:
        await runner.map(work.fn(), range(5), journal=journal)
    ddl = Journal.ddl(jkit.engine)
    assert ddl in str(raised.value)
    assert "create_table=False" in str(raised.value)
    assert work.executions == collections.Counter()
    assert jkit.rows() == {}
    assert not table_exists(jkit, DEFAULT_TABLE)
    assert jkit.pool.checkedout() == 0
    # Made as the message says, the same runner and journal work.
    await create_table(jkit.engine)
    report = await runner.map(work.fn(), range(5), journal=journal)
    assert report.stats.succeeded == 5


@pytest.mark.anyio
@every(ONE_OF_EACH)
async def test_create_forget_and_ddl_with_the_runners_engine(jkit: BatchKit) -> None:
    """
    ddl() is the table's CREATE TABLE; create() makes it once; forget() deletes one job's rows only,
    and forgets nothing (0) before the table exists.
    """
    runner = jkit.runner(limit=2)
    engine = jkit.engine
    assert engine is not None
    ddl = Journal.ddl(engine)
    flat = re.sub(r"\s+", " ", ddl.replace('"', "").replace("`", ""))
    assert flat.startswith(f"CREATE TABLE {DEFAULT_TABLE} (")
    assert ddl.endswith(";")
    text_type = "VARBINARY(1020)" if jkit.db.name == "mariadb" else "VARCHAR(255)"
    for column in (f"job {text_type} NOT NULL", f"item_key {text_type} NOT NULL", "committed_at"):
        assert column in flat, (column, ddl)
    assert "PRIMARY KEY (job, item_key)" in flat
    assert CUSTOM_TABLE in Journal.ddl(engine, table=CUSTOM_TABLE)

    async def forget(journal: Journal[int]) -> int:
        forgotten = journal.forget(engine)
        if isinstance(engine, AsyncEngine):
            assert pyinspect.isawaitable(forgotten)
            return int(await forgotten)
        assert isinstance(forgotten, int)
        return forgotten

    assert not table_exists(jkit, DEFAULT_TABLE)
    assert await forget(Journal[int](unique_job("before"), key=int)) == 0
    assert not table_exists(jkit, DEFAULT_TABLE), "forget() creates nothing"

    created = Journal.create(engine)
    if isinstance(engine, AsyncEngine):
        assert pyinspect.isawaitable(created)
        assert not table_exists(jkit, DEFAULT_TABLE), "nothing happens until it is awaited"
        await created
    else:
        assert created is None
    assert table_exists(jkit, DEFAULT_TABLE)
    await create_table(engine)  # again: nothing happens

    work = Work(jkit, writes=False)
    one = Journal[int](unique_job("one"), key=int)
    two = Journal[int](unique_job("two"), key=int)
    await runner.map(work.fn(), range(5), journal=one)
    await runner.map(work.fn(), range(3), journal=two)

    assert await forget(one) == 5
    assert journal_counts(jkit) == {two.job: 3}
    assert await forget(one) == 0
    again = await runner.map(work.fn(), range(5), journal=one)
    assert again.stats.skipped == 0, "forgotten: every item runs again"
    assert work.executions == collections.Counter({0: 3, 1: 3, 2: 3, 3: 2, 4: 2})


@pytest.mark.anyio
@every(ONE_OF_EACH)
async def test_a_custom_table_and_two_jobs_in_one_table(jkit: BatchKit) -> None:
    """Journal(table=...) keeps its rows there only; jobs sharing a table never see each other's rows."""
    runner = jkit.runner(limit=3)
    assert jkit.engine is not None
    work = Work(jkit, writes=False)
    first = Journal[int](unique_job("first"), key=int, table=CUSTOM_TABLE)
    second = Journal[int](unique_job("second"), key=int, table=CUSTOM_TABLE)
    await runner.map(work.fn(), range(10), journal=first)
    assert table_exists(jkit, CUSTOM_TABLE)
    assert not table_exists(jkit, DEFAULT_TABLE)
    other = await runner.map(work.fn(), range(10), journal=second)
    assert other.stats.skipped == 0, "the other job's rows are not this one's"
    assert journal_counts(jkit, CUSTOM_TABLE) == {first.job: 10, second.job: 10}
    rerun = await runner.map(work.fn(), range(12), journal=first)
    assert [o.skipped for o in rerun.outcomes] == [True] * 10 + [False] * 2
    assert work.executions == collections.Counter({i: 2 if i < 10 else 1 for i in range(12)})
    # The default table's journal of the same job name is another journal.
    default = await runner.map(work.fn(), range(2), journal=Journal[int](first.job, key=int))
    assert default.stats.skipped == 0
    # ddl/create/forget take the table too.
    await create_table(jkit.engine, CUSTOM_TABLE)
    forgotten = second.forget(jkit.engine)
    assert (await forgotten if pyinspect.isawaitable(forgotten) else forgotten) == 10
    assert journal_counts(jkit, CUSTOM_TABLE) == {first.job: 12}


@pytest.mark.anyio
@pytest.mark.postgres
@pytest.mark.parametrize("anyio_backend", ["asyncio"])
@pytest.mark.parametrize("strategy", ["semaphore", "threads"])
async def test_a_schema_translate_map_moves_the_units_tables_never_the_journal(
    pg_server: PostgresServer, strategy: str
) -> None:
    """
    With an engine whose ``schema_translate_map`` sends the units' tables to a tenant's schema, the
    journal table is made, looked up, written and forgotten in the connection's default schema only:
    a rerun skips what committed, and each item's row in the tenant's table is there once.
    """
    home, tenant = (f"bdbt_{name}_{secrets.token_hex(3)}" for name in ("home", "tenant"))
    admin = create_engine(driver_url(pg_server.url, "psycopg"), isolation_level="AUTOCOMMIT")
    with admin.connect() as connection:
        for schema in (home, tenant):
            connection.execute(text(f"CREATE SCHEMA {schema}"))
        connection.execute(text(f"CREATE TABLE {tenant}.effects (item int NOT NULL)"))
    effects = Table("effects", MetaData(), Column("item", Integer))  # no schema: the map's to move
    translate = {"schema_translate_map": {None: tenant}}
    engine: Any
    if strategy == "threads":
        engine = create_engine(
            driver_url(pg_server.url, "psycopg"), connect_args={"options": f"-c search_path={home}"}
        ).execution_options(**translate)

        def sync_fn(session: Session, item: int) -> None:
            session.execute(effects.insert(), {"item": item})
            if item == 3:
                raise Boom(item)

        runner: Any = ThreadOffloadRunner(sessionmaker(engine), limit=2, errors="collect")
        fn: Any = sync_fn
    else:
        engine = create_async_engine(
            driver_url(pg_server.url, "asyncpg"), connect_args={"server_settings": {"search_path": home}}
        ).execution_options(**translate)

        async def async_fn(session: AsyncSession, item: int) -> None:
            await session.execute(effects.insert(), {"item": item})
            if item == 3:
                raise Boom(item)

        runner = SemaphoreRunner(async_sessionmaker(engine), limit=2, errors="collect")
        fn = async_fn

    def journal_tables() -> set[str]:
        """Which of the two schemas have a journal table."""
        with admin.connect() as connection:
            query = text(
                "SELECT table_schema FROM information_schema.tables"
                " WHERE table_name = :name AND table_schema IN (:home, :tenant)"
            )
            found = connection.execute(query, {"name": DEFAULT_TABLE, "home": home, "tenant": tenant})
            return set(found.scalars())

    def items_done() -> list[int]:
        with admin.connect() as connection:
            return sorted(connection.execute(text(f"SELECT item FROM {tenant}.effects")).scalars())

    try:
        journal = Journal[int](unique_job("tenant"), key=int)
        first = await runner.map(fn, range(6), journal=journal)
        assert [o.ok for o in first.outcomes] == [True, True, True, False, True, True]
        assert journal_tables() == {home}
        assert items_done() == [0, 1, 2, 4, 5]
        rerun = await runner.map(fn, range(7), journal=journal)
        assert [o.skipped for o in rerun.outcomes] == [True, True, True, False, True, True, False]
        assert items_done() == [0, 1, 2, 4, 5, 6], "each committed item once"
        await create_table(engine)
        forgotten = journal.forget(engine)
        assert (await forgotten if pyinspect.isawaitable(forgotten) else forgotten) == 6
        assert journal_tables() == {home}
    finally:
        if isinstance(engine, AsyncEngine):
            await engine.dispose()
        else:
            engine.dispose()
        with admin.connect() as connection:
            for schema in (home, tenant):
                connection.execute(text(f"DROP SCHEMA {schema} CASCADE"))
        admin.dispose()


# -- a role that may not create the table (PostgreSQL, MariaDB) -------------------------------------------


@pytest.fixture
async def limited_role(
    request: pytest.FixtureRequest, db: Database, kind: str
) -> AsyncIterator[Callable[[], Any]]:
    """
    ``make()``: a runner of ``kind`` whose engine logs in as a role of the test's own, which may read
    and write the test's tables but not create any (PostgreSQL: USAGE without CREATE on the schema;
    MariaDB: SELECT, INSERT, UPDATE, DELETE on the database). The role is dropped after.
    """
    strategy, driver = parse_kind(kind)
    role = f"bdbt_nocreate_{secrets.token_hex(3)}"
    engines: list[Any] = []
    url: URL
    connect_args: dict[str, Any] = {}
    if isinstance(db, PostgreSQL):
        schema: str = request.getfixturevalue("pg_schema")
        server: PostgresServer = request.getfixturevalue("pg_server")
        with db.admin.connect() as connection:
            connection.execute(text(f"CREATE ROLE {role} LOGIN"))
            connection.execute(text(f"GRANT USAGE ON SCHEMA {schema} TO {role}"))
            connection.execute(
                text(f"GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA {schema} TO {role}")
            )
        url = driver_url(server.url, driver).set(username=role, password=None)  # type: ignore[arg-type]
        if driver == "asyncpg":
            connect_args = {"server_settings": {"search_path": schema, "application_name": db.app}}
        else:
            connect_args = {"options": f"-c search_path={schema}", "application_name": db.app}
    else:
        assert isinstance(db, MariaDB)
        with db.admin.connect() as connection:
            connection.execute(text(f"CREATE USER '{role}'@'127.0.0.1'"))
            connection.execute(
                text(f"GRANT SELECT, INSERT, UPDATE, DELETE ON `{db.database}`.* TO '{role}'@'127.0.0.1'")
            )
        url = db.url(driver).set(username=role, password=None)

    def make() -> Any:
        if strategy == "threads":
            engine: Any = create_engine(url, connect_args=connect_args, pool_size=2, max_overflow=0)
            engines.append(engine)
            return ThreadOffloadRunner(sessionmaker(engine), limit=2, errors="collect")
        async_engine = create_async_engine(url, connect_args=connect_args, pool_size=2, max_overflow=0)
        engines.append(async_engine)
        return SemaphoreRunner(async_sessionmaker(async_engine), limit=2, errors="collect")

    try:
        yield make
    finally:
        for engine in engines:
            if isinstance(engine, AsyncEngine):
                await engine.dispose()
            else:
                engine.dispose()
        db.terminate()
        with db.admin.connect() as connection:
            if isinstance(db, PostgreSQL):
                connection.execute(text(f"DROP OWNED BY {role}"))
                connection.execute(text(f"DROP ROLE {role}"))
            else:
                connection.execute(text(f"DROP USER '{role}'@'127.0.0.1'"))


@pytest.mark.anyio
@pytest.mark.usefixtures("items_table")
@pytest.mark.parametrize(
    ("kind", "anyio_backend"),
    [("semaphore", "asyncio"), ("threads-psycopg", "asyncio"), ("semaphore-aiomysql", "asyncio"),
     ("threads-pymysql", "asyncio")],
    ids=["semaphore-asyncpg", "threads-psycopg", "semaphore-aiomysql", "threads-pymysql"],
)  # fmt: skip
async def test_a_missing_table_the_role_may_not_create_is_an_error_with_its_ddl(
    limited_role: Callable[[], Any], db: Database, kind: str
) -> None:
    """No table, and no right to create one: BoundedDBError saying so, with the CREATE TABLE; nothing ran."""
    runner = limited_role()
    ran: list[int] = []
    if parse_kind(kind)[0] == "threads":

        def sync_fn(session: Session, item: int) -> int:
            ran.append(item)
            return item

        fn: Any = sync_fn
    else:

        async def async_fn(session: AsyncSession, item: int) -> int:
            ran.append(item)
            return item

        fn = async_fn
    with pytest.raises(BoundedDBError) as raised:
        await runner.map(fn, range(3), journal=Journal[int](unique_job("denied"), key=int))
    message = str(raised.value)
    assert "could not be created" in message, message
    engine = runner._engine  # the runner's own engine: its dialect spells the DDL
    assert Journal.ddl(engine) in message
    assert ran == []
    if isinstance(db, PostgreSQL):
        assert not inspect(db.admin).has_table(DEFAULT_TABLE)
    else:
        assert isinstance(db, MariaDB)
        assert not inspect(db.admin).has_table(DEFAULT_TABLE, schema=db.database)


# -- what a caller sees: telemetry, progress ---------------------------------------------------------------


@pytest.mark.anyio
@pytest.mark.postgres
@every([("semaphore", "asyncio"), ("threads-psycopg", "asyncio")])
async def test_skipped_units_are_counted_as_skipped_in_telemetry(
    jkit: BatchKit, telemetry: Telemetry
) -> None:
    """boundeddb.instrument(): unit.duration counts skipped items under boundeddb.outcome="skipped"."""
    runner = jkit.runner(limit=3, errors="collect")
    work = Work(jkit)
    work.failing = {1, 2, 3}
    journal = Journal[int](unique_job("telemetry"), key=int)
    await runner.map(work.fn(), range(10), journal=journal)
    assert telemetry.counts("boundeddb.unit.duration", "boundeddb.outcome") == {"ok": 7, "error": 3}
    work.failing.clear()
    await runner.map(work.fn(), range(10), journal=journal)
    assert telemetry.counts("boundeddb.unit.duration", "boundeddb.outcome") == {
        "ok": 10,
        "error": 3,
        "skipped": 7,
    }
    spans = telemetry.unit_spans()
    assert len(spans) == 20
    skipped = [
        span for span in spans if span.attributes and span.attributes["boundeddb.outcome"] == "skipped"
    ]
    assert len(skipped) == 7
    assert all(span.attributes and span.attributes["boundeddb.unit.attempts"] == 0 for span in skipped)


@pytest.mark.anyio
@pytest.mark.postgres
@every([("threads-psycopg", "asyncio"), ("threads-psycopg", "trio")])
@pytest.mark.parametrize("instrumented", [False, True], ids=["plain", "instrumented"])
@pytest.mark.parametrize("batch", [None, 4], ids=["unit", "batch"])
async def test_a_thread_runner_looks_keys_up_in_its_worker_threads_never_on_the_loop(
    jkit: BatchKit, request: pytest.FixtureRequest, instrumented: bool, batch: int | None
) -> None:
    """
    ThreadOffloadRunner over a plain list: every lookup runs in a worker thread, where the threads
    pull the units themselves and where the loop does (batches under telemetry); a rerun skips what
    ran and runs the rest, once each.
    """
    if instrumented:
        request.getfixturevalue("telemetry")
    runner = jkit.runner(limit=3, errors="collect", batch=batch)
    assert jkit.engine is not None
    statements = Statements(jkit.engine)
    work = Work(jkit)
    journal = Journal[int](unique_job("in-threads"), key=int)
    first = await runner.map(work.fn(), list(range(100)), journal=journal)
    assert first.stats.succeeded == 100
    again = await runner.map(work.fn(), list(range(300)), journal=journal)
    assert (again.stats.skipped, again.stats.succeeded) == (100, 200)
    assert [o.skipped for o in again.outcomes] == [i < 100 for i in range(300)]
    assert work.executions == collections.Counter(range(300))
    assert statements.lookups == [32, 64, 4, 32, 64, 128, 76]  # the first run's, then the rerun's
    assert threading.get_ident() not in statements.lookup_threads


@pytest.mark.anyio
@pytest.mark.postgres
@every([("semaphore", "asyncio"), ("threads-psycopg", "asyncio")])
async def test_the_progress_bar_counts_skipped_items_as_done(jkit: BatchKit) -> None:
    """A rerun that skips 15 of 20 items: the bar ends at 20/20, not 5/20."""
    runner = jkit.runner(limit=3, errors="collect")
    work = Work(jkit)
    work.failing = {0, 5, 10, 15, 19}
    journal = Journal[int](unique_job("progress"), key=int)
    await runner.map(work.fn(), range(20), journal=journal)
    work.failing.clear()
    bar = RecordingProgress()
    report = await runner.map(work.fn(), range(20), journal=journal, progress=bar)
    assert (report.stats.skipped, report.stats.succeeded) == (15, 5)
    shown = re.findall(r"(\d+)/20 ", bar.text())
    assert shown[-1] == "20", f"the bar ends at {shown[-1]}/20"


# -- two runs of one job at once ---------------------------------------------------------------------------


@pytest.mark.anyio
@every([("semaphore", "asyncio"), ("threads-psycopg", "asyncio"), ("semaphore-aiomysql", "asyncio"),
        ("threads-pymysql", "asyncio")])  # fmt: skip
async def test_a_second_run_racing_the_first_never_runs_an_item_twice(jkit: BatchKit) -> None:
    """
    A second run of the job while the first's units hold their rows uncommitted: its units wait for
    those rows, then fail on the duplicate key (never running fn), so every item's effects happen once.
    """
    n = 8
    first_runner = jkit.runner(limit=n)
    second_runner = jkit.runner(limit=n, errors="collect")
    started = threading.Semaphore(0)
    release = threading.Event()
    executions: collections.Counter[int] = collections.Counter()
    job = unique_job("race")
    journal = Journal[int](job, key=int)
    await create_table(jkit.engine)

    if jkit.is_async:

        async def fn(session: AsyncSession, item: int) -> int:
            executions[item] += 1
            session.add(Item(key=f"k{item}", unit=item))
            await session.flush()
            started.release()
            await anyio.to_thread.run_sync(release.wait, 30)
            return item

        work: Any = fn
    else:

        def sync_fn(session: Session, item: int) -> int:
            executions[item] += 1
            session.add(Item(key=f"k{item}", unit=item))
            session.flush()
            started.release()
            release.wait(30)
            return item

        work = sync_fn

    results: dict[str, Any] = {}

    async def run_first() -> None:
        results["first"] = await first_runner.map(work, range(n), journal=journal)

    async def run_second() -> None:
        results["second"] = await second_runner.map(work, range(n), journal=journal)

    with anyio.fail_after(60):
        async with anyio.create_task_group() as group:
            try:
                group.start_soon(run_first)
                for i in range(n):  # every unit of the first run holds its rows
                    if not await anyio.to_thread.run_sync(started.acquire, True, 20):
                        statements = await anyio.to_thread.run_sync(jkit.db.statements)
                        raise AssertionError(f"{i} of {n} units started; running: {statements}")
                group.start_soon(run_second)
                await anyio.sleep(1.0)  # the second run's units wait for the first's row locks
            finally:
                release.set()
    first, second = results["first"], results["second"]
    assert all(o.ok for o in first.outcomes)
    assert executions == collections.Counter(dict.fromkeys(range(n), 1)), "fn ran once per item"
    # Its lookup saw no row yet (none committed): each of its units waited, then hit the duplicate key.
    assert [type(o.error) for o in second.outcomes] == [sa_exc.IntegrityError] * n
    assert jkit.rows() == dict.fromkeys(range(n), 1)
    third = await first_runner.map(work, range(n), journal=journal)
    assert third.stats.skipped == n


# -- a lost COMMIT, resolved through the journal -------------------------------------------------------------

#: PostgreSQL's startup-phase requests that are followed by another startup message.
_SSL_REQUEST, _GSSENC_REQUEST = 80877103, 80877104


class _Link:
    def __init__(self, client: socket.socket, server: socket.socket) -> None:
        self.client = client
        self.server = server
        self.cut = False

    def close(self) -> None:
        for sock in (self.client, self.server):
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            sock.close()


class CommitCut:
    """
    A TCP proxy to PostgreSQL or MariaDB that cuts the connection of the next ``COMMIT`` once armed:
    ``"after"`` forwards it, then drops the client side (the server commits, the client never hears
    back); ``"before"`` drops both sides before it (the server rolls back when the connection goes).
    """

    def __init__(self, host: str, port: int, *, mysql: bool) -> None:
        self._target = (host, port)
        self._mysql = mysql
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port: int = self._listener.getsockname()[1]
        self._lock = threading.Lock()
        self._links: set[_Link] = set()
        self._mode: str | None = None
        self.cuts = 0
        threading.Thread(target=self._accept, name="commit-cut", daemon=True).start()

    def arm(self, mode: str) -> None:
        assert mode in ("after", "before")
        with self._lock:
            self._mode = mode

    def close(self) -> None:
        self._listener.close()
        with self._lock:
            links = list(self._links)
        for link in links:
            link.close()

    def _take(self) -> str | None:
        with self._lock:
            mode, self._mode = self._mode, None
            if mode is not None:
                self.cuts += 1
            return mode

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            try:
                server = socket.create_connection(self._target)
            except OSError:
                client.close()
                continue
            link = _Link(client, server)
            with self._lock:
                self._links.add(link)
            threading.Thread(target=self._to_client, args=(link,), daemon=True).start()
            threading.Thread(target=self._to_server, args=(link,), daemon=True).start()

    def _to_client(self, link: _Link) -> None:
        try:
            while data := link.server.recv(65536):
                if link.cut:
                    break  # the server answered the COMMIT: the client never hears it
                link.client.sendall(data)
        except OSError:
            pass
        finally:
            link.close()
            with self._lock:
                self._links.discard(link)

    def _to_server(self, link: _Link) -> None:
        buffer, starting = b"", not self._mysql
        try:
            while data := link.client.recv(65536):
                buffer += data
                while True:
                    if self._mysql:
                        message, buffer = _mysql_packet(buffer)
                        commit = message is not None and _mysql_is_commit(message)
                    else:
                        message, buffer, starting = _pg_message(buffer, starting)
                        commit = message is not None and _pg_is_commit(message)
                    if message is None:
                        break
                    if commit and (mode := self._take()) is not None:
                        if mode == "before":
                            link.close()
                            return
                        link.cut = True
                        link.server.sendall(message)
                        link.client.shutdown(socket.SHUT_RDWR)
                        return
                    link.server.sendall(message)
        except OSError:
            pass
        if not link.cut:
            link.close()


def _pg_message(buffer: bytes, starting: bool) -> tuple[bytes | None, bytes, bool]:
    """The next whole PostgreSQL client message (or None), the rest, and whether still starting up."""
    if starting:  # untyped: Int32 length, Int32 code
        if len(buffer) < 8 or len(buffer) < (length := int.from_bytes(buffer[:4], "big")):
            return None, buffer, True
        code = int.from_bytes(buffer[4:8], "big")
        return buffer[:length], buffer[length:], code in (_SSL_REQUEST, _GSSENC_REQUEST)
    if len(buffer) < 5 or len(buffer) < (total := 1 + int.from_bytes(buffer[1:5], "big")):
        return None, buffer, False
    return buffer[:total], buffer[total:], False


def _pg_is_commit(message: bytes) -> bool:
    """A simple query whose text is COMMIT (asyncpg sends ``COMMIT;``, libpq ``COMMIT``)."""
    return message[:1] == b"Q" and _is_commit_text(message[5:].rstrip(b"\x00"))


def _mysql_packet(buffer: bytes) -> tuple[bytes | None, bytes]:
    """The next whole MySQL packet (3-byte length, sequence id, payload), or None, and the rest."""
    if len(buffer) < 4 or len(buffer) < (total := 4 + int.from_bytes(buffer[:3], "little")):
        return None, buffer
    return buffer[:total], buffer[total:]


def _mysql_is_commit(packet: bytes) -> bool:
    """A COM_QUERY (0x03) whose text is COMMIT: what pymysql, aiomysql and asyncmy send to commit."""
    return packet[4:5] == b"\x03" and _is_commit_text(packet[5:])


def _is_commit_text(query: bytes) -> bool:
    return query.decode(errors="replace").strip().rstrip(";").strip().upper() == "COMMIT"


class Proxied:
    """Runners of the test's ``kind`` whose engine connects through a :class:`CommitCut`."""

    def __init__(self, kind: str, url: URL, connect_args: dict[str, Any], cut: CommitCut) -> None:
        self.strategy, self.driver = parse_kind(kind)
        self.is_async = self.strategy != "threads"
        self.url = url
        self.connect_args = connect_args
        self.cut = cut
        self.engines: list[Any] = []

    def runner(self, *, limit: int = 1, **options: Any) -> Any:
        pool = {"pool_size": limit, "max_overflow": 0, "pool_timeout": 10}
        options.setdefault("errors", "collect")
        if not self.is_async:
            engine: Any = create_engine(self.url, connect_args=self.connect_args, **pool)
            self.engines.append(engine)
            return ThreadOffloadRunner(sessionmaker(engine), limit=limit, **options)
        engine = create_async_engine(self.url, connect_args=self.connect_args, **pool)
        self.engines.append(engine)
        if self.strategy == "chunked":
            return ChunkedRunner(async_sessionmaker(engine), chunk_size=limit, **options)
        return SemaphoreRunner(async_sessionmaker(engine), limit=limit, **options)

    def pool(self) -> Any:
        engine = self.engines[-1]
        return getattr(engine, "sync_engine", engine).pool


@pytest.fixture
async def proxied(request: pytest.FixtureRequest, kind: str, db: Database) -> AsyncIterator[Proxied]:
    """A CommitCut in front of the server of ``kind``, runners through it; journal tables dropped after."""
    _, driver = parse_kind(kind)
    connect_args: dict[str, Any]
    if isinstance(db, MariaDB):
        cut = CommitCut(db.server.host or "127.0.0.1", db.server.port or 3306, mysql=True)
        url = db.url(driver).set(host="127.0.0.1", port=cut.port)
        connect_args = {}
    else:
        assert isinstance(db, PostgreSQL)
        server: PostgresServer = request.getfixturevalue("pg_server")
        schema: str = request.getfixturevalue("pg_schema")
        cut = CommitCut(server.url.host or "127.0.0.1", server.url.port or 5432, mysql=False)
        url = driver_url(server.url, driver).set(host="127.0.0.1", port=cut.port)  # type: ignore[arg-type]
        if driver == "asyncpg":
            settings = {"search_path": schema, "application_name": db.app}
            connect_args = {"server_settings": settings, "ssl": False}
        else:
            connect_args = {
                "options": f"-c search_path={schema}",
                "application_name": db.app,
                "sslmode": "disable",
            }
        drop_journal_tables(db.admin)
    runners = Proxied(kind, url, connect_args, cut)
    yield runners
    cut.close()
    for engine in runners.engines:
        if isinstance(engine, AsyncEngine):
            await engine.dispose()
        else:
            engine.dispose()
    db.terminate()
    if isinstance(db, PostgreSQL):
        drop_journal_tables(db.admin)


def cut_work(proxied: Proxied, executions: collections.Counter[int]) -> Callable[..., Any]:
    """fn(session, item): adds Item ``item``, counts its executions, returns 10 item."""
    if proxied.is_async:

        async def fn(session: AsyncSession, item: int) -> int:
            executions[item] += 1
            session.add(Item(key=f"k{item}", unit=item))
            await session.flush()
            return 10 * item

        return fn

    def sync_fn(session: Session, item: int) -> int:
        executions[item] += 1
        session.add(Item(key=f"k{item}", unit=item))
        session.flush()
        return 10 * item

    return sync_fn


def cut_journal_keys(db: Database, job: str) -> set[str]:
    rows = rows_table()
    admin = db.admin
    if isinstance(db, MariaDB):
        admin = admin.execution_options(schema_translate_map={None: db.database})
    with admin.connect() as connection:
        keys = connection.execute(select(rows.c.item_key).where(rows.c.job == job)).scalars()
        return {text_of(key) for key in keys}


#: The kinds whose COMMIT the proxy cuts: every driver of the suite on PostgreSQL and MariaDB.
CUT_KINDS = [
    "semaphore",
    "semaphore-psycopg",
    "chunked",
    "threads-psycopg",
    "threads-psycopg2",
    "semaphore-aiomysql",
    "semaphore-asyncmy",
    "chunked-asyncmy",
    "threads-pymysql",
]


@pytest.mark.anyio
@pytest.mark.usefixtures("items_table", "reap_backends")
@pytest.mark.parametrize("anyio_backend", ["asyncio"])
@pytest.mark.parametrize("retry", [True, False], ids=["retry", "no-retry"])
@pytest.mark.parametrize("mode", ["after", "before"], ids=["server-committed", "server-never-got-it"])
@pytest.mark.parametrize("kind", CUT_KINDS)
async def test_a_lost_commit_is_resolved_through_the_journal(
    proxied: Proxied, db: Database, mode: str, retry: bool
) -> None:
    """
    A COMMIT whose connection is cut. The server committed: ok with the value, commit_verified, one
    attempt, and a rerun skips it. It never got it: not commit_unknown; with a retry policy ok at the
    second attempt, without one failed with commit_verified, and a rerun runs it. Effects once.
    """
    policy = RetryPolicy(attempts=3, initial_delay=0.01) if retry else None
    runner = proxied.runner(limit=1, retry=policy)
    executions: collections.Counter[int] = collections.Counter()
    fn = cut_work(proxied, executions)
    job = unique_job("cut")
    journal = Journal[int](job, key=int)
    with anyio.fail_after(60):
        assert (await runner.map(fn, [0], journal=journal)).values() == [0]  # the table made, connected
        proxied.cut.arm(mode)
        report = await runner.map(fn, [1], journal=journal)
    [outcome] = report.outcomes
    assert proxied.cut.cuts == 1
    assert outcome.commit_unknown is False, f"not resolved: {outcome.error!r}"
    if mode == "after":
        assert (outcome.ok, outcome.value, outcome.commit_verified, outcome.attempts) == (True, 10, True, 1)
        assert report.stats.commits_verified == 1
        assert executions[1] == 1
        expected = {"0", "1"}
    elif retry:
        assert (outcome.ok, outcome.value, outcome.attempts) == (True, 10, 2)
        assert executions[1] == 2
        expected = {"0", "1"}
    else:
        assert (outcome.ok, outcome.commit_verified, outcome.attempts) == (False, True, 1)
        assert report.stats.commits_verified == 1
        expected = {"0"}
    assert cut_journal_keys(db, job) == expected
    assert db.committed_units() == sorted(int(key) for key in expected)
    assert proxied.pool().checkedout() == 0
    with anyio.fail_after(60):
        rerun = await runner.map(fn, [0, 1], journal=journal)
    assert [o.skipped for o in rerun.outcomes] == [True, "1" in expected]
    assert db.committed_units() == [0, 1]


@pytest.mark.anyio
@pytest.mark.usefixtures("items_table", "reap_backends")
@pytest.mark.parametrize("anyio_backend", ["asyncio"])
@pytest.mark.parametrize("mode", ["after", "before"], ids=["server-committed", "server-never-got-it"])
@pytest.mark.parametrize("kind", CUT_KINDS)
async def test_a_batchs_lost_commit_is_resolved_through_the_journal(
    proxied: Proxied, db: Database, mode: str
) -> None:
    """batch=10, its COMMIT cut: committed, all 10 ok and verified, run once; else none unknown; once each."""
    runner = proxied.runner(limit=1, batch=BatchPolicy(10), retry=RetryPolicy(attempts=3, initial_delay=0.01))
    executions: collections.Counter[int] = collections.Counter()
    fn = cut_work(proxied, executions)
    job = unique_job("batch-cut")
    journal = Journal[int](job, key=int)
    with anyio.fail_after(60):
        assert (await runner.map(fn, [0], journal=journal)).values() == [0]
        proxied.cut.arm(mode)
        report = await runner.map(fn, range(1, 11), journal=journal)
    assert proxied.cut.cuts == 1
    outcomes = report.outcomes
    assert [o.commit_unknown for o in outcomes] == [False] * 10, [repr(o.error) for o in outcomes]
    assert [(o.ok, o.value) for o in outcomes] == [(True, 10 * i) for i in range(1, 11)]
    if mode == "after":
        assert [o.commit_verified for o in outcomes] == [True] * 10
        assert executions == collections.Counter(dict.fromkeys(range(11), 1))
    assert cut_journal_keys(db, job) == {str(i) for i in range(11)}
    assert db.committed_units() == list(range(11))
    assert proxied.pool().checkedout() == 0


@pytest.mark.anyio
@pytest.mark.usefixtures("items_table", "reap_backends")
@pytest.mark.parametrize("anyio_backend", ["asyncio"])
@pytest.mark.parametrize("batch", [None, 5], ids=["unit", "batch"])
@pytest.mark.parametrize("kind", ["semaphore", "threads-psycopg", "semaphore-asyncmy"])
async def test_a_lost_commit_is_resolved_under_telemetry(
    proxied: Proxied, db: Database, telemetry: Telemetry, batch: int | None
) -> None:
    """boundeddb.instrument() wraps each unit in a span: its probe is still found, the COMMIT resolved."""
    runner = proxied.runner(limit=1, batch=batch)
    executions: collections.Counter[int] = collections.Counter()
    fn = cut_work(proxied, executions)
    journal = Journal[int](unique_job("traced"), key=int)
    with anyio.fail_after(60):
        assert (await runner.map(fn, [0], journal=journal)).values() == [0]
        proxied.cut.arm("after")
        report = await runner.map(fn, range(1, 6), journal=journal)
    outcomes = report.outcomes
    assert [(o.ok, o.value, o.commit_unknown) for o in outcomes] == [
        (True, 10 * i, False) for i in range(1, 6)
    ]
    # The cut COMMIT is the first: a batch's, all five units' then, or unit 1's alone.
    verified = [True] * 5 if batch else [True] + [False] * 4
    assert [o.commit_verified for o in outcomes] == verified
    assert executions == collections.Counter(dict.fromkeys(range(6), 1))
    assert db.committed_units() == list(range(6))
    assert telemetry.counts("boundeddb.unit.duration", "boundeddb.outcome").get("commit_unknown") is None


# -- a COMMIT cut short by the unit's timeout (PostgreSQL) --------------------------------------------------


@pytest.fixture
def slow_commit(jkit: BatchKit) -> Iterator[None]:
    """A deferred constraint trigger: the COMMIT of a transaction that inserted an item sleeps 3 s."""
    admin = jkit.admin()
    with admin.connect() as connection:
        connection.execute(
            text(
                "CREATE FUNCTION journal_slow_commit() RETURNS trigger LANGUAGE plpgsql AS "
                "$$ BEGIN PERFORM pg_sleep(3); RETURN NULL; END $$"
            )
        )
        connection.execute(
            text(
                "CREATE CONSTRAINT TRIGGER journal_slow_commit AFTER INSERT ON items "
                "DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION journal_slow_commit()"
            )
        )
    yield
    with admin.connect() as connection:
        connection.execute(text("DROP TRIGGER IF EXISTS journal_slow_commit ON items"))
        connection.execute(text("DROP FUNCTION IF EXISTS journal_slow_commit()"))


@pytest.mark.anyio
@pytest.mark.usefixtures("slow_commit", "reap_backends")
@every([("semaphore", "asyncio"), ("semaphore-psycopg", "asyncio"), ("chunked", "asyncio")])
async def test_a_commit_cut_short_by_the_units_timeout_is_settled_by_the_rerun(jkit: BatchKit) -> None:
    """
    A unit's timeout interrupts its slow COMMIT: the unit stays commit_unknown, as without a journal
    (only a lost connection is probed at once), and the rerun settles it by its row.
    """
    runner = jkit.runner(limit=2, errors="collect", timeout=0.5)
    job = unique_job("timeout")
    work = Work(jkit)
    with anyio.fail_after(30):
        report = await runner.map(work.fn(), [1], journal=Journal[int](job, key=int))
    [outcome] = report.outcomes
    assert isinstance(outcome.error, UnitTimeout)
    assert outcome.commit_unknown
    assert journal_keys(jkit, job) == set(), "the server aborted the COMMIT: no row"
    assert jkit.rows() == {}
    patient = jkit.runner(limit=2, errors="collect", timeout=30)
    with anyio.fail_after(60):
        again = await patient.map(work.fn(), [1], journal=Journal[int](job, key=int))
    [rerun] = again.outcomes
    assert rerun.ok, rerun
    assert not rerun.skipped
    assert journal_keys(jkit, job) == {"1"}
    assert len(jkit.rows()) == 1
    assert work.executions[1] == 2


def test_the_proxy_parsers() -> None:
    """The proxy's parsers: whole messages only, COMMIT in either protocol and nothing else."""
    query = b"COMMIT\x00"
    pg = b"Q" + (4 + len(query)).to_bytes(4, "big") + query
    assert _pg_message(pg[:3], False) == (None, pg[:3], False)
    assert _pg_message(pg + b"X", False) == (pg, b"X", False)
    assert _pg_is_commit(pg)
    assert not _pg_is_commit(b"Q" + (4 + 9).to_bytes(4, "big") + b"ROLLBACK\x00")
    payload = b"\x03COMMIT"
    packet = len(payload).to_bytes(3, "little") + b"\x00" + payload
    assert _mysql_packet(packet[:5]) == (None, packet[:5])
    assert _mysql_packet(packet + b"\x01") == (packet, b"\x01")
    assert _mysql_is_commit(packet)
    assert not _mysql_is_commit(b"\x09\x00\x00\x00\x03ROLLBACK")
