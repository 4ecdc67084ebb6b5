"""
Rows the database refuses: each rejected alone, with its input index, the row as given and the
SQLAlchemy exception that ``insert()`` would raise; every other row committed once. On each bulk path
(PostgreSQL's COPY by asyncpg and psycopg 3, async and sync; psycopg2's; MariaDB's ``executemany()``;
SQLite's multi-row ``INSERT`` statements), where the kind of refusal exists. Then ``errors="raise"``,
a target whose Python default is a SQL expression, which takes the ``insert()`` path, and SQLite's
statements: refusals at their edges, a build that takes fewer parameters, the savepoint set late.
"""

from __future__ import annotations

import random
import re
import sqlite3
import sys
from datetime import datetime
from typing import Any

import pytest
from sqlalchemy import MetaData, Table, event, text
from sqlalchemy import exc as sa_exc

from boundeddb import LoadFailed
from tests.loads.conftest import Tables
from tests.support.batches import BatchKit, every
from tests.support.faults import codes_of

pytestmark = [pytest.mark.usefixtures("collect_garbage")]

#: PostgreSQL's four drivers, each a bulk path of its own (asyncpg's binary COPY, psycopg 3's, psycopg2's).
POSTGRES_CASES = [
    ("semaphore", "asyncio"),
    ("semaphore-psycopg", "asyncio"),
    ("threads-psycopg", "asyncio"),
    ("threads-psycopg2", "asyncio"),
]
#: A case per bulk path and driver family: PostgreSQL's four drivers, MariaDB's async and sync drivers,
#: SQLite's two.
REJECT_CASES = [
    *POSTGRES_CASES,
    ("chunked-asyncmy", "asyncio"),
    ("threads-pymysql", "asyncio"),
    ("semaphore-aiosqlite", "asyncio"),
    ("threads-pysqlite", "asyncio"),
]
#: One case per bulk path: asyncpg's binary COPY, psycopg 3's text COPY, psycopg2's, MariaDB's, SQLite's.
PATH_CASES = [
    ("semaphore", "asyncio"),
    ("threads-psycopg", "asyncio"),
    ("threads-psycopg2", "asyncio"),
    ("threads-pymysql", "asyncio"),
    ("threads-pysqlite", "asyncio"),
]

TAKEN_EMAIL = "taken@example.com"

#: Each kind of bad row: the values that make it bad.
BAD = {
    "duplicate key": {"email": TAKEN_EMAIL},
    "not null": {"name": None},
    "check": {"age": -1},
    "too long": {"name": "x" * 11},
    "not a number": {"score": "abc"},
    "foreign key": {"ref": 999},
    "deferred foreign key": {"dref": 999},
}
#: Where each kind sits in 60 rows of chunks of 25: a chunk's first and last rows, side by side, the end.
WHERE = {
    "duplicate key": 0,
    "not null": 24,
    "check": 25,
    "too long": 26,
    "not a number": 40,
    "foreign key": 49,
    "deferred foreign key": 59,
}
#: (exception class, SQLSTATE or MySQL error number) of each kind on each database; None: no code to see.
EXPECTED: dict[str, dict[str, tuple[type[Exception], Any]]] = {
    "postgresql": {
        "duplicate key": (sa_exc.IntegrityError, "23505"),
        "not null": (sa_exc.IntegrityError, "23502"),
        "check": (sa_exc.IntegrityError, "23514"),
        "too long": (sa_exc.DataError, "22001"),
        "not a number": (sa_exc.DataError, "22P02"),
        "foreign key": (sa_exc.IntegrityError, "23503"),
        "deferred foreign key": (sa_exc.IntegrityError, "23503"),
    },
    "mariadb": {
        "duplicate key": (sa_exc.IntegrityError, 1062),
        "not null": (sa_exc.IntegrityError, 1048),
        "check": (sa_exc.DBAPIError, 4025),
        "too long": (sa_exc.DataError, 1406),
        "not a number": (sa_exc.DataError, 1366),
        "foreign key": (sa_exc.IntegrityError, 1452),
    },
    "sqlite": {
        "duplicate key": (sa_exc.IntegrityError, None),
        "not null": (sa_exc.IntegrityError, None),
        "check": (sa_exc.IntegrityError, None),
        "foreign key": (sa_exc.IntegrityError, None),
    },
}


def person(i: int, **bad: Any) -> dict[str, Any]:
    """A good row of load_people for input index ``i``, with ``bad``'s values over it."""
    return {
        "n": i,
        "email": f"p{i}@example.com",
        "name": f"p{i}",
        "age": i,
        "score": i,
        "ref": 1 + i % 3,
        **bad,
    }


