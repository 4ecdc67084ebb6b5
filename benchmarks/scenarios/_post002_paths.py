"""
The code paths post 002 timed, one function per path, each returning a :class:`Timing` of its loop.

``post002_mysql_sync_vs_async.py`` says what each reproduces and how the scenario runs them.
Each ``*_test`` function
returns ``measure(ctx, sqls)``: it builds its engine or pool (an aiomysql pool before the clock
starts, as the post does; a SQLAlchemy engine connects lazily, inside the timed loop, as the post's
did), times the loop over ``sqls``, then reads the ``@@autocommit`` its connections ran with.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Engine, create_engine, event
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker, create_async_engine
from sqlalchemy.orm import Session, sessionmaker

from boundeddb import SemaphoreRunner, ThreadOffloadRunner

from ..db.mysql import MySQLDatabase
from ..db.schema import SCHEMA
from ..harness import Context

#: The post's pool sizes and recycle time.
POOL_MIN_SIZE = 100
POOL_RECYCLE = 3600
#: How long the default-pool check waits for the 11th connection.
ACQUIRE_WAIT_S = 3.0
#: A measurement that takes longer than this is recorded as failed.
MEASUREMENT_TIMEOUT_S = 120.0


@dataclass
class Timing:
    """What one measurement of one variant saw."""

    wall_s: float
    cpu_s: float
    latencies: list[float]
    connections: int
    autocommit: int | None = None


# -- the sync side: SQLAlchemy engines ------------------------------------------------------------


def _sync_engine(ctx: Context, driver: str, *, query: str = "") -> tuple[Engine, list[int]]:
    """The post's engine (``pool_size=100, pool_recycle=3600``) and a counter of connections it opens."""
    url = ctx.db.url.set(drivername=f"mysql+{driver}", database=SCHEMA)
    if query:
        url = url.update_query_string(query)
    engine = create_engine(url, pool_size=POOL_MIN_SIZE, pool_recycle=POOL_RECYCLE)
    opened = [0]
    event.listen(engine, "connect", lambda *_: opened.__setitem__(0, opened[0] + 1))
    return engine, opened


def _session_autocommit(engine: Engine) -> int:
    with engine.connect() as conn:
        return int(conn.exec_driver_sql("SELECT @@autocommit").scalar_one())


def sa_test(
    driver: str, *, query: str = "", transaction: bool = False
) -> Callable[[Context, list[str]], Timing]:
    """
    The post's sync side, 100 times: connect, execute, (1.4's autocommit: commit,) close in test 1;
    connect, begin, execute, commit, close in test 2 (``transaction``).
    """

    def measure(ctx: Context, sqls: list[str]) -> Timing:
        engine, opened = _sync_engine(ctx, driver, query=query)
        latencies: list[float] = []
        try:
            cpu0, t0 = time.process_time(), time.perf_counter()
            for sql in sqls:
                start = time.perf_counter()
                conn = engine.connect()
                if transaction:
                    trans = conn.begin()
                    conn.exec_driver_sql(sql)
                    trans.commit()
                else:
                    conn.exec_driver_sql(sql)
                    conn.commit()
                conn.close()
                latencies.append(time.perf_counter() - start)
            wall, cpu = time.perf_counter() - t0, time.process_time() - cpu0
            return Timing(wall, cpu, latencies, opened[0], _session_autocommit(engine))
        finally:
            engine.dispose()

    return measure


# -- the async side: aiomysql pools ---------------------------------------------------------------


def require_mysql(ctx: Context) -> MySQLDatabase:
    if not isinstance(ctx.db, MySQLDatabase):
        raise RuntimeError("post-002 runs on MySQL/MariaDB: add --database mysql")
    return ctx.db


async def _pool(ctx: Context, **kw: Any) -> Any:
    import aiomysql

    args = require_mysql(ctx).connect_args(database=SCHEMA)
    return await aiomysql.create_pool(**args, pool_recycle=POOL_RECYCLE, **kw)


async def _pool_autocommit(pool: Any) -> int:
    conn = await pool.acquire()
    try:
        async with conn.cursor() as cur:
            await cur.execute("SELECT @@autocommit")
            row = await cur.fetchone()
        return int(row[0])
    finally:
        pool.release(conn)


def aiomysql_test(
    *, transaction: bool, returned: bool, **pool_kw: Any
) -> Callable[[Context, list[str]], Timing]:
    """
    The post's aiomysql loops: acquire, (begin,) cursor, execute, (commit,) and, when ``returned``,
    close the cursor and release the connection; the pool is made before the clock starts.
    """

    async def body(ctx: Context, sqls: list[str]) -> Timing:
        pool = await _pool(ctx, **pool_kw)
        kept: list[Any] = []
        threads: set[int] = set()
        latencies: list[float] = []
        try:
            cpu0, t0 = time.process_time(), time.perf_counter()
            for sql in sqls:
                start = time.perf_counter()
                conn = await pool.acquire()
                if transaction:
                    await conn.begin()
                cur = await conn.cursor()
                await cur.execute(sql)
                if transaction:
                    await conn.commit()
                if returned:
                    await cur.close()
                    pool.release(conn)
                else:
                    kept.append(conn)
                threads.add(conn.server_thread_id[0])
                latencies.append(time.perf_counter() - start)
            wall, cpu = time.perf_counter() - t0, time.process_time() - cpu0
            for conn in kept:  # the post's process ended here; the server rolls back what is open
                conn.close()
            kept.clear()
            autocommit = await _pool_autocommit(pool)
            return Timing(wall, cpu, latencies, len(threads), autocommit)
        finally:
            for conn in kept:
                conn.close()
            pool.terminate()
            await pool.wait_closed()

    def measure(ctx: Context, sqls: list[str]) -> Timing:
        return asyncio.run(asyncio.wait_for(body(ctx, sqls), MEASUREMENT_TIMEOUT_S))

    return measure


