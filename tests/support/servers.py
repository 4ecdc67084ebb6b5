"""
The servers behind the contract tests, one facet each, so that one test function checks one promise on
PostgreSQL and on MariaDB (or MySQL).

A facet knows how its server spells the few things a unit says (an integer parameter, a sleep on the
server), and how to watch *this test's* connections from outside the runner, through an admin engine
of its own:

- PostgreSQL: a schema per test run and an ``application_name`` per test, in ``pg_stat_activity``;
- MariaDB/MySQL: a database per test, which the runner's engines connect to, in the ``DB`` column of
  ``information_schema.processlist`` (the admin engine and boundeddb's own ``KILL QUERY`` side
  connections use no database, so they are never counted).
"""

from __future__ import annotations

import collections
import contextlib
import re
import time
from collections.abc import Iterator
from typing import Any, ClassVar

from sqlalchemy import exc as sa_exc
from sqlalchemy import text
from sqlalchemy.engine import URL, Engine

from tests.support.faults import active_queries, open_transactions
from tests.support.models import Base
from tests.support.probes import ActivitySampler, PeakSampler, backends, committed_units, terminate_backends

__all__ = ["MYSQL_DRIVERS", "Database", "MariaDB", "PostgreSQL", "database_of"]

#: The drivers of the kinds that run on MySQL/MariaDB (tests/support/kits.py: ``<strategy>-<driver>``).
MYSQL_DRIVERS = frozenset({"aiomysql", "asyncmy", "pymysql"})


def database_of(kind: str) -> str:
    """``"mariadb"`` for a kind on a MySQL driver (``"semaphore-asyncmy"``), else ``"postgresql"``."""
    return "mariadb" if kind.rpartition("-")[2] in MYSQL_DRIVERS else "postgresql"


class Database:
    """What a test knows of the server behind its kit (see the module docstring)."""

    name: ClassVar[str]
    #: The fixtures that make this server's engines, (async, sync), each ``make(driver=..., **pool)``.
    engine_fixtures: ClassVar[tuple[str, str]]
    #: The parameter ``:v`` as an integer, in this server's SQL.
    integer: ClassVar[str]
    #: A statement that sleeps ``:s`` seconds on the server.
    sleep: ClassVar[str]
    #: A LIKE pattern that matches :attr:`sleep` in the server's list of running statements.
    sleep_like: ClassVar[str]

    admin: Engine

    def connections(self) -> int:
        """How many connections this test has open to the server."""
        return len(self.connection_ids())

    def connection_ids(self) -> set[int]:
        """The server's ids of this test's open connections (backend pids, MySQL thread ids)."""
        raise NotImplementedError

    def statements(self, like: str = "%") -> list[tuple[int, str]]:
        """(connection id, statement) of this test's statements still running that look like ``like``."""
        raise NotImplementedError

    def running(self, like: str = "%") -> int:
        """How many of this test's statements are still running (that look like ``like``)."""
        return len(self.statements(like))

    def sleeping(self) -> int:
        """How many of this test's connections are in :attr:`sleep` on the server."""
        return self.running(self.sleep_like)

    def open_transactions(self) -> list[tuple[Any, ...]]:
        """This test's connections that sit idle in an open transaction (one row each)."""
        raise NotImplementedError

    def terminate(self) -> None:
        """End every connection of this test on the server."""
        raise NotImplementedError

    def committed_units(self) -> list[int]:
        """The ``unit`` column of every row in the items table, sorted."""
        raise NotImplementedError

    def rows_per_unit(self) -> dict[int, int]:
        """How many rows each unit committed."""
        return dict(collections.Counter(self.committed_units()))

    def sampler(self) -> PeakSampler:
        """A sampler of this test's open connections (:meth:`connections`), every 10 ms."""
        return PeakSampler(self.connections)

    def create_items(self) -> None:
        """Create the items table (``Item``) afresh where the test's runners see it."""
        raise NotImplementedError

    def drop_items(self) -> None:
        """Drop the items table."""
        raise NotImplementedError

    def assert_no_open_transactions(self, where: str, timeout: float = 5.0) -> None:
        """Nothing of this test idle in a transaction (polled: a closed connection may linger a moment)."""
        deadline = time.monotonic() + timeout
        while rows := self.open_transactions():
            if time.monotonic() > deadline:
                raise AssertionError(f"{where}: still idle in transaction after {timeout} s: {rows}")
            time.sleep(0.02)


