"""
``load()`` stores each value as ``session.execute(insert(target), rows)`` stores it: the same rows go
into ``load_values`` by ``load()`` and into its twin by ``insert()`` on the same runner's driver, and
the two tables are compared row by row. On every bulk path: asyncpg's binary COPY, psycopg 3's text
COPY (async and sync), psycopg2's, pymysql's and SQLite's ``insert()``.
"""

from __future__ import annotations

import itertools
import uuid
from datetime import date, datetime, time, timedelta, timezone
from decimal import Decimal
from pathlib import Path
from typing import Any, ClassVar

import anyio
import pytest
from sqlalchemy import Column, Float, Integer, MetaData, String, Table, create_engine, func, insert, select
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker, create_async_engine
from sqlalchemy.orm import DeclarativeBase, Session, sessionmaker

from boundeddb import LoadReport, SemaphoreRunner, ThreadOffloadRunner
from tests.loads.conftest import Color, Level, Tables, Tag
from tests.support.batches import BatchKit, every, server_of

pytestmark = [pytest.mark.usefixtures("collect_garbage")]

#: Each bulk path once: PostgreSQL's four drivers, MariaDB's pymysql, SQLite's two drivers.
VALUE_CASES = [
    ("semaphore", "asyncio"),
    ("semaphore-psycopg", "asyncio"),
    ("threads-psycopg", "asyncio"),
    ("threads-psycopg2", "asyncio"),
    ("threads-pymysql", "asyncio"),
    ("semaphore-aiosqlite", "asyncio"),
    ("threads-pysqlite", "asyncio"),
]

PLUS_TWO = timezone(timedelta(hours=2))


def value_rows(server: str, n: int = 24) -> list[dict[str, Any]]:
    """Rows of four key sets, interleaved: all columns, defaults left out, few keys, None."""
    rows = []
    for i in range(n):
        full: dict[str, Any] = {
            "id": i,
            "shouted": f"v{i}",
            "color": Color.GREEN if i % 3 else Color.RED,
            "doc": {"i": i, "list": [1, "x", None], "nested": {"ok": True}},
            "uid": uuid.UUID(int=i + 1),
            "at": datetime(2026, 11, 29, 12, i % 60, 30, 123456, tzinfo=PLUS_TWO),
            "amount": Decimal("12.3456") + i if i % 2 else i,
            "blob": bytes([i, 0, 255, 10, 13]),
            "flag": i % 2 == 0,
        }
        if server == "postgresql":
            full["tags"] = [i, i + 1, -1]
        shape = i % 4
        if shape == 0:  # every column, the defaulted ones too
            full.update(scalar=100 + i, made="given", label="given", served="given")
            rows.append(full)
        elif shape == 1:  # the Python scalar, callable and server defaults fill the rest
            rows.append(full)
        elif shape == 2:  # a few keys, in another order
            rows.append({"shouted": "few", "id": i})
        else:  # explicit None: NULL, and JSON's null
            rows.append({key: value if key == "id" else None for key, value in full.items()})
    return rows


async def insert_twin(kit: BatchKit, runner: Any, twin: Table, rows: list[dict[str, Any]]) -> None:
    """``session.execute(insert(twin), rows)`` on the runner's driver, per run of one key set."""
    groups = [list(group) for _, group in itertools.groupby(rows, key=lambda row: tuple(row))]
    if kit.is_async:

        async def unit(session: AsyncSession) -> None:
            for group in groups:
                await session.execute(insert(twin), group)

    else:

        def unit(session: Session) -> None:  # type: ignore[misc]
            for group in groups:
                session.execute(insert(twin), group)

    await runner.run([unit])


@pytest.mark.anyio
@every(VALUE_CASES)
async def test_loaded_values_equal_inserted_values(bkit: BatchKit, tables: Tables) -> None:
    """TypeDecorator, Enum, JSON, Uuid, ARRAY, timestamptz, Numeric, bytes, bool, defaults: as insert()."""
    tables.need(tables.values, tables.twin)
    rows = value_rows(tables.server)
    runner = bkit.runner(limit=2)
    report = await runner.load(tables.values, rows, batch=7)
    assert (report.loaded, report.rejected, report.skipped, report.transactions) == (len(rows), [], 0, 4)
    await insert_twin(bkit, runner, tables.twin, rows)
    loaded, inserted = tables.rows(tables.values), tables.rows(tables.twin)
    assert len(loaded) == len(rows)
    for row, mine, theirs in zip(rows, loaded, inserted, strict=True):
        assert mine == theirs, row
    by_id = {row[0]: row for row in loaded}
    names = [column.name for column in tables.values.columns]
    first, defaulted = dict(zip(names, by_id[0], strict=True)), dict(zip(names, by_id[1], strict=True))
    assert first["shouted"] == "V0!", "the TypeDecorator's bind processing ran"
    assert (first["scalar"], first["made"], first["served"]) == (100, "given", "given")
    assert (defaulted["scalar"], defaulted["made"], defaulted["label"], defaulted["served"]) == (
        7,
        "made",
        "label-1",
        "srv",
    )