async def default_pool_check(ctx: Context, sqls: list[str]) -> dict[str, Any]:
    """
    The post's "pool not returned" loop as written (aiomysql's default ``maxsize=10``): how many
    inserts it does before an ``acquire()`` waits longer than :data:`ACQUIRE_WAIT_S`.
    """
    pool = await _pool(ctx, autocommit=False)
    kept: list[Any] = []
    try:
        for i, sql in enumerate(sqls):
            try:
                conn = await asyncio.wait_for(_acquire(pool), ACQUIRE_WAIT_S)
            except asyncio.TimeoutError:
                return {
                    "maxsize": pool.maxsize,
                    "inserts_done": i,
                    "blocked_at": i + 1,
                    "waited_s": ACQUIRE_WAIT_S,
                }
            kept.append(conn)
            cur = await conn.cursor()
            await cur.execute(sql)
        return {"maxsize": pool.maxsize, "inserts_done": len(sqls), "blocked_at": None, "waited_s": 0.0}
    finally:
        for conn in kept:
            conn.close()
        pool.terminate()
        await pool.wait_closed()


async def _acquire(pool: Any) -> Any:
    return await pool.acquire()


# -- boundeddb's runners on the same inserts ------------------------------------------------------


def semaphore_test(limit: int) -> Callable[[Context, list[str]], Timing]:
    """``SemaphoreRunner(limit)`` on aiomysql: one unit per insert, each in its own transaction."""

    async def body(ctx: Context, sqls: list[str]) -> Timing:
        url = ctx.db.url.set(drivername="mysql+aiomysql", database=SCHEMA)
        engine = create_async_engine(url, pool_size=limit, max_overflow=0, pool_recycle=POOL_RECYCLE)
        opened = [0]
        event.listen(engine.sync_engine, "connect", lambda *_: opened.__setitem__(0, opened[0] + 1))

        def unit(sql: str) -> Callable[[AsyncSession], Awaitable[None]]:
            async def insert(session: AsyncSession) -> None:
                await (await session.connection()).exec_driver_sql(sql)

            return insert

        try:
            async with SemaphoreRunner(async_sessionmaker(engine), limit=limit) as runner:
                units = [unit(sql) for sql in sqls]
                cpu0, t0 = time.process_time(), time.perf_counter()
                report = await runner.run(units)
                wall, cpu = time.perf_counter() - t0, time.process_time() - cpu0
            async with engine.connect() as conn:
                autocommit = int((await conn.exec_driver_sql("SELECT @@autocommit")).scalar_one())
            latencies = [o.latency_s for o in report.outcomes]
            return Timing(wall, cpu, latencies, opened[0], autocommit)
        finally:
            await engine.dispose()

    def measure(ctx: Context, sqls: list[str]) -> Timing:
        return asyncio.run(asyncio.wait_for(body(ctx, sqls), MEASUREMENT_TIMEOUT_S))

    return measure


def threads_test(driver: str, limit: int) -> Callable[[Context, list[str]], Timing]:
    """``ThreadOffloadRunner(limit).run_sync`` on ``driver``: one unit per insert, in its own transaction."""

    def measure(ctx: Context, sqls: list[str]) -> Timing:
        url = ctx.db.url.set(drivername=f"mysql+{driver}", database=SCHEMA)
        engine = create_engine(url, pool_size=limit, max_overflow=0, pool_recycle=POOL_RECYCLE)
        opened = [0]
        event.listen(engine, "connect", lambda *_: opened.__setitem__(0, opened[0] + 1))

        def unit(sql: str) -> Callable[[Session], None]:
            def insert(session: Session) -> None:
                session.connection().exec_driver_sql(sql)

            return insert

        try:
            with ThreadOffloadRunner(sessionmaker(engine), limit=limit) as runner:
                units = [unit(sql) for sql in sqls]
                cpu0, t0 = time.process_time(), time.perf_counter()
                report = runner.run_sync(units)
                wall, cpu = time.perf_counter() - t0, time.process_time() - cpu0
            latencies = [o.latency_s for o in report.outcomes]
            return Timing(wall, cpu, latencies, opened[0], _session_autocommit(engine))
        finally:
            engine.dispose()

    return measure


def sync_driver() -> str:
    """mysqlclient, as the post's ``mysql://``, where it is installed; else pymysql."""
    try:
        import MySQLdb  # noqa: F401
    except ImportError:
        return "pymysql"
    return "mysqldb"
