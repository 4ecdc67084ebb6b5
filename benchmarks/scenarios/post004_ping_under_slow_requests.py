"""
``post-004``: post 004's experiment, 100 slow requests and 100 ``/ping`` at once.

On SQLite and on PostgreSQL, with inline ``AsyncSession`` against ``ThreadOffloadRunner.submit``.

Post 004 served a FastAPI app on SQLite (aiosqlite) with a table of 1,000,000 todos and sent 100
requests to an endpoint that counts them with ``AsyncSession`` and 100 to ``/ping`` at once:
``/ping`` took about 12 s, as long as the database requests.  Here a Starlette app (in this process,
on uvicorn, as the ``loop-lag`` scenario serves it) has ``/ping`` and ``/count``; the load comes from
``benchmarks.workers.loadgen burst`` in a process of its own.  ``/count`` runs
``SELECT count(*) FROM todos WHERE completed = 0 AND title LIKE '%9%'`` over :data:`ROWS` rows
(:data:`QUICK_ROWS` under ``--quick``):

* **inline** — ``async with sessions() as session: await session.execute(...)`` (aiosqlite, asyncpg);
* **offload** — ``await runner.submit(unit)`` on a :class:`boundeddb.ThreadOffloadRunner` of
  :data:`LIMIT` (pysqlite, psycopg);
* **control** — the post's ``/ping-with-async-sleep``: ``asyncio.sleep(CONTROL_SLEEP_S)``, no
  database: what 200 requests at once cost ``/ping`` when nothing blocks the loop.

SQLite gets a database file of its own in a temporary directory; PostgreSQL a ``todos`` table in
the suite's schema.  Each variant reports the min/mean/max of ``/count`` and of ``/ping``.
"""

from __future__ import annotations

import asyncio
import sqlite3
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from sqlalchemy import create_engine, text
from sqlalchemy.ext.asyncio import async_sessionmaker, create_async_engine
from sqlalchemy.orm import Session, sessionmaker
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from boundeddb import ThreadOffloadRunner

from ..db.schema import SCHEMA
from ..harness import Context
from ..measurement import Measurement
from ..scenario import Scenario
from . import _web as web

GROUP = "post-004"
ROWS, QUICK_ROWS = 1_000_000, 100_000
REQUESTS = 100
LIMIT = 4
#: The control variant's /count: an asyncio.sleep of this long instead of a query.
CONTROL_SLEEP_S = 0.5
COUNT_SQL = "SELECT count(*) FROM {table} WHERE completed = 0 AND title LIKE '%9%'"


def _sqlite_file(directory: Path, rows: int) -> Path:
    path = directory / "todos.db"
    with sqlite3.connect(path) as conn:
        conn.execute(
            "CREATE TABLE todos (id INTEGER PRIMARY KEY, title TEXT NOT NULL, completed INTEGER NOT NULL)"
        )
        conn.executemany(
            "INSERT INTO todos (title, completed) VALUES (?, ?)", ((f"todo {i}", i % 2) for i in range(rows))
        )
    return path


def _postgres_table(ctx: Context, rows: int) -> None:
    with ctx.db.connect() as conn:
        conn.execute(f"CREATE SCHEMA IF NOT EXISTS {SCHEMA}")
        conn.execute(f"DROP TABLE IF EXISTS {SCHEMA}.todos")
        conn.execute(
            f"CREATE TABLE {SCHEMA}.todos "
            "(id serial PRIMARY KEY, title text NOT NULL, completed int NOT NULL)"
        )
        conn.execute(
            f"INSERT INTO {SCHEMA}.todos (title, completed) "
            "SELECT 'todo ' || i, mod(i, 2) FROM generate_series(0, %s) AS i",
            (rows - 1,),
        )
        conn.execute(f"ANALYZE {SCHEMA}.todos")


