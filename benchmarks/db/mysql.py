"""
``--database mysql``: the MySQL/MariaDB server, its engines, the schema reset, and what the sampler reads.

The server is ``$BOUNDEDDB_BENCH_MYSQL_URL`` if set, else ``mysql://root@127.0.0.1:3306/test`` (the
local MariaDB the tests use).  The suite's tables live in a database of their own,
``boundeddb_bench`` (the name of the PostgreSQL schema: on MySQL a schema is a database), created by
the first reset and dropped at the end.  Each scenario's engines connect to that database, so a
scenario's connections are the rows of ``information_schema.processlist`` whose ``DB`` is
``boundeddb_bench`` (MySQL has no ``application_name``, and MariaDB's performance_schema, where
connection attributes would be, is off by default); scenarios run one at a time, so those rows are the
running scenario's.

MariaDB serves each connection from a thread of one ``mariadbd`` process, and keeps the threads of
closed connections for new ones; processlist's ``TID`` names a connection's thread, so the server CPU
of a scenario is the CPU its connections' threads spent during it (``/proc/<pid>/task/<tid>/stat``
less what the thread had spent before the scenario started).
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import URL, Engine, create_engine, make_url, text
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine
from sqlalchemy.pool import NullPool

from .facts import ServerFacts
from .proc import thread_cpu_s, threads_cpu_s
from .schema import SCHEMA, Base

ENV_VAR = "BOUNDEDDB_BENCH_MYSQL_URL"
DEFAULT_URL = "mysql://root@127.0.0.1:3306/test"
#: Connections kept free for the sampler, the mysql client and other users of the server.
HEADROOM = 3
LOCAL_HOSTS = frozenset({"127.0.0.1", "localhost", "::1"})
SERVER_PROCESS_NAMES = frozenset({"mariadbd", "mysqld"})
#: The server settings the report shows: what a commit costs, and the memory InnoDB has.
SETTINGS = (
    "innodb_flush_log_at_trx_commit",
    "sync_binlog",
    "log_bin",
    "innodb_buffer_pool_size",
    "thread_handling",
    "tx_isolation",
)


class ServerUnavailable(RuntimeError):
    """No MySQL/MariaDB server answers at the URL (the message says which, and what to do)."""


@dataclass
class MySQLDatabase(ServerFacts):
    """The MySQL/MariaDB server the suite runs against, and how it was chosen."""

    #: The server's process, when it is local and visible here (for its threads' CPU).
    server_pid: int | None = None
    product: str = "MariaDB"
    #: Server settings the figures depend on (a commit's fsync above all), for the report.
    settings: dict[str, str] = field(default_factory=dict)
    #: Threads of the server process and the CPU each had spent, at the start of the current probe.
    _baseline: dict[int, float] = field(default_factory=dict, repr=False)
    kind = "mysql"
    async_driver = "aiomysql"
    thread_driver = "pymysql"
    sync_driver = "pymysql"
    activity_source = "information_schema.processlist"

    def driver_url(self, driver: str, *, database: str | None = SCHEMA) -> URL:
        """The URL with ``driver`` (aiomysql, asyncmy, pymysql, mysqldb) as its DBAPI, on ``database``."""
        return self.url.set(drivername=f"mysql+{driver}", database=database)

    def connect_args(self, *, database: str | None = None) -> dict[str, Any]:
        """Arguments for ``pymysql.connect`` and ``aiomysql.connect`` (with the password: never print)."""
        args: dict[str, Any] = {
            "host": self.url.host or "127.0.0.1",
            "port": self.url.port or 3306,
            "user": self.url.username or "root",
            "password": self.url.password or "",
        }
        if database:
            args["db"] = database
        if socket := self.url.query.get("unix_socket"):
            args["unix_socket"] = socket
        return args

    def connect(self, app_name: str = "") -> Any:
        """A plain autocommit pymysql connection outside the suite's database, for the sampler and set-up."""
        import pymysql

        return pymysql.connect(**self.connect_args(), autocommit=True, connect_timeout=5)

    def async_engine(
        self, app_name: str, *, pool_size: int, driver: str | None = None, **kw: Any
    ) -> AsyncEngine:
        """An aiomysql (or asyncmy) engine on the suite's database; ``app_name`` only names it here."""
        kw.setdefault("max_overflow", 0)
        kw.setdefault("pool_timeout", 60)
        return create_async_engine(self.driver_url(driver or self.async_driver), pool_size=pool_size, **kw)

    def sync_engine(self, app_name: str, *, pool_size: int, driver: str | None = None, **kw: Any) -> Engine:
        """A pymysql (or mysqlclient: ``mysqldb``) engine on the suite's database."""
        kw.setdefault("max_overflow", 0)
        kw.setdefault("pool_timeout", 60)
        return create_engine(self.driver_url(driver or self.thread_driver), pool_size=pool_size, **kw)

    # -- what the sampler reads ----------------------------------------------------------------------

    def backends(self, conn: Any, app_name: str) -> list[int]:
        """The server threads (processlist TID) of the connections to the suite's database."""
        with conn.cursor() as cursor:
            cursor.execute(
                "SELECT TID FROM information_schema.processlist WHERE DB = %s AND ID <> CONNECTION_ID()",
                (SCHEMA,),
            )
            return [int(tid) for (tid,) in cursor.fetchall() if tid is not None]

    def backend_cpu_s(self, ident: int) -> float | None:
        """The CPU time thread ``ident`` of the server spent since the probe started."""
        if self.server_pid is None:
            return None
        cpu = thread_cpu_s(self.server_pid, ident)
        return None if cpu is None else max(0.0, cpu - self._baseline.get(ident, 0.0))

    def cpu_baseline(self) -> dict[int, float]:
        """Remember what every server thread had spent (a cached thread may serve the next scenario)."""
        self._baseline = threads_cpu_s(self.server_pid) if self.server_pid is not None else {}
        return dict(self._baseline)

    def free_connections(self) -> int:
        """How many more connections the server accepts now, less some headroom."""
        conn = self.connect()
        try:
            with conn.cursor() as cursor:
                cursor.execute(
                    "SELECT @@max_connections, (SELECT count(*) FROM information_schema.processlist)"
                )
                row = cursor.fetchone()
        finally:
            conn.close()
        assert row is not None
        return int(row[0]) - int(row[1]) - HEADROOM

    # -- the schema ----------------------------------------------------------------------------------

    def reset_schema(self, *, index: bool) -> None:
        """
        Drop and create the post's tables in the suite's database.

        InnoDB indexes a foreign key's column by itself, so the post's tables as created have an index
        on ``b.a_id``: that is the ``--index`` pass.  The post's schema (no index on ``b.a_id``, so a
        read scans ``b`` as it does on PostgreSQL) is those tables without the constraint and its index.
        """
        engine = create_engine(self.driver_url("pymysql", database=None), poolclass=NullPool)
        try:
            with engine.begin() as conn:
                conn.execute(text(f"CREATE DATABASE IF NOT EXISTS {SCHEMA}"))
                Base.metadata.drop_all(conn)
                Base.metadata.create_all(conn)
                if not index:
                    _drop_foreign_key(conn)
        finally:
            engine.dispose()

    def drop_schema(self) -> None:
        """Remove everything the suite created."""
        conn = self.connect()
        try:
            with conn.cursor() as cursor:
                cursor.execute(f"DROP DATABASE IF EXISTS {SCHEMA}")
        finally:
            conn.close()


