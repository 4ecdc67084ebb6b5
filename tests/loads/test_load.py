"""
``load()`` end to end on real databases: every row once, a transaction per chunk counted by the server,
at most ``limit`` connections, input pulled lazily, async input, the thread runner under asyncio and
trio and from sync code, cancellation, a journal's reruns. One driver per runner kind where the runner
decides (tests/loads/test_load_rejects.py and test_load_values.py run the drivers' bulk paths).
"""

from __future__ import annotations

import secrets
from collections.abc import AsyncIterator, Iterator
from typing import Any

import anyio
import anyio.to_thread
import pytest
from sqlalchemy import text

from boundeddb import Journal, LoadFailed, RetryPolicy, ThreadOffloadRunner
from tests.loads.conftest import JOURNAL_TABLE, Tables, item_rows
from tests.support.batches import TAKEN, BatchKit, every, sync_params
from tests.support.kits import eventually
from tests.support.models import Item

pytestmark = [pytest.mark.usefixtures("collect_garbage")]

#: Each runner kind on one driver: asyncpg's SemaphoreRunner and ChunkedRunner, psycopg 3 in threads.
RUNNERS = [("semaphore", "asyncio"), ("chunked", "asyncio"), ("threads-psycopg", "asyncio")]
#: The journal's reads and writes on each database.
JOURNAL_CASES = [
    ("semaphore", "asyncio"),
    ("threads-psycopg", "trio"),
    ("chunked-asyncmy", "asyncio"),
    ("threads-pysqlite", "asyncio"),
]


class Pulled:
    """Rows of ``Item`` from a generator that records, at each row it gives, how far ahead of the commits."""

    def __init__(self, kit: BatchKit, n: int, batch: int) -> None:
        self.kit, self.n, self.batch = kit, n, batch
        self.count = 0
        self.most_ahead = 0

    def _note(self) -> None:
        self.most_ahead = max(self.most_ahead, self.count - self.kit.commits.n * self.batch)
        self.count += 1

    def __iter__(self) -> Iterator[dict[str, Any]]:
        for row in item_rows(self.n):
            self._note()
            yield row

    async def __aiter__(self) -> AsyncIterator[dict[str, Any]]:
        for row in item_rows(self.n):
            self._note()
            await anyio.lowlevel.checkpoint()
            yield row


@pytest.mark.anyio
@every(RUNNERS)
async def test_every_row_once_a_server_transaction_per_chunk_within_the_limit(
    bkit: BatchKit, tables: Tables
) -> None:
    """2000 rows in chunks of 150: each row once, 14 server transactions, <= limit connections."""
    tables.add_xid()
    runner = bkit.runner(limit=3)
    with bkit.db.sampler() as sampler:
        report = await runner.load(Item, item_rows(2000), batch=150)
    assert (report.loaded, report.skipped, report.rejected, report.transactions) == (2000, 0, [], 14)
    assert tables.items() == list(range(2000))
    assert tables.transactions() == 14, "a transaction of the server per chunk"
    assert bkit.commits.n == 14
    assert 1 <= sampler.peak <= 3, sampler.peak
    assert bkit.pool.checkedout() == 0


@pytest.mark.anyio
@every(RUNNERS)
async def test_statistics_count_the_rows_as_each_chunk_commits(bkit: BatchKit, tables: Tables) -> None:
    """rows_loaded grows while the load runs, chunk by chunk; after it, both counts match the report."""
    runner = bkit.runner(limit=1)
    seen: list[int] = []

    def rows() -> Iterator[dict[str, Any]]:
        for i, row in enumerate(item_rows(1000, key=lambda i: TAKEN if i in (150, 820) else f"k{i}")):
            if i % 100 == 0:
                seen.append(runner.statistics().rows_loaded)
            yield row

    report = await runner.load(Item, rows(), batch=100)
    stats = runner.statistics()
    assert (report.loaded, len(report.rejected)) == (998, 2)
    assert (stats.rows_loaded, stats.rows_rejected) == (998, 2)
    assert seen == sorted(seen), seen
    assert seen[-1] >= 698, f"counted as the chunks committed, not at the end: {seen}"


@pytest.mark.anyio
@every([("semaphore", "asyncio")])
async def test_mapped_instances_and_mappings_and_a_table(bkit: BatchKit, tables: Tables) -> None:
    """Rows as mapped instances, mappings and (for the Table) sequences with columns= all land once."""
    runner = bkit.runner(limit=2)
    instances = [Item(key=f"k{i}", unit=i) for i in range(10)]
    mixed: list[Any] = [*instances[:5], *item_rows(5, start=5)]
    report = await runner.load(Item, mixed, batch=4)
    assert (report.loaded, report.transactions) == (10, 3)
    sequences = [(f"k{i}", i) for i in range(10, 20)]
    report = await runner.load(Item.__table__, sequences, columns=["key", "unit"])
    assert (report.loaded, report.transactions) == (10, 1)
    assert tables.items() == list(range(20))