@pytest.mark.anyio
@every([("semaphore", "asyncio"), ("threads-psycopg", "asyncio")])
async def test_sequence_rows_with_columns_equal_mapping_rows(bkit: BatchKit, tables: Tables) -> None:
    """Rows as tuples with columns= store what the same rows as mappings store."""
    tables.need(tables.values, tables.twin)
    rows = [row for row in value_rows(tables.server) if row["id"] % 4 == 1]
    columns = list(rows[0])
    runner = bkit.runner(limit=2)
    report = await runner.load(
        tables.values, [tuple(row[c] for c in columns) for row in rows], columns=columns
    )
    assert (report.loaded, report.transactions) == (len(rows), 1)
    await runner.load(tables.twin, rows)
    assert tables.rows(tables.values) == tables.rows(tables.twin)


TRICKY_TEXT = [
    "",
    "\\N",
    "a\tb",
    "line\nbreak",
    "cr\rx",
    "back\\slash",
    "quote'\"",
    "ünï 😀",
    "NULL",
    " pad ",
    "{a,b}",
]


def tricky_rows() -> list[dict[str, Any]]:
    """Values a text COPY must escape, quote or spell as the server parses them; one column per row."""
    columns: dict[str, list[Any]] = {
        "s": TRICKY_TEXT,
        "j": [{"s": text} for text in TRICKY_TEXT] + [[1.5, None, "x"], "just a string", 0, None],
        "b": [b"", b"\\", b"\x00\xff\t\n", b"\\x00"],
        "d": [
            Decimal("1e-20"),
            Decimal("123456789012345678901234567890.123456789"),
            Decimal("-0"),
            Decimal("NaN"),
        ],
        "arr": [[], [None], ["", "NULL", "a,b", "{x}", 'q"uote', "back\\slash", " sp ", "tab\there", "ü"]],
        "nums": [[[1, 2], [3, None]]],
        "day": [date(2000, 2, 29), date(1, 1, 2), date(9999, 12, 30)],  # asyncpg: date.min is -infinity
        "clock": [time(23, 59, 59, 999999), time(0, 0)],
        "naive": [
            datetime(2026, 11, 29, 3, 4, 5),
            datetime(2026, 6, 1, tzinfo=timezone(timedelta(hours=-3, minutes=-30))),
        ],
        "i": [0, -(2**31), 2**31 - 1],
    }
    return [
        {"id": i, column: value}
        for i, (column, value) in enumerate(
            (column, value) for column, values in columns.items() for value in values
        )
    ]


@pytest.mark.anyio
@every([case for case in VALUE_CASES if server_of(case[0]) == "postgresql"])
async def test_values_a_text_copy_must_escape_equal_inserted_values(bkit: BatchKit, tables: Tables) -> None:
    """Backslashes, tabs, \\N, quotes in arrays, NaN, far dates, times, bytes: as insert() stores them."""
    tables.need(tables.tricky, tables.tricky_twin)
    rows = tricky_rows()
    runner = bkit.runner(limit=1)
    report = await runner.load(tables.tricky, rows)
    assert (report.loaded, report.rejected) == (len(rows), [])
    await insert_twin(bkit, runner, tables.tricky_twin, rows)
    loaded, inserted = tables.rows(tables.tricky), tables.rows(tables.tricky_twin)
    for row, mine, theirs in zip(rows, loaded, inserted, strict=True):
        assert repr(mine) == repr(theirs), row


#: psycopg2's COPY writes a str or int that is an enum member as str() spells it ("Tag.HOT"), not as
#: psycopg2 binds it ("hot"): src/boundeddb/_dialects/copy_text.py's _text() checks the exact class.
ENUM_MIXIN_CASES = [
    pytest.param(
        case,
        backend,
        id=f"{case}-{backend}",
        marks=[pytest.mark.postgres],
    )
    for case, backend in VALUE_CASES
    if server_of(case) == "postgresql"
]


@pytest.mark.anyio
@pytest.mark.parametrize(("case", "anyio_backend"), ENUM_MIXIN_CASES)
async def test_str_and_int_enum_members_are_stored_as_their_values(bkit: BatchKit, tables: Tables) -> None:
    """(str, Enum) and (int, Enum) members in Text and Integer columns: stored as insert() stores them."""
    tables.need(tables.tricky, tables.tricky_twin)
    rows = [{"id": 0, "s": Tag.HOT}, {"id": 1, "i": Level.LOW}, {"id": 2, "arr": [Tag.HOT]}]
    runner = bkit.runner(limit=1)
    report = await runner.load(tables.tricky, rows)
    assert (report.loaded, report.rejected) == (len(rows), [])
    await insert_twin(bkit, runner, tables.tricky_twin, rows)
    assert tables.rows(tables.tricky) == tables.rows(tables.tricky_twin)
    assert tables.rows(tables.tricky)[0][1] == "hot"


