"""
MySQL and MariaDB: transient errors, lost connections, and stopping a statement on the server.

The drivers are aiomysql, asyncmy, pymysql and mysqlclient. A MySQL server goes on running a
statement whose client went away, so a statement is stopped with ``KILL QUERY <id>`` from a
short-lived side connection: when the pool invalidates a connection, and for a cancelled run's
threads. The server's id of each connection is read when it is made, because mysqlclient refuses
any call on a connection while another thread runs a statement on it. :meth:`MySQL.check_engine`
refuses an ``autocommit`` in the engine's URL.
``docs/how-to/mysql.md`` tells the drivers' behaviours these guard against.
"""

from __future__ import annotations

import logging
import threading
import weakref
from collections.abc import Sequence
from typing import Any

from sqlalchemy import event
from sqlalchemy import exc as sa_exc
from sqlalchemy.engine import URL, Engine

from .base import STATEMENT_ENDED, Dialect

__all__ = ["DIALECT", "NAMES", "MySQL"]

logger = logging.getLogger("boundeddb.dialects")

NAMES = ("mysql", "mariadb")

#: MySQL/MariaDB error numbers that mean "the same transaction may well succeed if run again".
#: A deadlock (1213) rolls the whole transaction back; a lock wait timeout (1205) only the statement,
#: but the runner rolls back the whole unit before it retries it.
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
        1927,  # ER_CONNECTION_KILLED (MariaDB)
        2003,  # CR_CONN_HOST_ERROR: cannot connect
        2006,  # CR_SERVER_GONE_ERROR
        2013,  # CR_SERVER_LOST
        2055,  # CR_SERVER_LOST_EXTENDED
    }
)
#: ER_NO_SUCH_THREAD: the statement's connection is already gone, nothing to kill.
NO_SUCH_THREAD = 1094


def errno(error: BaseException | None) -> object:
    """The error number of a MySQL driver error (its first argument), or ``None``."""
    args: tuple[object, ...] = getattr(error, "args", ())
    return args[0] if args else None


def server_thread_id(dbapi_connection: Any) -> int | None:
    """The server's id of a DBAPI connection (pymysql, aiomysql and asyncmy keep it from the handshake)."""
    raw = getattr(dbapi_connection, "driver_connection", dbapi_connection)  # SQLAlchemy's async adapters
    ident = getattr(raw, "server_thread_id", None)
    if isinstance(ident, tuple) and ident:
        ident = ident[0]
    if isinstance(ident, int):
        return ident
    thread_id = getattr(raw, "thread_id", None)  # mysqlclient
    return int(thread_id()) if callable(thread_id) else None


def _thread_id_now(dbapi_connection: Any) -> int | None:
    """:func:`server_thread_id`, or ``None`` if the driver will not say now (mysqlclient, busy elsewhere)."""
    try:
        return server_thread_id(dbapi_connection)
    except Exception as error:
        logger.debug("MySQL: cannot read this connection's server id now: %s", error)
        return None


def kill_queries(url: URL, thread_ids: Sequence[int]) -> None:
    """
    ``KILL QUERY`` each of ``thread_ids`` from one new pymysql connection to ``url``'s server (opening
    it is most of the cost: tens of milliseconds on a busy server); failures are logged.
    """
    try:
        import pymysql  # type: ignore[import-untyped,unused-ignore]
    except ImportError:  # pragma: no cover - the mysql extra installs it
        logger.warning("MySQL: cannot stop a statement on the server without pymysql (boundeddb[mysql])")
        return
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
        connection = pymysql.connect(**options)
    except Exception as error:
        logger.warning("MySQL: KILL QUERY %s failed: %s", ", ".join(map(str, thread_ids)), error)
        return
    try:
        with connection.cursor() as cursor:
            for thread_id in thread_ids:
                try:
                    cursor.execute(f"KILL QUERY {int(thread_id)}")
                except Exception as error:
                    if errno(error) != NO_SUCH_THREAD:
                        logger.warning("MySQL: KILL QUERY %d failed: %s", thread_id, error)
                else:
                    logger.debug("MySQL: KILL QUERY %d sent", thread_id)
    finally:
        connection.close()


def kill_query(url: URL, thread_id: int) -> None:
    """``KILL QUERY thread_id`` from a new pymysql connection to ``url``'s server; failures are logged."""
    kill_queries(url, (thread_id,))


class MySQL(Dialect):
    name = "mysql"
    stops_statements = True

    def __init__(self) -> None:
        #: The URL of the engine each DBAPI connection came from, for the side connection.
        self._urls: weakref.WeakKeyDictionary[Any, URL] = weakref.WeakKeyDictionary()
        #: Each DBAPI connection's server id, read when it was made (see the module docstring).
        self._ids: weakref.WeakKeyDictionary[Any, int] = weakref.WeakKeyDictionary()
        self._prepared: weakref.WeakSet[Any] = weakref.WeakSet()
        self._lock = threading.Lock()

    def _is_lost(self, orig: BaseException) -> bool:
        if errno(orig) in LOST_ERRNOS:
            return True
        return super()._is_lost(orig)

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

        def on_connect(dbapi_connection: Any, _record: Any) -> None:
            key = _key(dbapi_connection)
            self._urls[key] = url
            if (ident := _thread_id_now(dbapi_connection)) is not None:
                self._ids[key] = ident

        def on_invalidate(dbapi_connection: Any, _record: Any, exception: BaseException | None) -> None:
            if exception is STATEMENT_ENDED:  # a thread runner's discard: its statement has returned
                return
            thread_id = self._thread_id(dbapi_connection)
            if thread_id is not None:  # never block the caller (an event loop): a thread of its own
                threading.Thread(target=kill_query, args=(url, thread_id), daemon=True).start()

        event.listen(engine.pool, "connect", on_connect)
        event.listen(engine.pool, "invalidate", on_invalidate)

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
    """The driver's own connection object (what a thread's unit sees as the DBAPI connection)."""
    return getattr(dbapi_connection, "driver_connection", dbapi_connection)


DIALECT = MySQL()
