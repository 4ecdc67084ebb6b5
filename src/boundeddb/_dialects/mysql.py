"""
The MySQL and MariaDB dialect, for aiomysql, asyncmy, pymysql and mysqlclient.

It tells transient errors and lost connections, and stops statements on the server. A MySQL server
goes on running a statement whose client went away, with its transaction open, so a short-lived
side connection stops it. It sends ``KILL QUERY <id>`` for a cancelled run's threads, and
``KILL CONNECTION <id>`` when the pool invalidates a connection, which also rolls back its
transaction at once. A cancelled run waits until the server has ended the connections it
discarded, in :meth:`MySQL.wait_connections_ended`.
The server's id of each connection is read when it is made (or, for a connection the pool made
before the runner, at its first checkout after), because mysqlclient refuses any call on a connection
while another thread runs a statement on it. :meth:`MySQL.check_engine`
refuses an ``autocommit`` in the engine's URL.
``docs/how-to/mysql.md`` tells the drivers' behaviours these guard against.
"""

from __future__ import annotations

import logging
import threading
import time
import weakref
from collections.abc import Hashable, Sequence
from typing import Any

from sqlalchemy import event
from sqlalchemy import exc as sa_exc
from sqlalchemy.engine import URL, Engine

from .base import STATEMENT_ENDED, Dialect, may_hold_connections
from .enders import END_WAIT_S, Enders, More

__all__ = ["DIALECT", "NAMES", "MySQL"]

logger = logging.getLogger("boundeddb.dialects")

NAMES = ("mysql", "mariadb")

#: MySQL/MariaDB error numbers that mean "the same transaction may well succeed if run again".
#: A deadlock, 1213, rolls the whole transaction back. A lock wait timeout, 1205, rolls back only the
#: statement, but the runner rolls back the whole unit before it retries it.
TRANSIENT_ERRNOS = frozenset(
    {
        1213,  # ER_LOCK_DEADLOCK
        1205,  # ER_LOCK_WAIT_TIMEOUT
    }
)
#: Error numbers of a connection that is gone.
LOST_ERRNOS = frozenset(
    {
        1053,  # ER_SERVER_SHUTDOWN
        1927,  # ER_CONNECTION_KILLED, on MariaDB
        2003,  # CR_CONN_HOST_ERROR: cannot connect
        2006,  # CR_SERVER_GONE_ERROR
        2013,  # CR_SERVER_LOST
        2055,  # CR_SERVER_LOST_EXTENDED
    }
)
#: ER_NO_SUCH_THREAD: the statement's connection is already gone, nothing to kill.
NO_SUCH_THREAD = 1094
#: How often, in seconds, that thread asks whether the server has ended the connection.
_END_POLL_S = 0.005
#: The key in a pool entry's ``info`` of a connection whose URL and server id are known.
_KNOWN = "boundeddb.mysql.known"


def errno(error: BaseException | None) -> object:
    """The error number of a MySQL driver error, which is its first argument, or ``None``."""
    args: tuple[object, ...] = getattr(error, "args", ())
    return args[0] if args else None


def server_thread_id(dbapi_connection: Any) -> int | None:
    """The server's id of a DBAPI connection. pymysql, aiomysql and asyncmy keep it from the handshake."""
    raw = getattr(dbapi_connection, "driver_connection", dbapi_connection)  # SQLAlchemy's async adapters
    ident = getattr(raw, "server_thread_id", None)
    if isinstance(ident, tuple) and ident:
        ident = ident[0]
    if isinstance(ident, int):
        return ident
    thread_id = getattr(raw, "thread_id", None)  # mysqlclient
    return int(thread_id()) if callable(thread_id) else None


def _thread_id_now(dbapi_connection: Any) -> int | None:
    """
    :func:`server_thread_id`, or ``None`` if the driver will not say now.

    mysqlclient will not while another thread runs a statement on the connection.
    """
    try:
        return server_thread_id(dbapi_connection)
    except Exception as error:
        logger.debug("MySQL: cannot read this connection's server id now: %s", error)
        return None


