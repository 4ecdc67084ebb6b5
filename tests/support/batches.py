"""
What the tests of ``batch=`` share: a kit on PostgreSQL, MariaDB or SQLite, units built from steps,
a commit counter (SQLAlchemy's ``commit`` event), and checks of rows from another connection.

A case is ``<strategy>[-<driver>]`` as in tests/support/kits.py, plus the SQLite drivers:
``semaphore-aiosqlite``, ``chunked-aiosqlite``, ``threads-pysqlite``. Test modules import the fixtures
below by name (``bkit`` and the SQLite engine factories) so that pytest finds them.

SQLite allows one writer at a time: its runners get ``limit=1`` whatever a test asks for.
"""

from __future__ import annotations

import collections
import sqlite3
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import closing
from functools import partial
from pathlib import Path
from typing import Any

import anyio
import pytest
from sqlalchemy import create_engine, event, func, select, text
from sqlalchemy import exc as sa_exc
from sqlalchemy.engine import Engine
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession, create_async_engine
from sqlalchemy.orm import Session
from sqlalchemy.pool import NullPool

from boundeddb import RetryPolicy, is_transient
from tests.support.faults import codes_of
from tests.support.kits import Kit, eventually, parse_kind
from tests.support.models import Base, Item
from tests.support.servers import MYSQL_DRIVERS, Database, MariaDB, PostgreSQL

SQLITE_DRIVERS = frozenset({"aiosqlite", "pysqlite"})

#: Every case of the batch tests: (case, anyio backend).
PG_CASES = [
    ("semaphore", "asyncio"),
    ("semaphore-psycopg", "asyncio"),
    ("chunked", "asyncio"),
    ("threads-psycopg", "asyncio"),
    ("threads-psycopg", "trio"),
    ("threads-psycopg2", "asyncio"),
]
MARIADB_CASES = [
    ("semaphore-aiomysql", "asyncio"),
    ("chunked-asyncmy", "asyncio"),
    ("threads-pymysql", "asyncio"),
]
SQLITE_CASES = [
    ("semaphore-aiosqlite", "asyncio"),
    ("chunked-aiosqlite", "asyncio"),
    ("threads-pysqlite", "asyncio"),
]
ALL_CASES = PG_CASES + MARIADB_CASES + SQLITE_CASES
#: The cases on a server (PostgreSQL, MariaDB): those that can sleep on the server.
SERVER_CASES = PG_CASES + MARIADB_CASES
#: One case per database and runner family (an async runner, the thread runner), for what the runner
#: decides whatever the driver (when a batch starts, how far input is pulled ahead, which units a
#: batch holds, keys checked and looked up): the tests that need not run on all twelve. ALL_CASES runs
#: the drivers' side of the same paths (a batch's transaction, its failures, its cancellation).
ONE_OF_EACH = [
    ("semaphore", "asyncio"),
    ("threads-psycopg", "asyncio"),
    ("chunked-asyncmy", "asyncio"),
    ("threads-pymysql", "asyncio"),
    ("semaphore-aiosqlite", "asyncio"),
    ("threads-pysqlite", "asyncio"),
]


def server_of(case: str) -> str:
    """``"sqlite"``, ``"mariadb"`` or ``"postgresql"``: the database a case runs on."""
    driver = case.rpartition("-")[2]
    if driver in SQLITE_DRIVERS:
        return "sqlite"
    return "mariadb" if driver in MYSQL_DRIVERS else "postgresql"


_MARKS = {"postgresql": [pytest.mark.postgres], "mariadb": [pytest.mark.mysql], "sqlite": []}


def params(cases: list[tuple[str, str]]) -> list[Any]:
    """``(case, anyio_backend)`` parameters, each marked with its server (postgres, mysql, or none)."""
    return [
        pytest.param(case, backend, id=f"{case}-{backend}", marks=_MARKS[server_of(case)])
        for case, backend in cases
    ]


def sync_params(cases: list[tuple[str, str]]) -> list[Any]:
    """``case`` parameters for tests without an event loop (one per case, whatever its backend)."""
    seen = dict.fromkeys(case for case, _ in cases)
    return [pytest.param(case, id=case, marks=_MARKS[server_of(case)]) for case in seen]


