"""Which database to use, engines that label their connections, and the schema reset."""

from __future__ import annotations

import atexit
import contextlib
import os
import tempfile
import warnings
from dataclasses import dataclass, field
from typing import Any

import psycopg
from sqlalchemy import URL, Engine, create_engine, make_url, text
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine
from sqlalchemy.pool import NullPool

from ._workload import SCHEMA, Base

ENV_VAR = "BOUNDEDDB_BENCH_URL"
DEFAULT_URL = "postgresql://postgres@127.0.0.1:5432/postgres"
#: Every connection the suite opens carries an application_name starting with this.
APP_PREFIX = "bdbbench"
SAMPLER_APP = f"{APP_PREFIX}-sampler"
#: Connections kept free for the sampler, psql and other users of the server.
HEADROOM = 3


@dataclass
class Database:
    """The database the suite runs against, and how it was chosen."""

    url: URL
    source: str
    server_version: str = ""
    max_connections: int = 0
    local: bool = True
    _embedded: Any = field(default=None, repr=False)

    @property
    def shown(self) -> str:
        """The URL with any password hidden, safe to print and store."""
        return self.url.render_as_string(hide_password=True)

    def driver_url(self, driver: str) -> URL:
        """The base URL with ``driver`` (asyncpg, psycopg, psycopg2) as its DBAPI."""
        return self.url.set(drivername=f"postgresql+{driver}")

    def libpq_dsn(self) -> str:
        """A DSN for psycopg.connect or asyncpg (contains the password: never print it)."""
        return self.url.set(drivername="postgresql").render_as_string(hide_password=False)

    def connect(self, app_name: str = SAMPLER_APP) -> psycopg.Connection[Any]:
        """A plain autocommit psycopg connection, for the sampler and set-up."""
        return psycopg.connect(
            self.libpq_dsn(), autocommit=True, application_name=app_name, connect_timeout=5
        )

    def async_engine(self, app_name: str, *, pool_size: int, **kw: Any) -> AsyncEngine:
        """An asyncpg engine whose connections carry ``app_name``."""
        kw.setdefault("max_overflow", 0)
        kw.setdefault("pool_timeout", 60)
        return create_async_engine(
            self.driver_url("asyncpg"),
            pool_size=pool_size,
            connect_args={"server_settings": {"application_name": app_name}},
            **kw,
        )

    def sync_engine(self, app_name: str, *, pool_size: int, driver: str = "psycopg", **kw: Any) -> Engine:
        """A psycopg (or psycopg2) engine whose connections carry ``app_name``."""
        kw.setdefault("max_overflow", 0)
        kw.setdefault("pool_timeout", 60)
        return create_engine(
            self.driver_url(driver),
            pool_size=pool_size,
            connect_args={"application_name": app_name},
            **kw,
        )

    def free_connections(self) -> int:
        """How many more connections the server accepts now, less some headroom."""
        with self.connect() as conn:
            row = conn.execute(
                "SELECT current_setting('max_connections')::int,"
                " (SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'client backend')"
            ).fetchone()
        assert row is not None
        return int(row[0]) - int(row[1]) - HEADROOM

    def reset_schema(self, *, index: bool) -> None:
        """Drop and create the post's tables (and the b.a_id index if asked), then CHECKPOINT."""
        engine = create_engine(
            self.driver_url("psycopg"),
            poolclass=NullPool,
            connect_args={"application_name": f"{APP_PREFIX}-setup"},
        )
        try:
            with engine.begin() as conn:
                conn.execute(text(f"CREATE SCHEMA IF NOT EXISTS {SCHEMA}"))
                Base.metadata.drop_all(conn)
                Base.metadata.create_all(conn)
                if index:
                    conn.execute(text(f"CREATE INDEX ix_b_a_id ON {SCHEMA}.b (a_id)"))
            with engine.connect() as conn, contextlib.suppress(Exception):
                conn.execute(text("CHECKPOINT"))
        finally:
            engine.dispose()

    def drop_schema(self) -> None:
        """Remove everything the suite created."""
        with self.connect(f"{APP_PREFIX}-setup") as conn:
            conn.execute(f"DROP SCHEMA IF EXISTS {SCHEMA} CASCADE")


def _answers(url: URL) -> str | None:
    """None if the server at ``url`` accepts a connection, else the error."""
    dsn = url.set(drivername="postgresql").render_as_string(hide_password=False)
    try:
        with psycopg.connect(dsn, connect_timeout=3, application_name=SAMPLER_APP):
            return None
    except psycopg.Error as exc:
        return f"{type(exc).__name__}: {str(exc).strip().splitlines()[0] if str(exc) else ''}"


def _embedded() -> Database:
    """Start a throw-away PostgreSQL from the pgserver wheel in a temporary directory."""
    with warnings.catch_warnings():  # platformdirs warns when XDG_RUNTIME_DIR is unset
        warnings.simplefilter("ignore")
        import pgserver  # only needed when no server answers

    pgdata = tempfile.mkdtemp(prefix="boundeddb-bench-pg-")
    server = pgserver.get_server(pgdata, cleanup_mode="delete")  # type: ignore[attr-defined]
    atexit.register(server.cleanup)
    url = make_url(server.get_uri())
    if not url.password:
        url = url.set(password=None)
    return Database(url=url, source=f"embedded pgserver in {pgdata}", _embedded=server)


def resolve(*, embedded: bool = False) -> Database:
    """
    Pick the database: ``$BOUNDEDDB_BENCH_URL``, else the local default, else an embedded one.

    Raises:
        SystemExit: ``$BOUNDEDDB_BENCH_URL`` is set but nothing answers there.
    """
    env = os.environ.get(ENV_VAR)
    if embedded:
        db = _embedded()
    elif env:
        url = make_url(env)
        error = _answers(url)
        if error:
            shown = url.render_as_string(hide_password=True)
            raise SystemExit(f"{ENV_VAR}={shown} does not answer: {error}")
        db = Database(url=url, source=f"${ENV_VAR}")
    else:
        url = make_url(DEFAULT_URL)
        error = _answers(url)
        db = Database(url=url, source="local default") if error is None else _embedded()
    if db.url.drivername != "postgresql":
        db.url = db.url.set(drivername="postgresql")
    host = db.url.host or db.url.query.get("host") or ""
    db.local = not host or str(host).startswith("/") or host in {"127.0.0.1", "localhost", "::1"}
    with db.connect() as conn:
        row = conn.execute(
            "SELECT current_setting('server_version'), current_setting('max_connections')::int"
        ).fetchone()
    assert row is not None
    db.server_version, db.max_connections = str(row[0]), int(row[1])
    return db