@pytest.mark.anyio
@every([*RUNNERS, ("threads-psycopg", "trio")])
async def test_input_is_pulled_lazily(bkit: BatchKit, tables: Tables) -> None:
    """A generator of 3000 rows is is pulled at most (limit + 1) x batch rows ahead of the commits."""
    limit, batch = 2, 100
    rows = Pulled(bkit, 3000, batch)
    report = await bkit.runner(limit=limit).load(Item, iter(rows), batch=batch)
    assert (report.loaded, report.transactions, rows.count) == (3000, 30, 3000)
    assert rows.most_ahead <= (limit + 1) * batch, rows.most_ahead
    assert tables.items() == list(range(3000))


@pytest.mark.anyio
@every([("semaphore", "asyncio"), ("threads-psycopg", "asyncio"), ("threads-psycopg", "trio")])
async def test_an_async_iterable_of_rows(bkit: BatchKit, tables: Tables) -> None:
    """Rows from an async iterable load as a plain iterable's do, pulled lazily on the event loop."""
    limit, batch = 2, 100
    rows = Pulled(bkit, 1000, batch)
    report = await bkit.runner(limit=limit).load(Item, rows, batch=batch)
    assert (report.loaded, report.transactions) == (1000, 10)
    assert rows.most_ahead <= (limit + 1) * batch, rows.most_ahead
    assert tables.items() == list(range(1000))


@pytest.mark.parametrize(
    "case", sync_params([("threads-psycopg", "asyncio"), ("threads-pysqlite", "asyncio")])
)
def test_load_sync_from_plain_code(bkit: BatchKit, tables: Tables) -> None:
    """ThreadOffloadRunner.load_sync, from code without an event loop: rows once, rejections as load()'s."""
    runner = bkit.runner(limit=2)
    assert isinstance(runner, ThreadOffloadRunner)
    rows = item_rows(250)
    rows[77] = {"key": TAKEN, "unit": 77}
    report = runner.load_sync(Item, rows, batch=100)
    assert (report.loaded, report.transactions) == (249, 3)
    assert [(r.index, r.row is rows[77]) for r in report.rejected] == [(77, True)]
    assert tables.items() == [i for i in range(250) if i != 77]


# -- cancellation ---------------------------------------------------------------------------------------


def lock_waiters(kit: BatchKit) -> int:
    """This test's backends waiting for a lock (PostgreSQL)."""
    statement = text(
        "SELECT count(*) FROM pg_stat_activity WHERE application_name = :app AND wait_event_type = 'Lock'"
    )
    with kit.db.admin.connect() as connection:
        return int(connection.execute(statement, {"app": kit.db.app}).scalar_one())  # type: ignore[attr-defined]


@pytest.mark.anyio
@every([("semaphore", "asyncio"), ("semaphore-psycopg", "asyncio"), ("threads-psycopg", "trio")])
async def test_cancelled_mid_load_leaves_no_transaction_and_keeps_committed_chunks(
    bkit: BatchKit, tables: Tables
) -> None:
    """Cancelled while chunk 3 waits on a lock: no open transaction or connection; chunks 1, 2 stay."""
    runner = bkit.runner(limit=1)
    rows = item_rows(100, key=lambda i: "blocker" if i == 45 else f"k{i}")
    with bkit.db.admin.connect() as blocker:  # holds the key "blocker" in an open transaction
        blocker.exec_driver_sql("BEGIN")
        blocker.exec_driver_sql("INSERT INTO items (key, unit) VALUES ('blocker', -2)")
        async with anyio.create_task_group() as group:

            async def load() -> None:
                await runner.load(Item, rows, batch=20)
                pytest.fail("the load ended though its third chunk waits for a lock")

            group.start_soon(load)
            waiting = await anyio.to_thread.run_sync(lambda: eventually(lambda: lock_waiters(bkit) == 1))
            assert waiting, "the third chunk never waited for the lock"
            group.cancel_scope.cancel()
        assert bkit.pool.checkedout() == 0
        bkit.db.assert_no_open_transactions("after the cancelled load")
        assert eventually(lambda: lock_waiters(bkit) == 0), "the waiting COPY was stopped on the server"
        blocker.exec_driver_sql("ROLLBACK")
    assert tables.items() == list(range(40)), "the chunks committed before the cancel stay"


# -- the journal ----------------------------------------------------------------------------------------


def journal(name: str) -> Journal[Any]:
    return Journal(f"{name}-{secrets.token_hex(3)}", table=JOURNAL_TABLE)


def free_taken(kit: BatchKit) -> None:
    """Delete the seed row, so that a row rejected for its key goes in at the rerun."""
    with kit.admin().begin() as connection:
        connection.execute(Item.__table__.delete().where(Item.__table__.c.key == TAKEN))