def every(cases: list[tuple[str, str]] = ALL_CASES) -> pytest.MarkDecorator:
    """Parametrize a test over ``cases`` (all of them by default)."""
    return pytest.mark.parametrize(("case", "anyio_backend"), params(cases))


# -- SQLite: a file per test, a facet like the servers' ------------------------------------------------


class SqliteFile(Database):
    """The test's SQLite file, seen through the standard library's own connections."""

    name = "sqlite"
    engine_fixtures = ("make_sqlite_async_engine", "make_sqlite_sync_engine")
    integer = "CAST(:v AS INTEGER)"
    sleep = ""  # SQLite cannot sleep in a statement
    sleep_like = ""

    def __init__(self, path: Path) -> None:
        self.path = path

    def connection_ids(self) -> set[int]:
        return set()

    def statements(self, like: str = "%") -> list[tuple[int, str]]:
        return []

    def terminate(self) -> None:
        pass

    def committed_units(self) -> list[int]:
        with closing(sqlite3.connect(self.path, timeout=10)) as connection:
            return sorted(row[0] for row in connection.execute("SELECT unit FROM items"))

    def open_transactions(self) -> list[tuple[Any, ...]]:
        """A write transaction left open holds the file's RESERVED lock: BEGIN IMMEDIATE then fails."""
        with closing(sqlite3.connect(self.path, timeout=0, isolation_level=None)) as connection:
            try:
                connection.execute("BEGIN IMMEDIATE")
            except sqlite3.OperationalError as error:
                if "locked" in str(error):
                    return [("a write transaction is open", str(error))]
                raise
            connection.execute("ROLLBACK")
        return []

    def create_items(self) -> None:
        engine = create_engine(f"sqlite:///{self.path}", poolclass=NullPool)
        Base.metadata.create_all(engine)
        engine.dispose()

    def drop_items(self) -> None:
        pass  # the file is in the test's tmp_path


def _foreign_keys_on(dbapi_connection: Any, _record: Any) -> None:
    """SQLite checks foreign keys only where each connection asks it to."""
    cursor = dbapi_connection.cursor()
    cursor.execute("PRAGMA foreign_keys = ON")
    cursor.close()


@pytest.fixture(name="sqlite_file")
def sqlite_file_fixture(tmp_path: Path) -> Path:
    return tmp_path / "batches.sqlite3"


@pytest.fixture(name="make_sqlite_async_engine")
async def make_sqlite_async_engine_fixture(sqlite_file: Path) -> AsyncIterator[Any]:
    """aiosqlite engines on the test's file (foreign keys on), disposed at the end."""
    engines: list[AsyncEngine] = []

    def make(*, driver: str = "aiosqlite", **pool: Any) -> AsyncEngine:
        pool.setdefault("max_overflow", 0)
        engine = create_async_engine(f"sqlite+aiosqlite:///{sqlite_file}", **pool)
        event.listen(engine.sync_engine, "connect", _foreign_keys_on)
        engines.append(engine)
        return engine

    yield make
    for engine in engines:
        await engine.dispose()


@pytest.fixture(name="make_sqlite_sync_engine")
def make_sqlite_sync_engine_fixture(sqlite_file: Path) -> Iterator[Any]:
    """pysqlite engines on the test's file (foreign keys on), disposed at the end."""
    engines: list[Engine] = []

    def make(driver: str = "pysqlite", **pool: Any) -> Engine:
        pool.setdefault("max_overflow", 0)
        engine = create_engine(f"sqlite:///{sqlite_file}", **pool)
        event.listen(engine, "connect", _foreign_keys_on)
        engines.append(engine)
        return engine

    yield make
    for engine in engines:
        engine.dispose()


# -- the kit --------------------------------------------------------------------------------------------


class CommitCounter:
    """
    Counts the COMMITs an engine's connections send (SQLAlchemy's ``commit`` event, which fires before
    the COMMIT goes out, so a COMMIT that fails counts too), from any thread.
    """

    def __init__(self, engine: Engine | AsyncEngine | None = None) -> None:
        self.n = 0
        self._lock = threading.Lock()
        if engine is not None:
            event.listen(getattr(engine, "sync_engine", engine), "commit", self._on_commit)

    def _on_commit(self, _connection: Any) -> None:
        with self._lock:
            self.n += 1


