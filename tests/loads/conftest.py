"""
What the ``load()`` tests share: the batch tests' kit (tests/support/batches.py: a runner of a case on
PostgreSQL, MariaDB or SQLite, the items table with its seed row ``taken``), the tables below made
afresh for each test, and reads of them from another connection.
"""

from __future__ import annotations

import contextlib
import enum
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    CheckConstraint,
    Column,
    Date,
    DateTime,
    Enum,
    ForeignKey,
    Integer,
    LargeBinary,
    MetaData,
    Numeric,
    String,
    Table,
    Text,
    Time,
    TypeDecorator,
    Uuid,
    func,
    select,
    text,
)
from sqlalchemy.dialects.postgresql import ARRAY, JSONB
from sqlalchemy.engine import Connection, Dialect

from tests.support.batches import (  # noqa: F401 -- the *_fixture names are fixtures pytest finds here
    BatchKit,
    bkit_fixture,
    make_sqlite_async_engine_fixture,
    make_sqlite_sync_engine_fixture,
    sqlite_file_fixture,
)
from tests.support.models import Item
from tests.support.servers import PostgreSQL

#: The journal table of the load tests (PostgreSQL's schema is shared by a worker's tests: dropped after).
JOURNAL_TABLE = "load_journal"


class Color(enum.Enum):
    RED = "r"
    GREEN = "g"


class Shouted(TypeDecorator[str]):
    """A TypeDecorator whose bind processing is boundeddb's to run: upper-cases what it stores."""

    impl = String(20)
    cache_ok = True

    def process_bind_param(self, value: str | None, dialect: Dialect) -> str | None:
        return None if value is None else value.upper() + "!"


def _row_label(context: Any) -> str:
    """A callable default that reads the row's other values, as SQLAlchemy gives them."""
    return f"label-{context.get_current_parameters()['id']}"


def people_table(metadata: MetaData, server: str) -> Table:
    """``load_people``: a row for each kind of refusal (deferred foreign key on PostgreSQL only)."""
    columns = [
        Column("id", Integer, primary_key=True),
        Column("n", Integer, nullable=False),
        Column("email", String(40), nullable=False, unique=True),
        Column("name", String(10), nullable=False),
        Column("age", Integer),
        Column("score", Integer),
        Column("ref", Integer, ForeignKey("load_refs.id")),
    ]
    if server == "postgresql":
        columns.append(
            Column("dref", Integer, ForeignKey("load_refs.id", deferrable=True, initially="DEFERRED"))
        )
    return Table("load_people", metadata, *columns, CheckConstraint("age >= 0", name="load_people_age"))


def values_table(metadata: MetaData, name: str, server: str) -> Table:
    """One column of each type whose values ``load()`` must store as ``insert()`` does."""
    columns = [
        Column("id", Integer, primary_key=True, autoincrement=False),
        Column("shouted", Shouted),
        Column("color", Enum(Color)),
        Column("doc", JSON().with_variant(JSONB(), "postgresql")),
        Column("uid", Uuid),
        Column("at", DateTime(timezone=True)),
        Column("amount", Numeric(12, 4)),
        Column("blob", LargeBinary),
        Column("flag", Boolean),
        Column("scalar", Integer, default=7),
        Column("made", String(20), default=lambda: "made"),
        Column("label", String(20), default=_row_label),
        Column("served", String(20), server_default="srv"),
    ]
    if server == "postgresql":
        columns.append(Column("tags", ARRAY(Integer)))
    return Table(name, metadata, *columns)


