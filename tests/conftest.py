"""
Fixtures: a real PostgreSQL (a database per test process, a schema in it), a MariaDB/MySQL (a database
per test), SQLite files, engines, samplers, the contract kit; and the soak (``BOUNDEDDB_SOAK=N`` runs
every collected test N times). Helpers that are not fixtures live in ``tests/support/``.

The suite runs side by side in pytest-xdist workers (``nox -s tests``: ``pytest -n 4``). Each worker
is independent: its own PostgreSQL database, a MariaDB database per test, its own ports
(tests/support/ports.py). The controller finds the PostgreSQL server once (an embedded one is
started once, for all workers) and hands its URL to the workers.
"""

from __future__ import annotations

import contextlib
import dataclasses
import gc
import os
import secrets
from collections.abc import AsyncIterator, Iterator
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
from sqlalchemy import create_engine, text
from sqlalchemy.engine import URL, Engine, make_url
from sqlalchemy.ext.asyncio import AsyncEngine, async_sessionmaker, create_async_engine
from sqlalchemy.orm import sessionmaker
from sqlalchemy.pool import NullPool

from boundeddb.testing import PostgresServer, driver_url, postgres
from tests.support.kits import Kit
from tests.support.models import Base
from tests.support.servers import Database, MariaDB, PostgreSQL, database_of
from tests.support.soak import soak_rounds

if TYPE_CHECKING:
    from tests.support.probes import PeakSampler


def _xdist_controller(config: pytest.Config) -> bool:
    """Whether this process hands tests to pytest-xdist workers (``-n N``, N > 0) and runs none itself."""
    return not hasattr(config, "workerinput") and bool(getattr(config.option, "numprocesses", None))


def pytest_configure(config: pytest.Config) -> None:
    """
    In the xdist controller, find the PostgreSQL server once (``postgres()``: the environment's, the
    local one, else an embedded one that lives until the run ends) and give its URL to the workers,
    which start after this hook, through ``BOUNDEDDB_TEST_DATABASE_URL``.
    """
    if not _xdist_controller(config):
        return
    stack = contextlib.ExitStack()
    server = stack.enter_context(postgres())
    config.stash[_SERVER_STACK] = stack
    if server.source != "env":
        os.environ["BOUNDEDDB_TEST_DATABASE_URL"] = server.url.render_as_string(hide_password=False)


def pytest_unconfigure(config: pytest.Config) -> None:
    """Stop the controller's embedded server, if it started one."""
    stack = config.stash.get(_SERVER_STACK, None)
    if stack is not None:
        stack.close()


_SERVER_STACK = pytest.StashKey[contextlib.ExitStack]()


@pytest.fixture(scope="session")
def pg_server() -> Iterator[PostgresServer]:
    """
    The PostgreSQL server, at a database of this test process's own: created here, dropped (with
    whatever is still connected to it) when the process's tests end.
    """
    with postgres() as server:
        database = f"bdbt_{os.environ.get('PYTEST_XDIST_WORKER', 'main')}_{secrets.token_hex(3)}"
        admin_url = driver_url(server.url, "psycopg")
        admin = create_engine(admin_url, isolation_level="AUTOCOMMIT", poolclass=NullPool)
        with admin.connect() as connection:
            connection.execute(text(f"CREATE DATABASE {database}"))
        try:
            yield dataclasses.replace(server, url=server.url.set(database=database))
        finally:
            with admin.connect() as connection:
                connection.execute(text(f"DROP DATABASE {database} WITH (FORCE)"))
            admin.dispose()


@pytest.fixture(scope="session")
def pg_schema(pg_server: PostgresServer) -> Iterator[str]:
    """A schema of this test run's own, dropped at the end."""
    schema = f"bdb_{os.getpid()}_{secrets.token_hex(3)}"
    admin = create_engine(driver_url(pg_server.url, "psycopg"), isolation_level="AUTOCOMMIT")
    with admin.connect() as connection:
        connection.execute(text(f"CREATE SCHEMA {schema}"))
    try:
        yield schema
    finally:
        with admin.connect() as connection:
            connection.execute(text(f"DROP SCHEMA {schema} CASCADE"))
        admin.dispose()