class FakeTransient(Exception):
    """SQLite's stand-in for a transient error (it has none but lost connections): retried by policy."""


#: The key of the row every test starts with: a unit that inserts it again violates the unique key.
TAKEN = "taken"

#: A step of a unit (see BatchKit.unit): ("add", key, unit), ("flush",), ("sql", statement, params),
#: ("raise", factory), ("pause", seconds), ("call", fn), ("transient_once", i).
Step = tuple[Any, ...]


class BatchKit(Kit):
    """A Kit for one case of the batch tests, on PostgreSQL, MariaDB or SQLite."""

    def __init__(self, kind: str, db: Database, make_async_engine: Any, make_sync_engine: Any) -> None:
        super().__init__(kind, db, make_async_engine, make_sync_engine)
        #: The COMMITs of the engine of the runner made last.
        self.commits = CommitCounter()
        #: How often each unit (by its number) was executed, reruns included.
        self.executions: collections.Counter[int] = collections.Counter()
        self._lock = threading.Lock()
        self._sqlite_admin: Engine | None = None

    @property
    def writers(self) -> int:
        """How many writers the database takes at once: 1 on SQLite."""
        return 1 if self.db.name == "sqlite" else 10**6

    def runner(self, limit: int = 4, *, pool_size: int | None = None, **options: Any) -> Any:
        """A runner of this case (limit=1 on SQLite), whose engine's COMMITs ``commits`` counts."""
        limit = min(limit, self.writers)
        runner = super().runner(limit, pool_size=pool_size, **options)
        self.commits = CommitCounter(self.engine)
        return runner

    # -- the database, seen from another connection -----------------------------------------------------

    def admin(self) -> Engine:
        """An engine beside the runner's: PostgreSQL's and MariaDB's admin engines, a file's own."""
        if isinstance(self.db, MariaDB):
            return self.db.admin.execution_options(schema_translate_map={None: self.db.database})
        if isinstance(self.db, PostgreSQL):
            return self.db.admin
        if self._sqlite_admin is None:
            assert isinstance(self.db, SqliteFile)
            self._sqlite_admin = create_engine(f"sqlite:///{self.db.path}", poolclass=NullPool)
        return self._sqlite_admin

    def seed(self) -> None:
        """The row whose key the duplicate units insert again."""
        with self.admin().begin() as connection:
            connection.execute(Item.__table__.insert().values(key=TAKEN, unit=-1))

    def rows(self) -> dict[int, int]:
        """How many rows each unit committed (the seed row left out)."""
        return {unit: n for unit, n in self.db.rows_per_unit().items() if unit >= 0}

    def visible(self, i: int) -> int:
        """How many rows of unit ``i`` another connection sees now."""
        table = Item.__table__
        with self.admin().connect() as connection:
            statement = select(func.count()).select_from(table).where(table.c.unit == i)
            return int(connection.execute(statement).scalar_one())

    @property
    def supports_deferred(self) -> bool:
        """Deferred constraints: PostgreSQL and SQLite have them, MariaDB has none."""
        return self.db.name != "mariadb"

    def add_deferred_ref(self) -> None:
        """
        ``items.ref``, a foreign key to ``batch_refs`` checked only at COMMIT (DEFERRABLE INITIALLY
        DEFERRED): a row whose ``ref`` has no match inserts fine, and its transaction fails to commit.
        """
        statements = [
            "DROP TABLE IF EXISTS batch_refs" + (" CASCADE" if self.db.name == "postgresql" else ""),
            "CREATE TABLE batch_refs (id integer PRIMARY KEY)",
            "INSERT INTO batch_refs (id) VALUES (1)",
            "ALTER TABLE items ADD COLUMN ref integer "
            "REFERENCES batch_refs (id) DEFERRABLE INITIALLY DEFERRED",
        ]
        with self.admin().begin() as connection:
            for statement in statements:
                connection.execute(text(statement))

    def drop_extras(self) -> None:
        if isinstance(self.db, PostgreSQL):
            with self.db.admin.connect() as connection:
                connection.execute(text("DROP TABLE IF EXISTS batch_refs CASCADE"))
        if self._sqlite_admin is not None:
            self._sqlite_admin.dispose()

    # -- units ------------------------------------------------------------------------------------------

    def unit(self, i: int, *steps: Step, value: object = None) -> Callable[[Any], Any]:
        """A unit (async or sync, as the runner takes): counts its execution, runs ``steps``, returns 10 i."""
        result = 10 * i if value is None else value
        steps = (("count", i), *steps)
        if self.is_async:

            async def async_unit(session: AsyncSession) -> object:
                for step in steps:
                    await self._async_step(session, step)
                return result

            return async_unit

        def sync_unit(session: Session) -> object:
            for step in steps:
                self._sync_step(session, step)
            return result

        return sync_unit

    def good(self, i: int, *, flush: bool = False) -> Callable[[Any], Any]:
        """Adds row ``i`` (the COMMIT's flush sends it, unless ``flush``); returns 10 i."""
        return self.unit(i, ("add", f"k{i}", i), *([("flush",)] if flush else []))

    def raising(self, i: int) -> Callable[[Any], Any]:
        """Writes row ``i``, then raises ValueError(i)."""
        return self.unit(i, ("add", f"k{i}", i), ("flush",), ("raise", lambda: ValueError(i)))

    def duplicate(self, i: int, *, flush: bool = True) -> Callable[[Any], Any]:
        """
        Inserts the seed row's key again: with ``flush``, its own flush raises the IntegrityError;
        without, the flush that COMMIT does for the whole batch does.
        """
        return self.unit(i, ("add", TAKEN, i), *([("flush",)] if flush else []))

    def deferred_violation(self, i: int) -> Callable[[Any], Any]:
        """Inserts row ``i`` with a ``ref`` that has no match: fine until COMMIT (see add_deferred_ref)."""
        insert = "INSERT INTO items (key, unit, ref) VALUES (:key, :unit, 999)"
        return self.unit(i, ("sql", insert, {"key": f"k{i}", "unit": i}))

    def sleeper(self, i: int, seconds: float) -> Callable[[Any], Any]:
        """Writes row ``i``, then sleeps ``seconds`` on the server."""
        return self.unit(i, ("add", f"k{i}", i), ("flush",), ("sql", self.db.sleep, {"s": seconds}))

    def pair(self, i: int, pause: float, done: Callable[[int], None]) -> Callable[[Any], Any]:
        """Writes row ``i`` twice with a pause (in Python) between, then calls ``done(i)``."""
        return self.unit(
            i,
            ("add", f"k{i}a", i),
            ("flush",),
            ("pause", pause),
            ("add", f"k{i}b", i),
            ("flush",),
            ("call", lambda: done(i)),
        )

    def flaky(self, i: int) -> Callable[[Any], Any]:
        """Writes row ``i``; its first execution then fails with a transient error (``retry_policy``)."""
        return self.unit(i, ("add", f"k{i}", i), ("flush",), ("transient_once", i))

    def map_fn(self) -> Callable[..., Any]:
        """``fn(session, item)`` for map(): adds row ``item``, returns 10 item."""
        if self.is_async:

            async def fn(session: AsyncSession, item: int) -> int:
                self._count(item)
                session.add(Item(key=f"k{item}", unit=item))
                return 10 * item

            return fn

        def sync_fn(session: Session, item: int) -> int:
            self._count(item)
            session.add(Item(key=f"k{item}", unit=item))
            return 10 * item

        return sync_fn

    def retry_policy(self, attempts: int = 3) -> RetryPolicy:
        """Retries transient errors (SQLite's FakeTransient too) at once."""
        return RetryPolicy(
            attempts=attempts,
            initial_delay=0,
            jitter=False,
            retry_on=lambda error: is_transient(error) or isinstance(error, FakeTransient),
        )

    # -- steps ------------------------------------------------------------------------------------------

    def _count(self, i: int) -> int:
        with self._lock:
            self.executions[i] += 1
            return self.executions[i]

    def _transient(self) -> str | None:
        """A statement that fails with a transient error on this server (None: raise FakeTransient)."""
        if self.db.name == "postgresql":
            return "DO $$ BEGIN RAISE EXCEPTION 'forced %', '40001' USING ERRCODE = '40001'; END $$"
        if self.db.name == "mariadb":
            return "SIGNAL SQLSTATE '40001' SET MYSQL_ERRNO = 1213, MESSAGE_TEXT = 'forced deadlock'"
        return None

    def _sync_step(self, session: Session, step: Step) -> None:
        kind = step[0]
        if kind == "count":
            self._count(step[1])
        elif kind == "add":
            session.add(Item(key=step[1], unit=step[2]))
        elif kind == "flush":
            session.flush()
        elif kind == "sql":
            session.execute(text(step[1]), step[2])
        elif kind == "raise":
            raise step[1]()
        elif kind == "pause":
            time.sleep(step[1])
        elif kind == "call":
            step[1]()
        elif kind == "transient_once":
            if self.executions[step[1]] == 1:
                statement = self._transient()
                if statement is None:
                    raise FakeTransient(step[1])
                session.execute(text(statement))
        else:  # pragma: no cover
            raise AssertionError(step)

    async def _async_step(self, session: AsyncSession, step: Step) -> None:
        kind = step[0]
        if kind == "flush":
            await session.flush()
        elif kind == "sql":
            await session.execute(text(step[1]), step[2])
        elif kind == "pause":
            await anyio.sleep(step[1])
        elif kind == "transient_once":
            if self.executions[step[1]] == 1:
                statement = self._transient()
                if statement is None:
                    raise FakeTransient(step[1])
                await session.execute(text(statement))
        else:
            self._sync_step(session, step)  # type: ignore[arg-type]  # no I/O: count, add, raise, call