def seed_taken(tables: Tables) -> None:
    """Make load_people, with the row whose email the duplicates repeat."""
    tables.need(tables.people)
    with tables.kit.admin().begin() as connection:
        connection.execute(tables.people.insert(), person(-1, email=TAKEN_EMAIL, age=0))


def code_of(error: BaseException) -> Any:
    """The SQLSTATE (PostgreSQL) or error number (MySQL) of ``error``, or None."""
    args = getattr(getattr(error, "orig", None), "args", ())
    if args and isinstance(args[0], int):
        return args[0]
    return codes_of(error)


@pytest.mark.anyio
@every(REJECT_CASES)
async def test_each_kind_of_bad_row_is_rejected_alone(bkit: BatchKit, tables: Tables) -> None:
    """Duplicate key, NOT NULL, CHECK, too long, not a number, foreign key, deferred: each alone."""
    seed_taken(tables)
    expected = EXPECTED[tables.server]
    where = {WHERE[kind]: kind for kind in expected}
    rows = [person(i, **BAD[where[i]]) if i in where else person(i) for i in range(60)]
    report = await bkit.runner(limit=2).load(tables.people, rows, batch=25)
    assert [rejected.index for rejected in report.rejected] == sorted(where)
    for rejected in report.rejected:
        kind = where[rejected.index]
        assert rejected.row is rows[rejected.index], kind
        error_type, code = expected[kind]
        if bkit.driver == "asyncpg" and kind == "not a number":
            code = None  # asyncpg's binary COPY refuses "abc" before the server sees it: a DataError
        if bkit.driver == "asyncpg" and kind == "too long":
            error_type = sa_exc.DBAPIError  # what insert() raises too: SQLAlchemy maps no asyncpg DataError
        assert isinstance(rejected.error, error_type), (kind, rejected.error)
        assert code_of(rejected.error) == code, (kind, rejected.error)
        assert rejected.error.__traceback__ is None, "no frames (and the attempt's records) held"
        assert all(
            link is None or link.__traceback__ is None
            for link in (rejected.error.__cause__, rejected.error.__context__)
        )
    good = [i for i in range(60) if i not in where]
    assert (report.loaded, report.transactions, report.skipped) == (len(good), 3, 0)
    assert tables.column(tables.people, "n") == [-1, *good]


@pytest.mark.anyio
@every(PATH_CASES)
async def test_one_percent_duplicate_keys_spread_through_the_input(bkit: BatchKit, tables: Tables) -> None:
    """30 duplicate keys at random places among 3000 rows: exactly those rejected, the rest loaded."""
    seed_taken(tables)
    bad = set(random.Random(3000).sample(range(3000), 30))
    rows = [person(i, email=TAKEN_EMAIL) if i in bad else person(i) for i in range(3000)]
    report = await bkit.runner(limit=2).load(tables.people, rows, batch=1000)
    assert [rejected.index for rejected in report.rejected] == sorted(bad)
    assert all(isinstance(rejected.error, sa_exc.IntegrityError) for rejected in report.rejected)
    assert (report.loaded, report.transactions) == (2970, 3)
    assert tables.column(tables.people, "n") == [-1, *(i for i in range(3000) if i not in bad)]


@pytest.mark.anyio
@every(PATH_CASES)
async def test_errors_raise_stops_at_the_first_refused_row_and_rolls_its_chunk_back(
    bkit: BatchKit, tables: Tables
) -> None:
    """errors="raise": LoadFailed names the row, its chunk rolls back, the chunks before it stay committed."""
    seed_taken(tables)
    rows = [person(i, email=TAKEN_EMAIL) if i == 33 else person(i) for i in range(60)]
    runner = bkit.runner(limit=1)
    message = 'row 33 was refused (IntegrityError) and errors="raise": 20 rows committed'
    with pytest.raises(LoadFailed, match=f"^{re.escape(message)}$") as raised:
        await runner.load(tables.people, rows, batch=20, errors="raise")
    report = raised.value.report
    assert isinstance(raised.value.__cause__, sa_exc.IntegrityError)
    assert [(r.index, r.row is rows[33]) for r in report.rejected] == [(33, True)]
    assert report.rejected[0].error is raised.value.__cause__
    assert (report.loaded, report.transactions) == (20, 1)
    assert tables.column(tables.people, "n") == [-1, *range(20)], "the bad row's chunk rolled back"
    assert bkit.pool.checkedout() == 0
    bkit.db.assert_no_open_transactions("after LoadFailed")