def _drop_foreign_key(conn: Any) -> None:
    """Drop ``b``'s foreign key to ``a`` and the index InnoDB made for it."""
    names = conn.execute(
        text(
            "SELECT CONSTRAINT_NAME FROM information_schema.KEY_COLUMN_USAGE "
            "WHERE TABLE_SCHEMA = :s AND TABLE_NAME = 'b' AND REFERENCED_TABLE_NAME = 'a'"
        ),
        {"s": SCHEMA},
    ).scalars()
    for name in list(names):
        conn.execute(text(f"ALTER TABLE {SCHEMA}.b DROP FOREIGN KEY `{name}`"))
    indexes = conn.execute(text(f"SHOW INDEX FROM {SCHEMA}.b WHERE Column_name = 'a_id'")).mappings()
    for key in {row["Key_name"] for row in indexes}:
        conn.execute(text(f"ALTER TABLE {SCHEMA}.b DROP INDEX `{key}`"))


def _server_pid(conn: Any) -> int | None:
    """The local server's process id: from its pid file, else the first mariadbd/mysqld in /proc."""
    with conn.cursor() as cursor:
        cursor.execute("SELECT @@pid_file")
        row = cursor.fetchone()
    candidates: list[int] = []
    with contextlib.suppress(OSError, ValueError, TypeError), open(str(row[0]) if row else "") as f:
        candidates.append(int(f.read().strip()))
    with contextlib.suppress(OSError):
        candidates += [int(p) for p in os.listdir("/proc") if p.isdigit()]
    for pid in candidates:
        with contextlib.suppress(OSError), open(f"/proc/{pid}/comm") as f:
            if f.read().strip() in SERVER_PROCESS_NAMES:
                return pid
    return None


def resolve() -> MySQLDatabase:
    """
    ``$BOUNDEDDB_BENCH_MYSQL_URL``, else the local default; :class:`ServerUnavailable` if none answers.
    """
    import pymysql

    raw = os.environ.get(ENV_VAR)
    url = make_url(raw or DEFAULT_URL).set(drivername="mysql")
    db = MySQLDatabase(url=url, source=f"${ENV_VAR}" if raw else "local default")
    host = url.host or ""
    db.local = not host or host in LOCAL_HOSTS or bool(url.query.get("unix_socket"))
    try:
        conn = db.connect()
    except pymysql.MySQLError as exc:
        raise ServerUnavailable(
            f"no MySQL/MariaDB server answers at {db.shown} ({exc}); set ${ENV_VAR}, or start the local "
            "MariaDB: start-stop-daemon --start --oknodo --background --exec /usr/sbin/mariadbd"
        ) from exc
    try:
        with conn.cursor() as cursor:
            cursor.execute("SELECT VERSION(), @@max_connections")
            row = cursor.fetchone()
        assert row is not None
        db.server_version, db.max_connections = str(row[0]), int(row[1])
        db.product = "MariaDB" if "mariadb" in db.server_version.lower() else "MySQL"
        with conn.cursor() as cursor:
            cursor.execute(f"SELECT {', '.join(f'@@{name}' for name in SETTINGS)}")
            values = cursor.fetchone() or ()
        db.settings = {name: str(value) for name, value in zip(SETTINGS, values, strict=False)}
        db.server_pid = _server_pid(conn) if db.local else None
    finally:
        conn.close()
    return db