class PostgreSQL(Database):
    """A schema per test run; this test's backends are those with its ``application_name``."""

    name = "postgresql"
    engine_fixtures = ("make_async_engine", "make_sync_engine")
    integer = "CAST(:v AS integer)"
    sleep = "SELECT pg_sleep(CAST(:s AS float))"
    sleep_like = "%pg_sleep%"

    def __init__(self, admin: Engine, app: str) -> None:
        self.admin = admin
        self.app = app

    def connections(self) -> int:
        return backends(self.admin, self.app)

    def connection_ids(self) -> set[int]:
        with self.admin.connect() as connection:
            rows = connection.execute(
                text("SELECT pid FROM pg_stat_activity WHERE application_name = :app"), {"app": self.app}
            )
            return {int(pid) for pid in rows.scalars()}

    def statements(self, like: str = "%") -> list[tuple[int, str]]:
        with self.admin.connect() as connection:
            rows = connection.execute(
                text(
                    "SELECT pid, query FROM pg_stat_activity WHERE application_name = :app "
                    "AND state = 'active' AND query LIKE :like"
                ),
                {"app": self.app, "like": like},
            )
            return [(int(pid), str(query)) for pid, query in rows]

    def running(self, like: str = "%") -> int:
        return active_queries(self.admin, self.app, like)

    def open_transactions(self) -> list[tuple[Any, ...]]:
        return [tuple(row) for row in open_transactions(self.admin, self.app)]

    def terminate(self) -> None:
        terminate_backends(self.admin, self.app)

    def committed_units(self) -> list[int]:
        return committed_units(self.admin)

    def sampler(self) -> ActivitySampler:
        return ActivitySampler(self.admin, self.app)

    def create_items(self) -> None:
        Base.metadata.drop_all(self.admin)
        Base.metadata.create_all(self.admin)

    def drop_items(self) -> None:
        Base.metadata.drop_all(self.admin)


#: The client thread of a transaction in ``SHOW ENGINE INNODB STATUS`` ("MariaDB thread id 42, ...").
_THREAD_ID = re.compile(r"\bthread id (\d+)")
#: ER_NO_SUCH_THREAD: the connection to kill is already gone.
_NO_SUCH_THREAD = 1094


