"""
Engines of the soak's clients and jobs: through the fault proxy, named by ``application_name``, each
of whose discarded connections is written down for the sampler.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import create_engine, event
from sqlalchemy.engine import Engine
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine
from sqlalchemy.pool import Pool

from tests.chaos.config import Config
from tests.chaos.records import Lines

__all__ = ["make_async_engine", "make_sync_engine", "proxied_url", "server_id", "watch_discards"]


def proxied_url(config: Config, driver: str) -> str:
    """The URL of the soak's database through its proxy, for ``driver``."""
    if driver in ("aiomysql", "asyncmy", "pymysql"):
        return f"mysql+{driver}://root@127.0.0.1:{config.mysql_port}/{config.mysql_database}"
    return f"postgresql+{driver}://postgres@127.0.0.1:{config.pg_port}/{config.pg_database}"


def _connect_args(driver: str, app: str) -> dict[str, Any]:
    if driver == "asyncpg":
        return {"server_settings": {"application_name": app}, "ssl": False, "timeout": 5}
    if driver in ("psycopg", "psycopg2"):
        return {"application_name": app, "connect_timeout": 5, "sslmode": "disable"}
    return {"connect_timeout": 5}  # MySQL: the connections are told apart by their database


def make_async_engine(config: Config, driver: str, app: str, pool_size: int, discards: Lines) -> AsyncEngine:
    """An async engine of ``pool_size`` connections (no overflow) through the proxy."""
    engine = create_async_engine(
        proxied_url(config, driver),
        connect_args=_connect_args(driver, app),
        pool_size=pool_size,
        max_overflow=0,
        pool_timeout=60,
    )
    watch_discards(engine, app, discards)
    return engine


def make_sync_engine(config: Config, driver: str, app: str, pool_size: int, discards: Lines) -> Engine:
    """As :func:`make_async_engine`, for a sync driver."""
    engine = create_engine(
        proxied_url(config, driver),
        connect_args=_connect_args(driver, app),
        pool_size=pool_size,
        max_overflow=0,
        pool_timeout=60,
    )
    watch_discards(engine, app, discards)
    return engine


def watch_discards(engine: Engine | AsyncEngine | type[Pool], app: str, discards: Lines) -> None:
    """
    Write down each connection the pool discards (invalidated or closed), with the server's id of it;
    of every pool of this process, given the class ``Pool`` (a ProcessRunner's worker).
    """
    pool: Any = (
        engine
        if isinstance(engine, type)
        else (engine.sync_engine if isinstance(engine, AsyncEngine) else engine).pool
    )

    def on_connect(dbapi_connection: Any, record: Any) -> None:
        record.info["chaos_id"] = server_id(dbapi_connection)

    def on_gone(dbapi_connection: Any, record: Any, *_: Any) -> None:
        ident = record.info.get("chaos_id") if record is not None else None
        if ident is not None:
            discards.write(app=app, id=ident)

    event.listen(pool, "connect", on_connect)
    event.listen(pool, "invalidate", on_gone)
    event.listen(pool, "close", on_gone)


def server_id(dbapi_connection: Any) -> int | None:
    """The backend pid (PostgreSQL) or thread id (MySQL) of a DBAPI connection, as its driver knows it."""
    raw = getattr(dbapi_connection, "driver_connection", dbapi_connection)
    readers = (
        lambda: raw.get_server_pid(),  # asyncpg
        lambda: raw.info.backend_pid,  # psycopg 3
        lambda: raw.get_backend_pid(),  # psycopg2
        lambda: raw.thread_id(),  # pymysql, mysqlclient
        lambda: raw.server_thread_id[0],  # aiomysql
    )
    for read in readers:
        try:
            value = read()
        except Exception:
            continue
        if isinstance(value, int):
            return value
    return None