@pytest.fixture
def app_name() -> str:
    """A unique application_name, so a probe can count this test's backends and nothing else."""
    return f"bdbt-{secrets.token_hex(4)}"


def _sync_connect_args(schema: str, app: str) -> dict[str, Any]:
    return {"options": f"-c search_path={schema}", "application_name": app}


@pytest.fixture
def pg_url(pg_server: PostgresServer) -> URL:
    return pg_server.url


@pytest.fixture
async def make_async_engine(pg_server: PostgresServer, pg_schema: str, app_name: str) -> AsyncIterator[Any]:
    engines: list[AsyncEngine] = []

    def make(*, ssl: bool | None = None, driver: str = "asyncpg", **pool: Any) -> AsyncEngine:
        pool.setdefault("pool_size", 10)
        pool.setdefault("max_overflow", 0)
        connect_args: dict[str, Any]
        if driver == "psycopg":  # psycopg 3's async driver: libpq options, like the sync engines
            connect_args = _sync_connect_args(pg_schema, app_name)
        else:
            connect_args = {"server_settings": {"search_path": pg_schema, "application_name": app_name}}
            if ssl is not None:  # ssl=False: no SSLRequest probe (see cancel_kit)
                connect_args["ssl"] = ssl
        url = driver_url(pg_server.url, driver)  # type: ignore[arg-type]
        engine = create_async_engine(url, connect_args=connect_args, **pool)
        engines.append(engine)
        return engine

    yield make
    for engine in engines:
        await engine.dispose()


@pytest.fixture
def make_sync_engine(pg_server: PostgresServer, pg_schema: str, app_name: str) -> Iterator[Any]:
    engines: list[Engine] = []

    def make(driver: str = "psycopg", **pool: Any) -> Engine:
        pool.setdefault("pool_size", 10)
        pool.setdefault("max_overflow", 0)
        engine = create_engine(
            driver_url(pg_server.url, driver),  # type: ignore[arg-type]
            connect_args=_sync_connect_args(pg_schema, app_name),
            **pool,
        )
        engines.append(engine)
        return engine

    yield make
    for engine in engines:
        engine.dispose()


@pytest.fixture(scope="session")
def admin(pg_server: PostgresServer, pg_schema: str) -> Iterator[Engine]:
    """
    A separate psycopg engine for looking at the server from outside the runner: one per test process,
    its connections kept (a new PostgreSQL connection costs the server about 8 ms of CPU).
    """
    engine = create_engine(
        driver_url(pg_server.url, "psycopg"),
        isolation_level="AUTOCOMMIT",
        connect_args=_sync_connect_args(pg_schema, "bdbt-admin"),
        pool_size=4,
    )
    yield engine
    engine.dispose()


@pytest.fixture
def items_table(db: Database) -> Iterator[None]:
    """The items table (Item), new for the test, on the server of the test's kind."""
    db.create_items()
    yield
    db.drop_items()


@pytest.fixture
def reap_backends(db: Database) -> Iterator[None]:
    """At teardown, terminate this test's backends: a leaked one in a transaction would block DROP TABLE."""
    yield
    db.terminate()


@pytest.fixture
def sampler(db: Database) -> PeakSampler:
    """Samples this test's open connections on the server of its kind (pg_stat_activity, processlist)."""
    return db.sampler()


# -- the soak: BOUNDEDDB_SOAK=N runs each collected test N times (nox -s soak) ---------------------------


@pytest.fixture
def soak_round(request: pytest.FixtureRequest) -> int:
    """The round of this run of the test in a soak: 1 to ``BOUNDEDDB_SOAK``."""
    return int(request.param)


@pytest.hookimpl(trylast=True)
def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """With ``BOUNDEDDB_SOAK=N`` (N > 1), each test runs N times, as ``test[...-soak3of30]``."""
    rounds = soak_rounds()
    if rounds > 1:
        metafunc.fixturenames.append("soak_round")
        metafunc.parametrize(
            "soak_round", range(1, rounds + 1), indirect=True, ids=lambda r: f"soak{r}of{rounds}"
        )


