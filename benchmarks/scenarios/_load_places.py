"""
The ``load`` scenario's databases (:mod:`.load`): a :class:`Place` for each, where a side runs, with
its engines, its table resets and its row counts.

PostgreSQL is the suite's database; MariaDB is ``$BOUNDEDDB_BENCH_MYSQL_URL`` or the local default;
SQLite is a file in a temporary directory (WAL) whose tables are in an attached database named as
the suite's schema.  Every reset drops the scenario's tables and makes them again, so that every side
runs on fresh tables.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable
from pathlib import Path
from typing import Any

from sqlalchemy import create_engine, event, insert, text
from sqlalchemy.engine import Connection, Engine
from sqlalchemy.ext.asyncio import AsyncEngine
from sqlalchemy.pool import NullPool

from ..db import mysql as mysql_db
from ..db.schema import SCHEMA, Base
from ..harness import Context
from ._batching import LogBase, LogRow
from .journal import _search_path


def _recreate(conn: Connection, seeded: list[dict[str, Any]]) -> None:
    """The scenario's tables dropped and made again, the ``seeded`` request-log rows in them."""
    LogBase.metadata.drop_all(conn)
    Base.metadata.drop_all(conn)
    Base.metadata.create_all(conn)
    LogBase.metadata.create_all(conn)
    if seeded:
        conn.execute(insert(LogRow), seeded)


@dataclasses.dataclass
class Place:
    """Where a part runs: its database's name, its context (sampler), engines, and table resets."""

    name: str
    ctx: Context
    async_engine: Callable[[str, int], AsyncEngine] | None
    sync_engine: Callable[[str, int], Engine] | None
    reset: Callable[[list[dict[str, Any]]], None]
    count: Callable[[str, bool], tuple[int, int]]
    placeholder: str = "%s"


def _pg_place(ctx: Context) -> Place:
    db = ctx.db

    def reset(seeded: list[dict[str, Any]]) -> None:
        engine = create_engine(
            db.driver_url("psycopg"),
            poolclass=NullPool,
            connect_args={"application_name": ctx.app_name("load setup")},
        )
        try:
            with engine.begin() as conn:
                conn.execute(text(f"CREATE SCHEMA IF NOT EXISTS {SCHEMA}"))
                _recreate(conn, seeded)
            with engine.connect() as conn, contextlib.suppress(Exception):
                conn.execute(text("CHECKPOINT"))
        finally:
            engine.dispose()

    def count(table: str, log: bool) -> tuple[int, int]:
        what = "count(*), count(DISTINCT request_id)" if log else "count(*), count(*)"
        with db.connect() as conn:
            row = conn.execute(f"SELECT {what} FROM {SCHEMA}.{table}").fetchone()
        assert row is not None
        return int(row[0]), int(row[1])

    def async_engine(app: str, size: int) -> AsyncEngine:
        engine = db.async_engine(app, pool_size=size)
        _search_path(engine.sync_engine)
        return engine

    def sync_engine(app: str, size: int) -> Engine:
        return db.sync_engine(app, pool_size=size, driver="psycopg")

    return Place("postgresql", ctx, async_engine, sync_engine, reset, count)


def _mysql_place(ctx: Context, db: mysql_db.MySQLDatabase) -> Place:
    def reset(seeded: list[dict[str, Any]]) -> None:
        engine = create_engine(db.driver_url("pymysql", database=None), poolclass=NullPool)
        try:
            with engine.begin() as conn:
                conn.execute(text(f"CREATE DATABASE IF NOT EXISTS {SCHEMA}"))
                _recreate(conn, seeded)
        finally:
            engine.dispose()

    def count(table: str, log: bool) -> tuple[int, int]:
        what = "count(*), count(DISTINCT request_id)" if log else "count(*), count(*)"
        conn = db.connect()
        try:
            with conn.cursor() as cursor:
                cursor.execute(f"SELECT {what} FROM {SCHEMA}.{table}")
                row = cursor.fetchone()
        finally:
            conn.close()
        return int(row[0]), int(row[1])

    here = dataclasses.replace(ctx, db=db)
    here.results = ctx.results  # the same list: rows land in the run's results
    return Place(
        "mariadb" if db.product == "MariaDB" else "mysql",
        here,
        lambda app, size: db.async_engine(app, pool_size=size, driver="aiomysql"),
        lambda app, size: db.sync_engine(app, pool_size=size, driver="pymysql"),
        reset,
        count,
    )


def _sqlite_place(ctx: Context, directory: Path) -> Place:
    """A SQLite file whose tables are in the attached database named as the suite's schema."""
    main, bench = directory / "main.db", directory / f"{SCHEMA}.db"

    def attach(engine: Engine) -> Engine:
        @event.listens_for(engine, "connect")
        def attached(dbapi_connection: Any, record: Any) -> None:
            dbapi_connection.execute(f"ATTACH DATABASE '{bench}' AS {SCHEMA}")
            dbapi_connection.execute(f"PRAGMA {SCHEMA}.journal_mode=WAL")

        return engine

    def engine_of(size: int, **kw: Any) -> Engine:
        return attach(create_engine(f"sqlite:///{main}", pool_size=size, max_overflow=0, **kw))

    def reset(seeded: list[dict[str, Any]]) -> None:
        for f in directory.glob("*"):
            f.unlink()
        engine = engine_of(1)
        try:
            with engine.begin() as conn:
                _recreate(conn, seeded)
        finally:
            engine.dispose()

    def count(table: str, log: bool) -> tuple[int, int]:
        what = "count(*), count(DISTINCT request_id)" if log else "count(*), count(*)"
        engine = engine_of(1)
        try:
            with engine.connect() as conn:
                row = conn.execute(text(f"SELECT {what} FROM {SCHEMA}.{table}")).one()
        finally:
            engine.dispose()
        return int(row[0]), int(row[1])

    return Place("sqlite", ctx, None, lambda app, size: engine_of(size), reset, count, placeholder="?")