def _endpoint(way: str, url: str, table: str, app_name: str) -> tuple[Callable[..., Any], list[Any]]:
    """The ``/count`` endpoint of ``way`` and what to close afterwards."""
    sql = text(COUNT_SQL.format(table=table))
    if way == "control":  # the post's /ping-with-async-sleep: no database, the loop never blocked

        async def control(request: Request) -> JSONResponse:
            await asyncio.sleep(CONTROL_SLEEP_S)
            return JSONResponse({"count": 0})

        return control, []
    if way == "inline":
        connect_args = {"server_settings": {"application_name": app_name}} if "asyncpg" in url else {}
        engine = create_async_engine(url, connect_args=connect_args, pool_size=20, max_overflow=0)
        sessions = async_sessionmaker(engine)

        async def inline(request: Request) -> JSONResponse:
            async with sessions() as session:
                return JSONResponse({"count": (await session.execute(sql)).scalar_one()})

        return inline, [engine.dispose]
    connect_args = {"application_name": app_name} if "psycopg" in url else {"check_same_thread": False}
    sync_engine = create_engine(url, connect_args=connect_args, pool_size=LIMIT, max_overflow=0)
    runner = ThreadOffloadRunner(sessionmaker(sync_engine), limit=LIMIT)

    def unit(session: Session) -> int:
        return int(session.execute(sql).scalar_one())

    async def offload(request: Request) -> JSONResponse:
        return JSONResponse({"count": await runner.submit(unit)})

    async def dispose() -> None:
        sync_engine.dispose()

    return offload, [runner.aclose, dispose]


async def _serve_and_burst(app: Starlette) -> dict[str, Any]:
    """Serve ``app`` and send it post 004's burst; the load generator's figures and the wall time."""
    async with web.serve(app) as base:
        proc = await web.spawn("burst", base, "/count", str(REQUESTS))
        try:
            await web.ready(proc)
            started = time.perf_counter()
            await web.go(proc)
            found = await web.result(proc)
        finally:
            await web.stop(proc)
        found["wall_s"] = time.perf_counter() - started
        return found


async def _variant(ctx: Context, database: str, way: str, url: str, table: str, rows: int) -> None:
    label = f"post-004 {database} {way}"
    app_name = ctx.app_name(label)
    m = Measurement(GROUP, label, group=GROUP, n=REQUESTS)
    m.config = {
        "database": database,
        "way": way,
        "rows": rows,
        "requests": REQUESTS,
        "url_driver": url.split(":")[0],
    }
    if way == "offload":
        m.config["limit"] = LIMIT
    endpoint, cleanup = _endpoint(way, url, table, app_name)
    app = Starlette(routes=[Route("/ping", web.ping), Route("/count", endpoint)])
    try:
        result = await _serve_and_burst(app)
        db, ping = result["db_latencies"], result["ping_latencies"]
        m.wall_s, m.succeeded, m.failed = result["wall_s"], len(db), result["errors"]
        m.ops_per_s = len(db) / result["wall_s"] if result["wall_s"] else None
        for name, values in (("count", db), ("ping", ping)):
            if values:
                m.extra[f"{name}_min_s"], m.extra[f"{name}_max_s"] = min(values), max(values)
                m.extra[f"{name}_mean_s"] = statistics.fmean(values)
    except Exception as exc:
        m.error = f"{type(exc).__name__}: {exc}"[:300]
    finally:
        for close in cleanup:
            await close()
    ctx.results.append(m)
    ctx.log(
        f"{label}: /count mean {m.extra.get('count_mean_s', 0):.2f} s, "
        f"/ping mean {m.extra.get('ping_mean_s', 0):.2f} s"
    )


def run(ctx: Context) -> None:
    rows = ROWS if len(ctx.ops) >= 5_000 else QUICK_ROWS
    with tempfile.TemporaryDirectory(prefix="bdb-post004-") as directory:
        path = _sqlite_file(Path(directory), rows)
        asyncio.run(_variant(ctx, "none", "control", "", "todos", 0))
        for way, url in (
            ("inline", f"sqlite+aiosqlite:///{path}"),
            ("offload", f"sqlite+pysqlite:///{path}"),
        ):
            asyncio.run(_variant(ctx, "sqlite", way, url, "todos", rows))
    _postgres_table(ctx, rows)
    try:
        for way, driver in (("inline", "asyncpg"), ("offload", "psycopg")):
            url = ctx.db.driver_url(driver).render_as_string(hide_password=False)
            asyncio.run(_variant(ctx, "postgresql", way, url, f"{SCHEMA}.todos", rows))
    finally:
        with ctx.db.connect() as conn:
            conn.execute(f"DROP TABLE IF EXISTS {SCHEMA}.todos")


SCENARIO = Scenario(
    name="post-004",
    run=run,
    what="post 004: 100 slow requests and 100 /ping at once, inline AsyncSession against an offload",
    section="Post 004",
    seconds=25,
)