# -- MariaDB / MySQL: a database per test ---------------------------------------------------------------


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """
    Mark each case of a kind with its server: ``mysql`` for a MySQL driver's, else ``postgres``. Then put
    the ``slow`` tests first, in their order: side by side, a long test that starts last is what the
    other workers wait for at the end.
    """
    for item in items:
        callspec = getattr(item, "callspec", None)
        kind = callspec.params.get("kind") if callspec is not None else None
        if isinstance(kind, str):
            item.add_marker(pytest.mark.mysql if database_of(kind) == "mariadb" else pytest.mark.postgres)
    items.sort(key=lambda item: item.get_closest_marker("slow") is None)


MYSQL_DEFAULT_URL = "mysql://root@127.0.0.1:3306/test"


def _mysql_answers(url: URL) -> bool:
    import pymysql

    try:
        pymysql.connect(
            host=url.host,
            port=url.port or 3306,
            user=url.username,
            password=url.password or "",
            connect_timeout=3,
        ).close()
    except Exception:
        return False
    return True


@pytest.fixture(scope="session")
def mysql_server() -> URL:
    """
    ``$BOUNDEDDB_TEST_MYSQL_URL`` (default: the local MariaDB), or a skip with one reason where no server
    answers or the drivers are missing (``.ci/run`` starts the local MariaDB and fails if it cannot).
    """
    for module in ("pymysql", "aiomysql", "asyncmy"):
        pytest.importorskip(module, reason="the MySQL drivers are in the test extra (boundeddb[mysql])")
    url = make_url(os.environ.get("BOUNDEDDB_TEST_MYSQL_URL", MYSQL_DEFAULT_URL)).set(drivername="mysql")
    if not _mysql_answers(url):
        pytest.skip(
            f"no MySQL/MariaDB server answers at {url.render_as_string(hide_password=True)} "
            "(set BOUNDEDDB_TEST_MYSQL_URL; .ci/run starts the local MariaDB)"
        )
    return url


@pytest.fixture
def mysql_db(mysql_server: URL) -> Iterator[MariaDB]:
    """
    A database of this test's own on the MySQL server (its runners' engines connect to it), dropped at the
    end, after its connections are killed: a leaked transaction would make DROP DATABASE wait.
    """
    database = f"bdbt_{secrets.token_hex(4)}"
    admin = create_engine(
        mysql_server.set(drivername="mysql+pymysql", database=None), isolation_level="AUTOCOMMIT", pool_size=2
    )
    with admin.connect() as connection:
        connection.execute(text(f"CREATE DATABASE `{database}`"))
    mysql = MariaDB(mysql_server, admin, database)
    try:
        yield mysql
    finally:
        mysql.terminate()
        with admin.connect() as connection:
            connection.execute(text("SET SESSION lock_wait_timeout = 30"))
            connection.execute(text(f"DROP DATABASE `{database}`"))
        admin.dispose()


@pytest.fixture
async def make_mysql_async_engine(mysql_db: MariaDB) -> AsyncIterator[Any]:
    """Async engines (aiomysql, asyncmy) on this test's MySQL database, disposed at the end."""
    engines: list[AsyncEngine] = []

    def make(*, driver: str, **pool: Any) -> AsyncEngine:
        pool.setdefault("pool_size", 10)
        pool.setdefault("max_overflow", 0)
        engine = create_async_engine(mysql_db.url(driver), **pool)
        engines.append(engine)
        return engine

    yield make
    for engine in engines:
        await engine.dispose()


@pytest.fixture
def make_mysql_sync_engine(mysql_db: MariaDB) -> Iterator[Any]:
    """Sync engines (pymysql) on this test's MySQL database, disposed at the end."""
    engines: list[Engine] = []

    def make(driver: str = "pymysql", **pool: Any) -> Engine:
        if "poolclass" not in pool:
            pool.setdefault("pool_size", 10)
            pool.setdefault("max_overflow", 0)
        engine = create_engine(mysql_db.url(driver), **pool)
        engines.append(engine)
        return engine

    yield make
    for engine in engines:
        engine.dispose()


# -- the server of a test's kind ------------------------------------------------------------------------