@pytest.mark.anyio
@every([("semaphore", "asyncio"), ("threads-psycopg", "asyncio"), ("threads-pymysql", "asyncio")])
async def test_a_sql_expression_default_takes_the_insert_path_and_still_rejects(
    bkit: BatchKit, tables: Tables
) -> None:
    """default=func.now(): the rows go through insert(), get their timestamp, a duplicate is rejected."""
    tables.need(tables.stamped)
    rows = [{"n": 9 if i == 10 else i} for i in range(30)]  # 9 and 10: the same chunk
    report = await bkit.runner(limit=2).load(tables.stamped, rows, batch=8)
    assert [(r.index, type(r.error)) for r in report.rejected] == [(10, sa_exc.IntegrityError)]
    assert (report.loaded, report.transactions) == (29, 4)
    assert tables.column(tables.stamped, "n") == [i for i in range(30) if i != 10]
    assert all(isinstance(created, datetime) for created in tables.column(tables.stamped, "created"))


@pytest.mark.anyio
@every([("semaphore", "asyncio"), ("threads-psycopg", "asyncio"), ("threads-psycopg2", "asyncio")])
async def test_a_deferrable_unique_key_is_found_by_bisection(bkit: BatchKit, tables: Tables) -> None:
    """UNIQUE DEFERRABLE: checked at the statement's end, no COPY line: bisection finds both."""
    with tables.kit.admin().begin() as connection:
        connection.execute(
            text("CREATE TABLE load_deferrable (n int, code int UNIQUE DEFERRABLE INITIALLY DEFERRED)")
        )
        connection.execute(text("INSERT INTO load_deferrable (n, code) VALUES (-1, 5)"))
    try:
        table = Table("load_deferrable", MetaData(), autoload_with=tables.kit.admin())
        rows = [{"n": i, "code": 5 if i == 3 else 7 if i in (5, 8) else 100 + i} for i in range(10)]
        report = await bkit.runner(limit=1).load(table, rows)
        assert [(r.index, code_of(r.error)) for r in report.rejected] == [(3, "23505"), (8, "23505")]
        assert tables.column(table, "n") == [-1, 0, 1, 2, 4, 5, 6, 7, 9]
    finally:
        bkit.db.terminate()
        with tables.kit.admin().begin() as connection:
            connection.execute(text("DROP TABLE load_deferrable"))


@pytest.mark.anyio
@every([("semaphore", "asyncio"), ("semaphore-psycopg", "asyncio"), ("threads-psycopg", "asyncio")])
async def test_a_later_row_named_first_by_copy_loses_no_row(bkit: BatchKit, tables: Tables) -> None:
    """COPY names row 24's CHECK before row 0's duplicate (unique keys wait for its buffer): 1-23 stay."""
    seed_taken(tables)
    rows = [person(0, email=TAKEN_EMAIL), *(person(i) for i in range(1, 24)), person(24, age=-1)]
    report = await bkit.runner(limit=1).load(tables.people, rows, batch=25)
    assert [r.index for r in report.rejected] == [0, 24]
    assert (report.loaded, report.transactions) == (23, 1)
    assert tables.column(tables.people, "n") == [-1, *range(1, 24)]


#: SQLite's two drivers, whose rows go as multi-row INSERT statements of up to 1,000 rows.
SQLITE_CASES = [("semaphore-aiosqlite", "asyncio"), ("threads-pysqlite", "asyncio")]


def statements_sent(bkit: BatchKit) -> list[str]:
    """Each statement the runner's engine sends from now on, as sent."""
    sent: list[str] = []

    def record(_conn: Any, _cursor: Any, statement: str, *_: Any) -> None:
        sent.append(statement)

    event.listen(getattr(bkit.engine, "sync_engine", bkit.engine), "before_cursor_execute", record)
    return sent


def inserts(sent: list[str]) -> list[tuple[int, int]]:
    """The rows and parameters of each multi-row ``INSERT INTO load_people`` among ``sent``."""
    return [
        (statement.count("), (") + 1, statement.count("?"))
        for statement in sent
        if statement.startswith("INSERT INTO load_people ")
    ]