@pytest.mark.anyio
@every(JOURNAL_CASES)
async def test_a_journal_rerun_skips_committed_rows_and_retries_rejected_ones(
    bkit: BatchKit, tables: Tables
) -> None:
    """With a journal, a rerun writes only the rows not committed before: the rejected one, once fixed."""
    rows = item_rows(100)
    rows[33] = {"key": TAKEN, "unit": 33}
    job = journal("rerun")
    runner = bkit.runner(limit=2)
    first = await runner.load(Item, rows, batch=30, journal=job)
    assert (first.loaded, first.skipped, [r.index for r in first.rejected]) == (99, 0, [33])
    free_taken(bkit)
    second = await runner.load(Item, rows, batch=30, journal=job)
    assert (second.loaded, second.skipped, second.rejected, second.transactions) == (1, 99, [], 1)
    third = await runner.load(Item, rows, batch=30, journal=job)
    assert (third.loaded, third.skipped, third.transactions) == (0, 100, 0)
    assert sorted(bkit.db.committed_units()) == list(range(100)), "each row once, the seed gone"


@pytest.mark.anyio
@every([("semaphore", "asyncio"), ("threads-pymysql", "asyncio")])
async def test_a_journal_rerun_after_load_failed_loads_the_rest(bkit: BatchKit, tables: Tables) -> None:
    """errors="raise" stops at row 33 with chunk 1 committed; the rerun skips it and loads the other 80."""
    rows = item_rows(100)
    rows[33] = {"key": TAKEN, "unit": 33}
    job = journal("raise")
    runner = bkit.runner(limit=1)
    with pytest.raises(LoadFailed) as raised:
        await runner.load(Item, rows, batch=20, journal=job, errors="raise")
    assert raised.value.report.loaded == 20
    free_taken(bkit)
    report = await runner.load(Item, rows, batch=20, journal=job)
    assert (report.loaded, report.skipped, report.rejected, report.transactions) == (80, 20, [], 4)
    assert sorted(bkit.db.committed_units()) == list(range(100))


@pytest.mark.anyio
@every([("semaphore", "asyncio"), ("threads-psycopg", "trio")])
async def test_no_rows_is_an_empty_report(bkit: BatchKit, tables: Tables) -> None:
    """No rows: nothing loaded, no transaction; with a journal too."""
    runner = bkit.runner(limit=2)
    report = await runner.load(Item, [])
    assert (report.loaded, report.skipped, report.rejected, report.transactions) == (0, 0, [], 0)
    assert bkit.commits.n == 0
    report = await runner.load(Item, iter([]), journal=journal("empty"))
    assert (report.loaded, report.skipped, report.transactions) == (0, 0, 0)
    assert tables.items() == []


class InputBroke(Exception):
    """The input's own failure."""


@pytest.mark.anyio
@every([("semaphore", "asyncio"), ("threads-psycopg", "asyncio")])
async def test_an_input_that_raises_stops_the_load_with_its_error(bkit: BatchKit, tables: Tables) -> None:
    """A generator that raises at row 45: its exception comes out as is, whole chunks before it stay."""

    def rows() -> Iterator[dict[str, Any]]:
        yield from item_rows(45)
        raise InputBroke(45)

    runner = bkit.runner(limit=1)
    with pytest.raises(InputBroke):
        await runner.load(Item, rows(), batch=20)
    committed = tables.items()
    assert committed in (list(range(20)), list(range(40))), "whole chunks, from the start"
    assert bkit.pool.checkedout() == 0
    bkit.db.assert_no_open_transactions("after the input raised")


@pytest.mark.anyio
@every([("semaphore", "asyncio"), ("threads-psycopg", "asyncio")])
async def test_a_chunk_that_fails_with_a_transient_error_is_retried_whole(
    bkit: BatchKit, tables: Tables
) -> None:
    """A serialization failure in the first chunk's COPY: retry= runs that chunk again whole; rows once."""
    tables.add_xid()
    name = f"fail_once_{secrets.token_hex(3)}"
    with bkit.admin().begin() as connection:  # the first row inserted fails with SQLSTATE 40001, once
        connection.exec_driver_sql(f"CREATE SEQUENCE {name}")
        connection.exec_driver_sql(
            f"CREATE FUNCTION {name}() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN "
            f"IF nextval('{name}') = 1 THEN RAISE EXCEPTION 'serialization' USING ERRCODE = '40001'; END IF; "
            "RETURN NEW; END $$"
        )
        connection.exec_driver_sql(
            f"CREATE TRIGGER {name} BEFORE INSERT ON items FOR EACH ROW EXECUTE FUNCTION {name}()"
        )
    try:
        runner = bkit.runner(limit=2, retry=RetryPolicy(attempts=3, initial_delay=0.01))
        report = await runner.load(Item, item_rows(300), batch=100)
        assert (report.loaded, report.rejected, report.transactions) == (300, [], 3)
        assert report.stats.retried == 1, "the failed chunk ran again, and only it"
        assert tables.items() == list(range(300))
        assert tables.transactions() == 3, "the failed attempt left nothing"
    finally:
        with bkit.admin().begin() as connection:
            connection.exec_driver_sql(f"DROP TRIGGER IF EXISTS {name} ON items")
            connection.exec_driver_sql(f"DROP FUNCTION IF EXISTS {name}()")
            connection.exec_driver_sql(f"DROP SEQUENCE IF EXISTS {name}")