@pytest.fixture
def pg_db(admin: Engine, app_name: str) -> PostgreSQL:
    """The PostgreSQL facet: this test's backends are those with its application_name."""
    return PostgreSQL(admin, app_name)


@pytest.fixture
def db(request: pytest.FixtureRequest) -> Database:
    """
    The server of the test's parametrized ``kind`` (tests/support/servers.py): MariaDB for a kind on a MySQL
    driver (``"semaphore-asyncmy"``), PostgreSQL for the others and for a test without a kind.
    """
    callspec = getattr(request.node, "callspec", None)
    kind = callspec.params.get("kind") if callspec is not None else None
    mysql = isinstance(kind, str) and database_of(kind) == "mariadb"
    database: Database = request.getfixturevalue("mysql_db" if mysql else "pg_db")
    return database


# -- the contract kit: a runner of the parametrized ``kind`` and units of its shape (support/kits.py) -----


def _make_kit(kind: str, request: pytest.FixtureRequest, db: Database, **async_options: Any) -> Kit:
    async_fixture, sync_fixture = db.engine_fixtures
    # The async engine factory is an asyncio-only fixture: ask for it only where it is needed.
    async_factory = None
    if not kind.startswith("threads"):
        async_factory = request.getfixturevalue(async_fixture)
        if async_options:
            async_factory = partial(async_factory, **async_options)
    return Kit(kind, db, async_factory, request.getfixturevalue(sync_fixture))


@pytest.fixture
def kit(kind: str, request: pytest.FixtureRequest, db: Database) -> Kit:
    """A Kit for the test's parametrized ``kind`` (tests.support.kits.CASES), on the server of that kind."""
    return _make_kit(kind, request, db)


@pytest.fixture
def cancel_kit(kind: str, request: pytest.FixtureRequest, db: Database) -> Kit:
    """
    A Kit whose async engines use asyncpg's ``ssl=False`` (the test server has no TLS).

    With its default sslmode=prefer, asyncpg opens each connection with an SSLRequest probe; a connect
    cancelled during the probe leaves a "Future exception was never retrieved: ConnectionError:
    unexpected connection_lost() call" for the event loop to report (asyncpg's TLSUpgradeProto,
    MagicStack/asyncpg#1211 and #1310). That is the driver's noise, not boundeddb's: turn the probe off
    where a test cancels units that may be connecting. (The MySQL drivers have no such probe.)
    """
    return _make_kit(kind, request, db, **({"ssl": False} if db.name == "postgresql" else {}))


def pytest_collection_finish(session: pytest.Session) -> None:
    """
    Freeze what the imports and the collection made (``gc.freeze()``): a ``gc.collect()`` in a test
    (:func:`collect_garbage`) then looks only at what the tests made since, in microseconds instead of
    the 0.1-0.3 s that a full collection of this process takes.

    Hypothesis is imported first: imported later, as its plugin does for its summary, it would look for
    trio's random generator among the referrers ``gc`` tracks, and frozen objects are not among them.
    """
    import hypothesis  # noqa: F401

    gc.collect()
    gc.freeze()


@pytest.fixture
def collect_garbage() -> Iterator[None]:
    """Collect garbage as each test ends: a leaked connection then fails its own test, not a later one."""
    yield
    gc.collect()


@pytest.fixture
def sqlite_path(tmp_path: Path) -> Path:
    return tmp_path / "boundeddb.sqlite3"


@pytest.fixture
async def sqlite_async(sqlite_path: Path) -> AsyncIterator[async_sessionmaker[Any]]:
    engine = create_async_engine(f"sqlite+aiosqlite:///{sqlite_path}", pool_size=4, max_overflow=0)
    async with engine.begin() as connection:
        await connection.run_sync(Base.metadata.create_all)
    yield async_sessionmaker(engine)
    await engine.dispose()


@pytest.fixture
def sqlite_sync(sqlite_path: Path) -> Iterator[sessionmaker[Any]]:
    engine = create_engine(f"sqlite:///{sqlite_path}", pool_size=4, max_overflow=0)
    Base.metadata.create_all(engine)
    yield sessionmaker(engine)
    engine.dispose()