def violated(error: BaseException | None) -> str:
    """Which constraint an IntegrityError names, whatever the driver: "unique" or "foreign key"."""
    if not isinstance(error, sa_exc.IntegrityError):
        return f"not an IntegrityError: {type(error).__name__}: {error}"
    orig = error.orig
    args = getattr(orig, "args", ())
    if args and args[0] == 1062:  # MySQL's ER_DUP_ENTRY (its SQLSTATE, 23000, names no constraint)
        return "unique"
    code = codes_of(error)
    if code is not None:
        return {"23505": "unique", "23503": "foreign key"}.get(code, f"SQLSTATE {code}")
    message = str(orig)
    if "UNIQUE constraint failed" in message:
        return "unique"
    if "FOREIGN KEY constraint failed" in message:
        return "foreign key"
    return f"unknown: {message}"


def assert_no_leaks(kit: BatchKit) -> None:
    """No connection checked out, no transaction left open, no statement still running on the server."""
    assert kit.pool.checkedout() == 0
    assert eventually(lambda: kit.db.open_transactions() == [], 5), kit.db.open_transactions()
    assert eventually(lambda: kit.db.running() == 0, 10), kit.db.statements()


@pytest.fixture(name="bkit")
def bkit_fixture(case: str, request: pytest.FixtureRequest) -> Iterator[BatchKit]:
    """A BatchKit for the test's ``case``, with a fresh items table holding the seed row only."""
    server = server_of(case)
    db: Database
    if server == "sqlite":
        db = SqliteFile(request.getfixturevalue("sqlite_file"))
    else:
        db = request.getfixturevalue("mysql_db" if server == "mariadb" else "pg_db")
    strategy, driver = parse_kind(case)
    async_fixture, sync_fixture = db.engine_fixtures
    make_async = None
    if strategy != "threads":  # the async engine factories are asyncio-only fixtures
        make_async = request.getfixturevalue(async_fixture)
        if driver == "asyncpg":  # no SSLRequest probe: a cancelled connect leaves no stray error
            make_async = partial(make_async, ssl=False)
    kit = BatchKit(case, db, make_async, request.getfixturevalue(sync_fixture))
    db.create_items()
    kit.seed()
    yield kit
    db.terminate()  # a connection leaked in a transaction would block DROP TABLE
    db.drop_items()
    kit.drop_extras()


__all__ = [
    "ALL_CASES",
    "MARIADB_CASES",
    "ONE_OF_EACH",
    "PG_CASES",
    "SERVER_CASES",
    "SQLITE_CASES",
    "TAKEN",
    "BatchKit",
    "CommitCounter",
    "FakeTransient",
    "SqliteFile",
    "assert_no_leaks",
    "bkit_fixture",
    "every",
    "make_sqlite_async_engine_fixture",
    "make_sqlite_sync_engine_fixture",
    "params",
    "server_of",
    "sqlite_file_fixture",
    "sync_params",
    "violated",
]
