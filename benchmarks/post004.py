"""
``post-004``: post 004's experiment — 100 concurrent slow requests plus 100 ``/ping``, on SQLite and
on PostgreSQL, with inline ``AsyncSession`` against ``ThreadOffloadRunner.submit``.

Post 004 served a FastAPI app on SQLite (aiosqlite) with a table of 1,000,000 todos and sent 100
requests to an endpoint that counts them with ``AsyncSession`` and 100 to ``/ping`` at once:
``/ping`` took about 12 s, as long as the database requests.  Here a Starlette app (in this process,
on uvicorn, as the ``loop-lag`` scenario serves it) has ``/ping`` and ``/count``; the load comes from
``_loadgen.py burst`` in a process of its own.  ``/count`` runs ``SELECT count(*) FROM todos WHERE
completed = 0 AND title LIKE '%9%'`` over :data:`ROWS` rows (:data:`QUICK_ROWS` under ``--quick``):

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
import json
import socket
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import uvicorn
from sqlalchemy import create_engine, text
from sqlalchemy.ext.asyncio import async_sessionmaker, create_async_engine
from sqlalchemy.orm import Session, sessionmaker
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse
from starlette.routing import Route

from boundeddb import ThreadOffloadRunner

from ._harness import Context, Measurement
from ._workload import SCHEMA

GROUP = "post-004"
ROWS, QUICK_ROWS = 1_000_000, 100_000
REQUESTS = 100
LIMIT = 4
#: The control variant's /count: an asyncio.sleep of this long instead of a query.
CONTROL_SLEEP_S = 0.5
LOADGEN = Path(__file__).with_name("_loadgen.py")
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


async def _ping(request: Request) -> PlainTextResponse:
    return PlainTextResponse("pong")


async def _serve_and_burst(app: Starlette) -> dict[str, Any]:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)  # TCP_NODELAY: see loop_lag
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", access_log=False, lifespan="off"))
    serving = asyncio.create_task(server.serve(sockets=[sock]))
    try:
        while not server.started:
            if serving.done():
                serving.result()
            await asyncio.sleep(0.01)
        proc = await asyncio.create_subprocess_exec(
            sys.executable, str(LOADGEN), "burst", f"http://127.0.0.1:{port}", "/count", str(REQUESTS),
            stdin=subprocess.PIPE, stdout=subprocess.PIPE,
        )  # fmt: skip
        assert proc.stdout is not None
        assert proc.stdin is not None
        if (await proc.stdout.readline()).strip() != b"ready":
            raise RuntimeError("the load generator did not start")
        started = time.perf_counter()
        proc.stdin.write(b"go\n")
        await proc.stdin.drain()
        out = await proc.stdout.read()
        await proc.wait()
        result: dict[str, Any] = json.loads(out.decode().strip().splitlines()[-1])
        result["wall_s"] = time.perf_counter() - started
        return result
    finally:
        server.should_exit = True
        await serving


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
    app = Starlette(routes=[Route("/ping", _ping), Route("/count", endpoint)])
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


def section(rows: list[Measurement]) -> list[str]:
    """The report's table: /count and /ping min/mean/max per variant."""

    def s(m: Measurement, key: str) -> str:
        value = m.extra.get(key)
        return "-" if value is None else f"{value:.2f}"

    out = [
        f"## Post 004: {REQUESTS} slow requests and {REQUESTS} /ping at once",
        "",
        "| variant | rows | /count min, s | /count mean, s | /count max, s | /ping min, s | /ping mean, s "
        "| /ping max, s | notes |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |",
    ]
    for m in rows:
        out.append(
            f"| {m.label.removeprefix('post-004 ')} | {m.config.get('rows', 0):,} | {s(m, 'count_min_s')} | "
            f"{s(m, 'count_mean_s')} | {s(m, 'count_max_s')} | {s(m, 'ping_min_s')} | "
            f"{s(m, 'ping_mean_s')} | "
            f"{s(m, 'ping_max_s')} | {m.error or (f'{m.failed} failed' if m.failed else '')} |"
        )
    out += [
        "",
        f"control: `asyncio.sleep({CONTROL_SLEEP_S})` instead of a query; "
        f"inline: `AsyncSession` in the endpoint (aiosqlite, asyncpg with a pool of 20); offload: "
        f"`ThreadOffloadRunner(limit={LIMIT}).submit` (pysqlite, psycopg).  The query counts the "
        "unfinished todos whose title contains a 9.  Post 004 measured /ping at 12.4 s mean with "
        "inline AsyncSession on SQLite (100 requests each, an M2 laptop).",
        "",
    ]
    return out