@pytest.mark.anyio
@every(SQLITE_CASES)
async def test_sqlite_rows_refused_in_any_statement_of_a_chunk_are_rejected_alone(
    bkit: BatchKit, tables: Tables
) -> None:
    """A chunk of 2,500 rows goes as INSERTs of 1,000, 1,000 and 500 rows: bad rows at their edges, alone."""
    seed_taken(tables)
    bad = {
        0: {"email": TAKEN_EMAIL},
        999: {"name": None},
        1000: {"age": -1},
        1999: {"email": TAKEN_EMAIL},
        2000: {"name": None},
        2499: {"age": -1},
    }
    rows = [person(i, **bad.get(i, {})) for i in range(2500)]
    runner = bkit.runner(limit=1)
    sent = statements_sent(bkit)
    report = await runner.load(tables.people, rows, batch=2500)
    assert max(inserts(sent)) == (1000, 6000), "multi-row statements of 1,000 rows, 6 parameters a row"
    assert [rejected.index for rejected in report.rejected] == sorted(bad)
    assert all(isinstance(rejected.error, sa_exc.IntegrityError) for rejected in report.rejected)
    assert (report.loaded, report.transactions) == (2494, 1)
    assert tables.column(tables.people, "n") == [-1, *(i for i in range(2500) if i not in bad)]


@pytest.mark.anyio
@pytest.mark.skipif(sys.version_info < (3, 11), reason="sqlite3.Connection.setlimit() is new in Python 3.11")
@every([("threads-pysqlite", "asyncio")])
async def test_sqlite_built_for_fewer_parameters_gets_smaller_statements(
    bkit: BatchKit, tables: Tables
) -> None:
    """A build that takes 100 parameters (6 a row): statements halved until they pass, no row lost."""
    seed_taken(tables)
    rows = [person(i, email=TAKEN_EMAIL) if i == 250 else person(i) for i in range(500)]
    runner = bkit.runner(limit=1)
    event.listen(
        bkit.engine,
        "checkout",
        lambda dbapi_connection, *_: dbapi_connection.setlimit(sqlite3.SQLITE_LIMIT_VARIABLE_NUMBER, 100),
    )
    sent = statements_sent(bkit)
    report = await runner.load(tables.people, rows, batch=500)
    sizes = inserts(sent)
    passed = sizes.index((15, 90))  # refused at 500, 250, 125, 62 and 31 rows: 186 parameters and more
    assert sizes[:passed] == [(n, 6 * n) for n in (500, 250, 125, 62, 31)]
    assert max(parameters for _, parameters in sizes[passed:]) <= 100, (
        "never more than the build allows again"
    )
    assert [rejected.index for rejected in report.rejected] == [250]
    assert report.loaded == 499
    assert tables.column(tables.people, "n") == [-1, *(i for i in range(500) if i != 250)]
    rows = [person(i) for i in range(1000, 1010)]
    bkit.engine.dispose()  # a new connection: sqlite3's cache of prepared statements holds no INSERT
    event.listen(
        bkit.engine,
        "checkout",
        lambda dbapi_connection, *_: dbapi_connection.setlimit(sqlite3.SQLITE_LIMIT_VARIABLE_NUMBER, 5),
    )
    with pytest.raises(
        LoadFailed, match=r"a chunk of rows failed \(OperationalError\): 0 rows committed"
    ) as raised:
        await runner.load(tables.people, rows)  # fewer than one row's 6: the error insert() raises
    assert isinstance(raised.value.__cause__, sa_exc.OperationalError)
    assert "too many SQL variables" in str(raised.value.__cause__)
    assert len(tables.column(tables.people, "n")) == 500


@pytest.mark.anyio
@every(SQLITE_CASES)
async def test_sqlite_sets_the_savepoint_only_once_a_chunk_needs_it(bkit: BatchKit, tables: Tables) -> None:
    """A clean chunk: no SAVEPOINT. A refused first attempt: its transaction begun again, then one."""
    seed_taken(tables)
    rows = [person(i, email=TAKEN_EMAIL) if i == 7 else person(i) for i in range(20)]
    runner = bkit.runner(limit=1)
    sent = statements_sent(bkit)
    report = await runner.load(tables.people, rows, batch=5)  # rows 5-9 the second chunk
    assert [rejected.index for rejected in report.rejected] == [7]
    assert (report.loaded, report.transactions) == (19, 4)
    chunks: list[list[str]] = []
    for statement in sent:  # each by its first word, two for BEGIN IMMEDIATE
        word = "BEGIN IMMEDIATE" if statement.startswith("BEGIN IMMEDIATE") else statement.split()[0]
        if word == "BEGIN":
            chunks.append([])
        chunks[-1].append(word)
    assert len(chunks) == 4, sent
    assert chunks[0] == ["BEGIN", "INSERT"], "a clean chunk: no savepoint"
    assert chunks[1][:5] == ["BEGIN", "INSERT", "ROLLBACK", "BEGIN IMMEDIATE", "SAVEPOINT"], sent
    assert all("SAVEPOINT" not in chunk for chunk in chunks[2:]), sent
    assert tables.column(tables.people, "n") == [-1, *(i for i in range(20) if i != 7)]
    assert bkit.pool.checkedout() == 0