class Mapped(DeclarativeBase):
    pass


class Employee(Mapped):
    """Single-table inheritance, and attribute keys that are not the column names."""

    __tablename__ = "load_employees"
    id = Column(Integer, primary_key=True, autoincrement=False)
    kind = Column(String(20), nullable=False)
    full_name = Column("name", String(20))
    grade = Column("level", Integer, default=3)
    __mapper_args__: ClassVar[dict[str, Any]] = {"polymorphic_on": kind, "polymorphic_identity": "employee"}


class Manager(Employee):
    __mapper_args__: ClassVar[dict[str, Any]] = {"polymorphic_identity": "manager"}


@pytest.mark.anyio
@every([case for case in VALUE_CASES if case[0] != "semaphore-psycopg"])
async def test_a_mapped_subclass_gets_its_polymorphic_identity_as_insert_gives_it(
    bkit: BatchKit, tables: Tables
) -> None:
    """load(Manager, rows) sets kind="manager" as insert(Manager) does; attribute keys name the columns."""
    admin = bkit.admin()
    Mapped.metadata.drop_all(admin)
    Mapped.metadata.create_all(admin)
    try:
        runner = bkit.runner(limit=1)
        rows: list[Any] = [{"id": 1, "full_name": "a"}, Manager(id=2, full_name="b", grade=9), {"id": 3}]
        report = await runner.load(Manager, rows)
        assert (report.loaded, report.rejected) == (3, [])
        report = await runner.load(Employee, [{"full_name": "d", "id": 4}])
        assert (report.loaded, report.rejected) == (1, [])
        if bkit.is_async:

            async def unit(session: AsyncSession) -> None:
                await session.execute(insert(Manager), [{"id": 11, "full_name": "a"}, {"id": 13}])
                await session.execute(insert(Employee), [{"full_name": "d", "id": 14}])

        else:

            def unit(session: Session) -> None:  # type: ignore[misc]
                session.execute(insert(Manager), [{"id": 11, "full_name": "a"}, {"id": 13}])
                session.execute(insert(Employee), [{"full_name": "d", "id": 14}])

        await runner.run([unit])
        stored = tables.rows(Employee.__table__)
        assert stored == [
            (1, "manager", "a", 3),
            (2, "manager", "b", 9),
            (3, "manager", None, 3),
            (4, "employee", "d", 3),
            (11, "manager", "a", 3),
            (13, "manager", None, 3),
            (14, "employee", "d", 3),
        ]
    finally:
        bkit.db.terminate()
        Mapped.metadata.drop_all(admin)


@pytest.mark.parametrize("driver", ["pysqlite", "aiosqlite"])
def test_a_float_default_fills_rows_that_lack_it_on_sqlite(driver: str, tmp_path: Path) -> None:
    """SQLite's Float processor on a column no row gives, filled by its default, as insert() fills it."""
    metadata = MetaData()
    loaded = Table("loaded", metadata, Column("a", Integer), Column("f", Float, default=1))
    twin = Table("twin", metadata, Column("a", Integer), Column("f", Float, default=1))
    rows = [{"a": i} for i in range(10)]
    url = f"sqlite:///{tmp_path / 'defaults.db'}"
    engine = create_engine(url)
    metadata.create_all(engine)
    with engine.begin() as connection:
        connection.execute(insert(twin), rows)
    if driver == "pysqlite":
        with ThreadOffloadRunner(sessionmaker(engine), limit=1) as threads:
            report = threads.load_sync(loaded, rows, batch=4)
    else:

        async def load() -> LoadReport:
            async_engine = create_async_engine(url.replace("sqlite:", "sqlite+aiosqlite:"))
            try:
                async with SemaphoreRunner(async_sessionmaker(async_engine), limit=1) as runner:
                    return await runner.load(loaded, rows, batch=4)
            finally:
                await async_engine.dispose()

        report = anyio.run(load)
    assert (report.loaded, report.rejected) == (10, [])
    with engine.connect() as connection:  # typeof(): how each value is stored, not only what it equals
        got = connection.execute(select(loaded.c.a, loaded.c.f, func.typeof(loaded.c.f)).order_by("a")).all()
        want = connection.execute(select(twin.c.a, twin.c.f, func.typeof(twin.c.f)).order_by("a")).all()
    engine.dispose()
    assert got == want == [(i, 1.0, "real") for i in range(10)]
