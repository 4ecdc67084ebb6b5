"""
The PostgreSQL server a run uses: which one, engines that label their connections, the schema reset.

``--database mysql`` uses :class:`benchmarks.db.mysql.MySQLDatabase` instead, which offers the same
attributes and methods (the ones the throughput scenarios and the harness's sampler call).
"""

from __future__ import annotations

import atexit
import contextlib
from dataclasses import dataclass
from typing import Any

import psycopg
from sqlalchemy import URL, Engine, create_engine, text
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine
from sqlalchemy.pool import NullPool

from boundeddb.testing import postgres

from .facts import ServerFacts
from .proc import proc_cpu_s
from .schema import DEFAULT_SCHEMA, SCHEMA, Base

ENV_VAR = "BOUNDEDDB_BENCH_URL"
DEFAULT_URL = "postgresql://postgres@127.0.0.1:5432/postgres"
#: Every connection the suite opens carries an application_name starting with this.
#: Another schema ($BOUNDEDDB_BENCH_SCHEMA) gets names of its own: a second run on the same server
#: counts its own connections only.
APP_PREFIX = "bdbbench" if SCHEMA == DEFAULT_SCHEMA else f"bdbbench.{SCHEMA}"[:40]
SAMPLER_APP = f"{APP_PREFIX}-sampler"
#: Connections kept free for the sampler, psql and other users of the server.
HEADROOM = 3


@dataclass
class Database(ServerFacts):
    """The PostgreSQL server the suite runs against, and how it was chosen."""

    #: What ``--database`` names, and what the report calls the server.
    kind = "postgresql"
    product = "PostgreSQL"
    #: The drivers of the post's scenarios: async runners, thread runners, the sync story.
    async_driver = "asyncpg"
    thread_driver = "psycopg"
    sync_driver = "psycopg2"
    #: Where the sampler counts a scenario's connections.
    activity_source = "pg_stat_activity"

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

    def async_options(self, app_name: str) -> dict[str, Any]:
        """
        The asyncpg engine options of the suite's async engines besides the pool's size: connections
        that carry ``app_name``, a 60 s pool timeout (plain data: a ProcessRunner sends them to its workers).
        """
        return {"connect_args": {"server_settings": {"application_name": app_name}}, "pool_timeout": 60}

    def async_engine(
        self, app_name: str, *, pool_size: int, driver: str | None = None, **kw: Any
    ) -> AsyncEngine:
        """An asyncpg engine whose connections carry ``app_name``."""
        if driver not in (None, self.async_driver):
            raise ValueError(f"the PostgreSQL scenarios run async units on asyncpg, not {driver}")
        kw.setdefault("max_overflow", 0)
        options = {**self.async_options(app_name), **kw}
        return create_async_engine(self.driver_url("asyncpg"), pool_size=pool_size, **options)

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

    def backends(self, conn: psycopg.Connection[Any], app_name: str) -> list[int]:
        """The process ids of the server connections whose application_name is ``app_name``."""
        rows = conn.execute("SELECT pid FROM pg_stat_activity WHERE application_name = %s", (app_name,))
        return [int(pid) for (pid,) in rows.fetchall()]

    def backend_cpu_s(self, ident: int) -> float | None:
        """The CPU time of one backend process so far (utime + stime from /proc)."""
        return proc_cpu_s(ident)

    def cpu_baseline(self) -> dict[int, float]:
        """CPU time already spent by processes a scenario may reuse: none (a backend per connection)."""
        return {}

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


_servers = contextlib.ExitStack()
atexit.register(_servers.close)


def resolve(*, embedded: bool = False) -> Database:
    """
    Pick the database as the tests do (:func:`boundeddb.testing.postgres`):
    ``$BOUNDEDDB_BENCH_URL``, else the local default, else (or with ``embedded``) a throw-away
    PostgreSQL from the pgserver wheel, kept until the process exits.
    """
    server = _servers.enter_context(postgres(DEFAULT_URL, env_var=ENV_VAR, embedded=embedded))
    sources = {"env": f"${ENV_VAR}", "local": "local default", "embedded": "embedded pgserver"}
    db = Database(url=server.url.set(drivername="postgresql"), source=sources[server.source])
    host = db.url.host or db.url.query.get("host") or ""
    db.local = not host or str(host).startswith("/") or host in {"127.0.0.1", "localhost", "::1"}
    with db.connect() as conn:
        row = conn.execute(
            "SELECT current_setting('server_version'), current_setting('max_connections')::int"
        ).fetchone()
    assert row is not None
    db.server_version, db.max_connections = str(row[0]), int(row[1])
    return db