def _side_connection(url: URL, what: str, thread_ids: Sequence[int]) -> Any:
    """A new pymysql connection to ``url``'s server, or ``None``, logged, if it cannot be opened."""
    try:
        import pymysql  # type: ignore[import-untyped,unused-ignore]
    except ImportError:  # pragma: no cover - the mysql extra installs it
        logger.warning("MySQL: cannot stop a statement on the server without pymysql (boundeddb[mysql])")
        return None
    options: dict[str, Any] = {
        "host": url.host or "localhost",
        "port": url.port or 3306,
        "user": url.username or "",
        "password": url.password or "",
        "connect_timeout": 5,
    }
    if socket := url.query.get("unix_socket"):
        options["unix_socket"] = socket
    try:
        return pymysql.connect(**options)
    except Exception as error:
        logger.warning("MySQL: %s %s failed: %s", what, ", ".join(map(str, thread_ids)), error)
        return None


def _kill(cursor: Any, what: str, thread_id: int) -> None:
    """
    Send ``what``, ``KILL QUERY`` or ``KILL CONNECTION``, for ``thread_id``.

    A failure is logged, unless the connection is already gone.
    """
    try:
        cursor.execute(f"{what} {int(thread_id)}")
    except Exception as error:
        if errno(error) != NO_SUCH_THREAD:
            logger.warning("MySQL: %s %d failed: %s", what, thread_id, error)
    else:
        logger.debug("MySQL: %s %d sent", what, thread_id)


def kill_queries(url: URL, thread_ids: Sequence[int]) -> None:
    """
    ``KILL QUERY`` each of ``thread_ids`` from one new pymysql connection to ``url``'s server.

    Opening that connection is most of the cost: tens of milliseconds on a busy server. Failures are
    logged.
    """
    connection = _side_connection(url, "KILL QUERY", thread_ids)
    if connection is None:
        return
    try:
        with connection.cursor() as cursor:
            for thread_id in thread_ids:
                _kill(cursor, "KILL QUERY", thread_id)
    finally:
        connection.close()


def end_connections(url: Hashable, thread_ids: Sequence[int], more: More[int] = list) -> None:
    """
    ``KILL CONNECTION`` each of ``thread_ids`` from a new pymysql connection to ``url``'s server, then
    wait until the server has ended them, at most :data:`END_WAIT_S` after the last were killed;
    meanwhile, each poll kills those that ``more()`` hands in too. Failures are logged.

    A killed connection stays in the server's process list until its transaction is rolled back, so
    one gone from the list holds no transaction. ``information_schema.innodb_trx`` would not do:
    InnoDB refreshes it only once nobody has read it for 100 ms.
    """
    assert isinstance(url, URL)
    connection = _side_connection(url, "KILL CONNECTION", thread_ids)
    if connection is None:
        return
    left: list[int] = []
    new = list(thread_ids)
    deadline = time.monotonic() + END_WAIT_S
    try:
        with connection.cursor() as cursor:
            while True:
                if new:
                    for thread_id in new:
                        _kill(cursor, "KILL CONNECTION", thread_id)
                    left += new
                    deadline = time.monotonic() + END_WAIT_S  # the newest have their whole wait
                left = [thread_id for thread_id in left if _listed(cursor, thread_id)]
                new = more()
                if not left and not new:
                    return
                if time.monotonic() > deadline:
                    logger.warning("MySQL: connection(s) %s not ended after %s s", left, END_WAIT_S)
                    left = []
                elif not new:
                    time.sleep(_END_POLL_S)
    except Exception as error:
        logger.warning("MySQL: waiting for connection(s) %s to end failed: %s", left + new, error)
    finally:
        connection.close()


def _listed(cursor: Any, thread_id: int) -> bool:
    """Whether connection ``thread_id`` is in the server's process list."""
    cursor.execute("SELECT COUNT(*) FROM information_schema.processlist WHERE id = %s", (thread_id,))
    return bool(cursor.fetchone()[0])


