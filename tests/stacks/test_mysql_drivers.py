"""
The MySQL driver behaviours boundeddb guards against (docs/how-to/mysql.md lists them), and the guards
that need no server.

``?autocommit=...`` in a MySQL engine's URL is refused when a runner is made: SQLAlchemy passes the
URL's text to the driver, and every MySQL driver takes any non-empty string as true, so
``?autocommit=false`` (or ``=0``) switches autocommit *on*, each statement commits by itself, and a
failed unit's earlier statements stay committed.  The drivers' own behaviours are checked against the
local MariaDB where one answers (as ``tests/stacks/test_mysql.py``): if a driver changes, the test that fails
says which line of the how-to is out of date.
"""

from __future__ import annotations

import asyncio
import os
from typing import Any

import pytest
from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url
from sqlalchemy.ext.asyncio import async_sessionmaker, create_async_engine
from sqlalchemy.orm import sessionmaker

from boundeddb import ChunkedRunner, SemaphoreRunner, ThreadOffloadRunner

pymysql = pytest.importorskip("pymysql", reason="the MySQL drivers are in the test extra (boundeddb[mysql])")
aiomysql = pytest.importorskip(
    "aiomysql", reason="the MySQL drivers are in the test extra (boundeddb[mysql])"
)
asyncmy = pytest.importorskip("asyncmy", reason="the MySQL drivers are in the test extra (boundeddb[mysql])")

SERVER = make_url(os.environ.get("BOUNDEDDB_TEST_MYSQL_URL", "mysql://root@127.0.0.1:3306/test"))
REFUSED = (
    r"^the engine's URL sets autocommit=(false|0|true): SQLAlchemy passes that text to the MySQL driver, "
    r"which takes any non-empty string as true, .* isolation_level='AUTOCOMMIT'\)$"
)


def _runner(kind: str, url: str) -> Any:
    if kind == "threads":
        return ThreadOffloadRunner(sessionmaker(create_engine(url)), limit=2)
    sessions = async_sessionmaker(create_async_engine(url))
    return (
        SemaphoreRunner(sessions, limit=2) if kind == "semaphore" else ChunkedRunner(sessions, chunk_size=2)
    )


@pytest.mark.parametrize("value", ["false", "0", "true"])
@pytest.mark.parametrize(
    ("kind", "driver"),
    [("threads", "pymysql"), ("semaphore", "aiomysql"), ("semaphore", "asyncmy"), ("chunked", "aiomysql")],
)
def test_an_autocommit_in_the_url_is_refused(kind: str, driver: str, value: str) -> None:
    """Every runner on every MySQL driver refuses ?autocommit=..., whatever its value, and says why."""
    with pytest.raises(ValueError, match=REFUSED):
        _runner(kind, f"mysql+{driver}://root@127.0.0.1:3306/test?autocommit={value}")


def test_isolation_level_autocommit_is_left_to_the_user() -> None:
    """create_engine(isolation_level='AUTOCOMMIT'), which SQLAlchemy knows about, is not refused."""
    engine = create_engine("mysql+pymysql://root@127.0.0.1:3306/test", isolation_level="AUTOCOMMIT")
    ThreadOffloadRunner(sessionmaker(engine), limit=2)


def _answers() -> bool:
    try:
        pymysql.connect(
            host=SERVER.host, port=SERVER.port or 3306, user=SERVER.username, connect_timeout=3
        ).close()
    except Exception:
        return False
    return True


needs_server = pytest.mark.skipif(
    not _answers(), reason="no MySQL/MariaDB server answers (set BOUNDEDDB_TEST_MYSQL_URL)"
)


def _connect_args() -> dict[str, Any]:
    return {
        "host": SERVER.host,
        "port": SERVER.port or 3306,
        "user": SERVER.username,
        "password": SERVER.password or "",
    }


@needs_server
@pytest.mark.parametrize("value", ["false", "0"])
def test_the_driver_takes_autocommit_false_for_true(value: str) -> None:
    """Why the refusal: with ?autocommit=false in the URL, pymysql's session runs with @@autocommit = 1."""
    engine = create_engine(SERVER.set(drivername="mysql+pymysql").update_query_dict({"autocommit": value}))
    try:
        with engine.connect() as conn:
            assert conn.execute(text("SELECT @@autocommit")).scalar_one() == 1
    finally:
        engine.dispose()


@needs_server
@pytest.mark.parametrize("driver", ["aiomysql", "asyncmy"])
def test_a_connection_cancelled_mid_statement_refuses_its_next_query(driver: str) -> None:
    """aiomysql 0.3 and asyncmy 0.2.12+ close a connection cancelled mid-reply (asyncmy#103)."""

    async def scenario() -> str:
        if driver == "aiomysql":
            conn = await aiomysql.connect(**_connect_args(), db=SERVER.database)
        else:
            conn = await asyncmy.connect(**_connect_args(), database=SERVER.database)

        async def slow() -> None:
            async with conn.cursor() as cursor:
                await cursor.execute("SELECT SLEEP(0.5), 'slow'")

        task = asyncio.ensure_future(slow())
        await asyncio.sleep(0.1)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        try:
            async with conn.cursor() as cursor:
                await cursor.execute("SELECT 'next'")
                return repr(await cursor.fetchall())
        except Exception as error:
            return type(error).__name__
        finally:
            conn.close()

    assert asyncio.run(scenario()) == "InterfaceError"


@needs_server
def test_aiomysql_pool_closes_a_connection_released_inside_a_transaction() -> None:
    """create_pool(autocommit=False): a connection released after an INSERT, uncommitted, is closed."""

    async def scenario() -> tuple[bool, int]:
        pool = await aiomysql.create_pool(**_connect_args(), db=SERVER.database, autocommit=False)
        try:
            conn = await pool.acquire()
            async with conn.cursor() as cursor:
                await cursor.execute("CREATE TEMPORARY TABLE bdb_release (n int)")
                await cursor.execute("INSERT INTO bdb_release VALUES (1)")
            pool.release(conn)
            return conn.closed, pool.freesize
        finally:
            pool.close()
            await pool.wait_closed()

    assert asyncio.run(scenario()) == (True, 0)


@needs_server
def test_aiomysql_default_pool_waits_for_ever_for_an_eleventh_connection() -> None:
    """aiomysql's default pool holds 10 connections and acquire() has no timeout (post 002's loop)."""

    async def scenario() -> int:
        pool = await aiomysql.create_pool(**_connect_args(), db=SERVER.database)
        held = [await pool.acquire() for _ in range(10)]
        try:
            with pytest.raises(asyncio.TimeoutError):
                await asyncio.wait_for(_acquire(pool), 0.5)
            return len(held)
        finally:
            pool.terminate()
            await pool.wait_closed()

    assert asyncio.run(scenario()) == 10


async def _acquire(pool: Any) -> Any:
    return await pool.acquire()
