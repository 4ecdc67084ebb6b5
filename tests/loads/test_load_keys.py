"""
Duplicate keys checked before a chunk is written: once a load meets a refused duplicate, each next
chunk asks the table which of its unique keys it holds and writes those rows alone, after the others.
The database still decides: a row set aside that it takes is loaded, a key the check cannot see is
found by the search, and a check that fails is not asked again. On each bulk path.
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from sqlalchemy import column, event, select, table
from sqlalchemy import exc as sa_exc
from sqlalchemy.engine import Engine

from boundeddb._loads.keys import KeyCheck
from tests.loads.conftest import Tables
from tests.loads.test_load_rejects import PATH_CASES, TAKEN_EMAIL, person, seed_taken
from tests.support.batches import BatchKit, every

pytestmark = [pytest.mark.usefixtures("collect_garbage")]


@contextmanager
def key_checks(bkit: BatchKit) -> Iterator[list[str]]:
    """The check's statements that the runner's engine runs meanwhile: SELECTs from load_people."""
    engine: Engine = getattr(bkit.engine, "sync_engine", bkit.engine)
    seen: list[str] = []

    def before(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        if statement.lstrip().upper().startswith("SELECT") and "load_people" in statement:
            seen.append(statement)

    event.listen(engine, "before_cursor_execute", before)
    try:
        yield seen
    finally:
        event.remove(engine, "before_cursor_execute", before)


@pytest.mark.anyio
@every(PATH_CASES)
async def test_after_a_duplicate_each_chunk_checks_its_keys_and_rejects_each_repeat(
    bkit: BatchKit, tables: Tables
) -> None:
    """Keys the table holds and keys repeated in the chunk: each repeat rejected, its first row loaded."""
    seed_taken(tables)
    rng = random.Random(400)
    taken = set(rng.sample(range(400), 12))  # repeat the seeded row's key
    repeats = {i: i - rng.randrange(1, 20) for i in rng.sample(range(120, 400), 8)}  # repeat an earlier row
    repeats = {i: first for i, first in repeats.items() if i not in taken and first not in taken}
    repeats = {i: first for i, first in repeats.items() if first not in repeats and i // 100 == first // 100}
    rows = [person(i) for i in range(400)]
    for i in taken:
        rows[i]["email"] = TAKEN_EMAIL
    for i, first in repeats.items():
        rows[i]["email"] = rows[first]["email"]
    runner = bkit.runner(limit=1)
    with key_checks(bkit) as checks:
        report = await runner.load(tables.people, rows, batch=100)
    bad = sorted(taken | set(repeats))
    assert [rejected.index for rejected in report.rejected] == bad
    assert all(isinstance(rejected.error, sa_exc.IntegrityError) for rejected in report.rejected)
    assert (report.loaded, report.transactions) == (400 - len(bad), 4)
    assert tables.column(tables.people, "n") == [-1, *(i for i in range(400) if i not in bad)]
    assert checks, "the chunks after the first duplicate checked their keys"


@pytest.mark.anyio
@every(PATH_CASES)
async def test_a_row_set_aside_that_the_table_takes_is_loaded(bkit: BatchKit, tables: Tables) -> None:
    """Row 110 repeats row 105's key, but row 105 is refused (CHECK): row 110 is the key's first and loads."""
    seed_taken(tables)
    rows = [person(i) for i in range(200)]
    rows[5]["email"] = TAKEN_EMAIL  # the first chunk meets a duplicate: the second checks its keys
    rows[105].update(email="shared@example.com", age=-1)
    rows[110]["email"] = "shared@example.com"
    runner = bkit.runner(limit=1)
    with key_checks(bkit) as checks:
        report = await runner.load(tables.people, rows, batch=100)
    assert [rejected.index for rejected in report.rejected] == [5, 105]
    assert (report.loaded, report.transactions) == (198, 2)
    assert checks
    assert 110 in tables.column(tables.people, "n")


@pytest.mark.anyio
@every([("semaphore", "asyncio"), ("threads-psycopg", "asyncio"), ("threads-pysqlite", "asyncio")])
async def test_chunks_of_rows_of_several_shapes_are_searched_without_a_check(
    bkit: BatchKit, tables: Tables
) -> None:
    """Rows with and without ``age``: no check (it asks one shape's keys); each duplicate searched for."""
    seed_taken(tables)
    bad = {3, 60, 61, 150}
    rows = [person(i, email=TAKEN_EMAIL) if i in bad else person(i) for i in range(200)]
    for row in rows[::7]:
        del row["age"]
    runner = bkit.runner(limit=1)
    with key_checks(bkit) as checks:
        report = await runner.load(tables.people, rows, batch=100)
    assert checks == []
    assert [rejected.index for rejected in report.rejected] == sorted(bad)
    assert (report.loaded, report.transactions) == (196, 2)


@pytest.mark.anyio
@every([("semaphore", "asyncio"), ("threads-pymysql", "asyncio"), ("threads-pysqlite", "asyncio")])
async def test_a_check_that_fails_is_not_asked_again_and_the_search_finds_the_duplicates(
    bkit: BatchKit, tables: Tables, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The check's statement refused (here: a table that is not there): its chunk goes on without it."""
    real = KeyCheck.queries

    def failing(self: KeyCheck, shape: Any) -> list[Any]:
        queries = real(self, shape)
        for query in queries:
            query.statement = select(column("x")).select_from(table("load_people_missing"))
        return queries

    monkeypatch.setattr(KeyCheck, "queries", failing)
    seed_taken(tables)
    bad = {5, 150, 250}
    rows = [person(i, email=TAKEN_EMAIL) if i in bad else person(i) for i in range(300)]
    runner = bkit.runner(limit=1)
    with key_checks(bkit) as checks:
        report = await runner.load(tables.people, rows, batch=100)
    assert len(checks) == 1, "the second chunk's check failed, the third asked none"
    assert [rejected.index for rejected in report.rejected] == sorted(bad)
    assert (report.loaded, report.transactions) == (297, 3)
    assert tables.column(tables.people, "n") == [-1, *(i for i in range(300) if i not in bad)]
    bkit.db.assert_no_open_transactions("after the load")