class Tables:
    """The load tests' tables on the kit's database: those a test needs, made for it and dropped after it."""

    def __init__(self, kit: BatchKit) -> None:
        self.kit = kit
        #: The tables :meth:`need` made: dropped after the test.
        self.created: list[Table] = []
        self.server = kit.db.name
        self.metadata = MetaData()
        self.refs = Table("load_refs", self.metadata, Column("id", Integer, primary_key=True))
        self.people = people_table(self.metadata, self.server)
        self.values = values_table(self.metadata, "load_values", self.server)
        self.twin = values_table(self.metadata, "load_values_twin", self.server)
        if self.server == "postgresql":
            self.tricky = tricky_table(self.metadata, "load_tricky")
            self.tricky_twin = tricky_table(self.metadata, "load_tricky_twin")
        self.stamped = Table(
            "load_stamped",
            self.metadata,
            Column("id", Integer, primary_key=True),
            Column("n", Integer, nullable=False, unique=True),
            Column("created", DateTime, nullable=False, default=func.now()),
        )

    def need(self, *tables: Table) -> None:
        """Create ``tables`` (and ``load_refs``, with ids 1 to 3, for ``load_people``) for this test."""
        admin = self.kit.admin()
        wanted = [self.refs, *tables] if self.people in tables else list(tables)
        self.metadata.drop_all(admin, tables=wanted)
        self.metadata.create_all(admin, tables=wanted)
        self.created.extend(wanted)
        if self.people in tables:
            with admin.begin() as connection:
                connection.execute(self.refs.insert(), [{"id": i} for i in (1, 2, 3)])

    def drop(self) -> None:
        if self.created:
            self.metadata.drop_all(self.kit.admin(), tables=self.created)

    @contextlib.contextmanager
    def reading(self) -> Iterator[Connection]:
        """
        A connection of the admin engine that prepares no statement: psycopg 3 prepares a query run
        five times, and the same SELECT of a table made again with new types would fail with "cached
        plan must not change result type".
        """
        with self.kit.admin().connect() as connection:
            driver = connection.connection.driver_connection
            threshold = getattr(driver, "prepare_threshold", None)
            if threshold is not None:
                driver.prepare_threshold = None  # type: ignore[union-attr]
            try:
                yield connection
            finally:
                if threshold is not None:
                    driver.prepare_threshold = threshold  # type: ignore[union-attr]

    def rows(self, table: Table, order: str = "id") -> list[tuple[Any, ...]]:
        """Every row of ``table``, by ``order``, read from another connection."""
        with self.reading() as connection:
            return [tuple(row) for row in connection.execute(select(table).order_by(table.c[order]))]

    def column(self, table: Table, name: str) -> list[Any]:
        """``table``'s column ``name``, sorted."""
        with self.reading() as connection:
            return sorted(connection.execute(select(table.c[name])).scalars())

    def items(self) -> list[int]:
        """The ``unit`` of every items row but the seed, sorted: each loaded input index once."""
        return [unit for unit in self.kit.db.committed_units() if unit >= 0]

    def add_xid(self) -> None:
        """PostgreSQL: ``items.xid``, the server's id of the transaction that wrote each row."""
        with self.kit.admin().begin() as connection:
            connection.execute(
                text("ALTER TABLE items ADD COLUMN xid bigint NOT NULL DEFAULT txid_current()")
            )

    def transactions(self) -> int:
        """PostgreSQL: how many transactions wrote the items rows but the seed, by their server-side ids."""
        items = Item.__table__
        xid = Column("xid", BigInteger)
        statement = select(func.count(xid.distinct())).select_from(items).where(items.c.unit >= 0)
        with self.kit.admin().connect() as connection:
            return int(connection.execute(statement).scalar_one())


@pytest.fixture
def tables(bkit: BatchKit) -> Iterator[Tables]:
    """The load tests' tables, each made by ``need()`` for the test; the journal table dropped after."""
    made = Tables(bkit)
    yield made
    bkit.db.terminate()  # a connection leaked in a transaction would block DROP TABLE
    made.drop()
    if isinstance(bkit.db, PostgreSQL):
        with bkit.db.admin.connect() as connection:
            connection.execute(text(f"DROP TABLE IF EXISTS {JOURNAL_TABLE}"))


def item_rows(
    n: int, *, start: int = 0, key: Callable[[int], str] = lambda i: f"k{i}"
) -> list[dict[str, Any]]:
    """``n`` rows for ``Item``: key ``k<i>``, unit ``i`` (the input index when ``start`` is 0)."""
    return [{"key": key(i), "unit": i} for i in range(start, start + n)]


class Level(int, enum.Enum):
    """An int that is an enum member: drivers bind it as its int."""

    LOW = 1


class Tag(str, enum.Enum):
    """A str that is an enum member: drivers bind it as its str."""

    HOT = "hot"


def tricky_table(metadata: MetaData, name: str) -> Table:
    """PostgreSQL: the values a text COPY must escape or spell as the server parses them."""
    return Table(
        name,
        metadata,
        Column("id", Integer, primary_key=True, autoincrement=False),
        Column("s", Text),
        Column("j", JSONB),
        Column("b", LargeBinary),
        Column("d", Numeric),
        Column("arr", ARRAY(Text)),
        Column("nums", ARRAY(Integer, dimensions=2)),
        Column("day", Date),
        Column("clock", Time),
        Column("naive", DateTime(timezone=True)),
        Column("i", Integer),
    )