class MariaDB(Database):
    """A database per test: this test's connections are those whose current database is it."""

    name = "mariadb"
    engine_fixtures = ("make_mysql_async_engine", "make_mysql_sync_engine")
    integer = "CAST(:v AS SIGNED)"
    sleep = "SELECT SLEEP(:s)"
    sleep_like = "%SLEEP(%"

    def __init__(self, server: URL, admin: Engine, database: str) -> None:
        self.server = server
        self.admin = admin
        self.database = database

    def url(self, driver: str) -> URL:
        """The URL of this test's database through ``driver`` (``mysql+<driver>://...``)."""
        return self.server.set(drivername=f"mysql+{driver}", database=self.database)

    def _processlist(self, condition: str, **params: Any) -> list[Any]:
        with self.admin.connect() as connection:
            return list(
                connection.execute(
                    text(
                        "SELECT id, command, info FROM information_schema.processlist "
                        f"WHERE db = :db AND id <> CONNECTION_ID() AND {condition}"
                    ),
                    {"db": self.database, **params},
                )
            )

    def connection_ids(self) -> set[int]:
        return {int(row.id) for row in self._processlist("TRUE")}

    def statements(self, like: str = "%") -> list[tuple[int, str]]:
        # A statement is running while ``info`` shows it. Not by ``command``: a KILL QUERY that reaches
        # an idle connection marks it "Killed" until its next statement (which then runs as usual).
        rows = self._processlist("info IS NOT NULL AND info LIKE :like", like=like)
        return [(int(row.id), f"{row.command}: {row.info}") for row in rows]

    def open_transactions(self) -> list[tuple[Any, ...]]:
        """
        This test's idle connections with an InnoDB transaction open, by ``SHOW ENGINE INNODB STATUS``.

        Not by ``information_schema.innodb_trx``: InnoDB serves that table from a cache that it
        refreshes only when nobody has read it for 100 ms (``trx_i_s_cache``), so polling it every
        20 ms, or any other session on the server doing so, sees the same stale rows forever.
        """
        in_transaction = self.threads_in_transaction()
        if not in_transaction:
            return []
        idle = self._processlist("command = 'Sleep'")
        return [(row.id, "idle in transaction") for row in idle if row.id in in_transaction]

    def threads_in_transaction(self) -> set[int]:
        """
        The ids of the server's connections (any test's) with an InnoDB transaction started, idle or
        running a statement, by ``SHOW ENGINE INNODB STATUS`` (see :meth:`open_transactions`).
        """
        with self.admin.connect() as connection:
            status = str(connection.execute(text("SHOW ENGINE INNODB STATUS")).one()[2])
        return _threads_in_transaction(status)

    def terminate(self) -> None:
        for row in self._processlist("TRUE"):
            try:
                with self.admin.connect() as connection:
                    connection.execute(text(f"KILL CONNECTION {int(row.id)}"))
            except sa_exc.OperationalError as error:
                if error.orig is None or error.orig.args[0] != _NO_SUCH_THREAD:
                    raise

    def committed_units(self) -> list[int]:
        with self.admin.connect() as connection:
            return sorted(connection.execute(text(f"SELECT unit FROM `{self.database}`.items")).scalars())

    def _in_database(self) -> Engine:
        """The admin engine with unqualified tables put in this test's database (for DDL)."""
        return self.admin.execution_options(schema_translate_map={None: self.database})

    def create_items(self) -> None:
        Base.metadata.drop_all(self._in_database())
        Base.metadata.create_all(self._in_database())

    def drop_items(self) -> None:
        Base.metadata.drop_all(self._in_database())


def _threads_in_transaction(innodb_status: str) -> set[int]:
    """
    The client threads with a transaction started, in ``SHOW ENGINE INNODB STATUS``'s list, whose
    entries read ``---TRANSACTION 5242, ACTIVE 3 sec`` (or ``..., not started``), then a few lines,
    one of them ``MariaDB thread id 476, OS thread handle ...`` (``MySQL thread id`` on MySQL).
    """
    threads = set()
    for section in innodb_status.split("\n---"):
        header, _, body = section.partition("\n")
        started = header.startswith("TRANSACTION ") and "not started" not in header
        if started and (match := _THREAD_ID.search(body)):
            threads.add(int(match[1]))
    return threads


@contextlib.contextmanager
def mysql_row_locked(admin: Engine, table: str) -> Iterator[None]:
    """
    Hold row 1 of ``table`` (MySQL/MariaDB) in an open transaction of ``admin``: a unit's UPDATE of
    it waits (up to 50 s). Unlike SLEEP(), which MariaDB ends soon after the client goes away, a lock
    wait goes on whatever happens to the client: only a KILL QUERY (or the lock's release) ends it.
    """
    with admin.connect() as c:
        c.execute(text("SET SESSION autocommit = 0"))
        c.execute(text(f"SELECT n FROM {table} WHERE id = 1 FOR UPDATE"))
        try:
            yield
        finally:
            c.execute(text("ROLLBACK"))
            c.execute(text("SET SESSION autocommit = 1"))