class MySQL(Dialect):
    name = "mysql"
    stops_statements = True

    def __init__(self) -> None:
        #: The URL of the engine each DBAPI connection came from, for the side connection.
        self._urls: weakref.WeakKeyDictionary[Any, URL] = weakref.WeakKeyDictionary()
        #: Each DBAPI connection's server id, read when it was made, as the module docstring tells.
        self._ids: weakref.WeakKeyDictionary[Any, int] = weakref.WeakKeyDictionary()
        self._prepared: weakref.WeakSet[Any] = weakref.WeakSet()
        #: Ends discarded connections on the server, as the module docstring tells.
        self._enders: Enders[int] = Enders("boundeddb-mysql-end", end_connections)
        self._lock = threading.Lock()

    def _is_lost(self, orig: BaseException) -> bool:
        if errno(orig) in LOST_ERRNOS:
            return True
        return super()._is_lost(orig)

    lock_wait_outlives_transaction = True

    def lock_wait_sql(self, seconds: int) -> str:
        return f"SET SESSION innodb_lock_wait_timeout = {seconds}"

    def is_transient(self, error: BaseException) -> bool:
        if self.is_connection_error(error):
            return True
        return isinstance(error, sa_exc.DBAPIError) and errno(error.orig) in TRANSIENT_ERRNOS

    def check_engine(self, engine: Engine) -> None:
        value = engine.url.query.get("autocommit")
        if value is None:
            return
        msg = (
            f"the engine's URL sets autocommit={value}: SQLAlchemy passes that text to the MySQL driver, "
            "which takes any non-empty string as true, so its connections commit every statement by "
            "itself and a failed unit's earlier statements would stay committed; remove autocommit from "
            "the URL (the runner commits or rolls back each unit), or, to run without transactions on "
            "purpose, use create_engine(..., isolation_level='AUTOCOMMIT')"
        )
        raise ValueError(msg)

    def prepare_engine(self, engine: Engine) -> None:
        with self._lock:
            if engine.pool in self._prepared:
                return
            self._prepared.add(engine.pool)
        url = engine.url

        def on_connect(dbapi_connection: Any, record: Any) -> None:
            key = _key(dbapi_connection)
            self._urls[key] = url
            if (ident := _thread_id_now(dbapi_connection)) is not None:
                self._ids[key] = ident
            record.info[_KNOWN] = True

        def on_invalidate(dbapi_connection: Any, _record: Any, exception: BaseException | None) -> None:
            if exception is STATEMENT_ENDED:  # a thread runner's discard: its statement has returned
                return
            thread_id = self._thread_id(dbapi_connection)
            if thread_id is not None:  # never block the caller, an event loop: a thread of its own
                self._enders.end_soon(url, thread_id)

        def on_checkout(dbapi_connection: Any, record: Any, _proxy: Any) -> None:
            if _KNOWN not in record.info:
                on_connect(dbapi_connection, record)

        event.listen(engine.pool, "connect", on_connect)
        event.listen(engine.pool, "invalidate", on_invalidate)
        if may_hold_connections(engine.pool):
            # Made before the runner (a create_all() at start-up): met at their next checkout, in the
            # thread that will run statements on them, where mysqlclient still tells its id.
            event.listen(engine.pool, "checkout", on_checkout)

    def ending_connections(self, url: Any) -> bool:
        return self._enders.ending(url)

    def wait_connections_ended(self, url: Any) -> None:
        self._enders.wait(url)

    def _thread_id(self, dbapi_connection: Any) -> int | None:
        known = self._ids.get(_key(dbapi_connection))
        return known if known is not None else _thread_id_now(dbapi_connection)

    def cancel_statement(self, dbapi_connection: Any) -> None:
        self.cancel_statements((dbapi_connection,))

    def cancel_statements(self, dbapi_connections: Sequence[Any]) -> None:
        """Kill the statements of a cancelled run's threads, from one side connection per server."""
        thread_ids: dict[URL, list[int]] = {}
        for dbapi_connection in dbapi_connections:
            url = self._urls.get(_key(dbapi_connection))
            thread_id = self._thread_id(dbapi_connection)
            if url is None or thread_id is None:
                logger.debug("MySQL: no way to stop this connection's statement")
                continue
            thread_ids.setdefault(url, []).append(thread_id)
        for url, ids in thread_ids.items():
            kill_queries(url, ids)


def _key(dbapi_connection: Any) -> Any:
    """The driver's own connection object, which a thread's unit sees as the DBAPI connection."""
    return getattr(dbapi_connection, "driver_connection", dbapi_connection)


DIALECT = MySQL()
