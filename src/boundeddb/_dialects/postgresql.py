"""
The PostgreSQL dialect, for asyncpg, psycopg 3 and psycopg2.

It reads SQLSTATEs, tells a lost connection, sets ``statement_timeout`` and cancels statements.
It ends the backend of each connection a pool discards (:mod:`.pg_backends`), and reads a
transaction's status, which ``verify_commits`` needs.
"""

from __future__ import annotations

import logging
import math
import re
import threading
import weakref
from itertools import compress
from typing import Any

from sqlalchemy import event, text
from sqlalchemy import exc as sa_exc
from sqlalchemy.engine import URL, Engine

from .base import COMMITTED_SINCE_RESTART, Dialect, may_hold_connections
from .enders import Enders
from .pg_backends import IDENTITY_SQL, BackendId, SideTarget, driver_pid, end_backends, side_target

__all__ = ["DIALECT", "NAMES", "PostgreSQL", "sqlstate"]

NAMES = ("postgresql",)

#: SQLSTATEs that mean "the same transaction may well succeed if run again".
TRANSIENT_SQLSTATES = frozenset(
    {
        "40001",  # serialization_failure
        "40P01",  # deadlock_detected
        "57P01",  # admin_shutdown: pg_terminate_backend, or a fast shutdown
        "57P02",  # crash_shutdown
        "57P03",  # cannot_connect_now: the server is starting up or shutting down
    }
)
#: SQLSTATEs of a backend that is going away: the connection is lost.
_SHUTDOWN_SQLSTATES = frozenset({"57P01", "57P02", "57P03"})
#: SQLSTATE class 08: connection exceptions.
_CONNECTION_EXCEPTION_CLASS = "08"
#: query_canceled: PostgreSQL's answer to statement_timeout and to a cancel request.
QUERY_CANCELED = "57014"
#: A journal lookup's flags, b"0" and b"1" per key, as the bytes 0 and 1 that ``compress`` selects by.
_FLAG_BITS = bytes.maketrans(b"01", b"\x00\x01")
#: psycopg 3's message for a connection whose socket is gone, in ``psycopg/waiting.py``.
_PSYCOPG_SOCKET_CLOSED = "connection socket closed"
#: The key in a pool entry's ``info`` of its connection's :class:`BackendId`, or None if not to be ended.
_BACKEND = "boundeddb.postgresql.backend"

logger = logging.getLogger("boundeddb.dialects")


#: The server's incarnation, as text: when its postmaster started (microseconds since 1970, whatever
#: the session's TimeZone, DateStyle or extra_float_digits), and where its last crash recovery ended
#: (``-`` if it started without one). An immediate restart changes the first. A backend's crash
#: makes the postmaster reinitialise without restarting, and each recovery ends further on in the
#: WAL. Both functions read shared memory, and any role may call them.
_INCARNATION = (
    "CAST(CAST(extract(epoch FROM pg_postmaster_start_time()) * 1000000 AS bigint) AS text) "
    "|| ' ' || coalesce(CAST(pg_last_wal_replay_lsn() AS text), '-')"
)
#: What current_xid_sql reads: the id, then the incarnation.
_XID = re.compile(r"([0-9]+) ([0-9]+ (?:[0-9A-F]+/[0-9A-F]+|-))")


def sqlstate(error: BaseException | None) -> str | None:
    """The SQLSTATE of a driver error, whichever of psycopg2, psycopg and asyncpg raised it."""
    if error is None:
        return None
    for candidate in (error, error.__cause__):
        if candidate is None:
            continue
        for attribute in ("sqlstate", "pgcode"):
            code = getattr(candidate, attribute, None)
            if isinstance(code, str):
                return code
    return None


class PostgreSQL(Dialect):
    name = "postgresql"
    stops_statements = True

    def __init__(self) -> None:
        #: How to open a side connection to each prepared engine's server, by its URL.
        self._targets: dict[URL, SideTarget] = {}
        self._prepared: weakref.WeakSet[Any] = weakref.WeakSet()
        self._enders: Enders[BackendId] = Enders("boundeddb-pg-end", self._end)
        self._lock = threading.Lock()

    # -- discarded connections: the module docstring of pg_backends ---------------------------------

    def prepare_engine(self, engine: Engine) -> None:
        with self._lock:
            if engine.pool in self._prepared:
                return
            self._prepared.add(engine.pool)
        target = side_target(engine.dialect, engine.url)
        if target is None:
            return
        url = engine.url
        with self._lock:
            self._targets[url] = target

        def on_connect(dbapi_connection: Any, record: Any) -> None:
            record.info[_BACKEND] = _read_backend(dbapi_connection)

        def on_checkout(dbapi_connection: Any, record: Any, _proxy: Any) -> None:
            if _BACKEND not in record.info:
                on_connect(dbapi_connection, record)

        def on_invalidate(dbapi_connection: Any, record: Any, exception: BaseException | None) -> None:
            # Also after its statement returned (STATEMENT_ENDED): the connection's close may not reach
            # the server, which then keeps the transaction open.
            backend = record.info.get(_BACKEND) if record is not None else None
            if backend is not None:
                self._enders.end_soon(url, backend)

        event.listen(engine.pool, "connect", on_connect)
        event.listen(engine.pool, "invalidate", on_invalidate)
        if may_hold_connections(engine.pool):  # made before the runner: met at their next checkout
            event.listen(engine.pool, "checkout", on_checkout)

    def _end(self, url: Any, backends: Any, more: Any) -> None:
        with self._lock:
            target = self._targets[url]
        end_backends(target, backends, more)

    def ending_connections(self, url: Any) -> bool:
        return self._enders.ending(url)

    def wait_connections_ended(self, url: Any) -> None:
        self._enders.wait(url)

    # -- what an error means -------------------------------------------------------------------

    def _is_lost(self, orig: BaseException) -> bool:
        code = sqlstate(orig)
        if code is not None:
            return code.startswith(_CONNECTION_EXCEPTION_CLASS) or code in _SHUTDOWN_SQLSTATES
        # psycopg 3's words when its socket is gone. Its C wait raises them with no OSError cause,
        # and SQLAlchemy goes by the connection's closed/broken flags, which may not be set yet.
        if str(orig) == _PSYCOPG_SOCKET_CLOSED:
            return True
        return super()._is_lost(orig)

    def is_transient(self, error: BaseException) -> bool:
        if self.is_connection_error(error):
            return True
        return isinstance(error, sa_exc.DBAPIError) and sqlstate(error.orig) in TRANSIENT_SQLSTATES

    def load_prepare_sql(self, driver_connection: Any) -> str:
        """Deferred constraints checked at the end of each statement: a refused row is found before COMMIT."""
        return "SET CONSTRAINTS ALL IMMEDIATE"

    def statement_timeout_sql(self, timeout: float) -> str:
        milliseconds = max(1, round(timeout * 1000))
        return f"SET LOCAL statement_timeout = {milliseconds}"

    #: One array parameter, however many keys.
    most_keys_looked_up = 10_000

    def journal_lookup(self, table: Any) -> Any:
        # One index probe per key, whatever plan the table's statistics, or their absence, suggest:
        # `job = $1 AND item_key = ANY($2)` may scan the job's whole range of the index instead.
        # One row back, a '1' or '0' per key in their order: a resume's 10,000 done keys would
        # otherwise come back as 10,000 rows to read and hash.
        name = table.name.replace('"', '""')
        return text(
            "SELECT string_agg(CASE WHEN hit.one IS NULL THEN '0' ELSE '1' END, '' ORDER BY k.i) "
            "FROM unnest(CAST(:keys AS VARCHAR[])) WITH ORDINALITY AS k(key, i) LEFT JOIN LATERAL "
            f'(SELECT 1 AS one FROM "{name}" AS t WHERE t.job = :job AND t.item_key = k.key LIMIT 1) AS hit '
            "ON true"
        )

    def done_keys(self, result: Any, keys: list[str]) -> set[str]:
        flags: str = result.scalar_one()
        return set(compress(keys, flags.encode().translate(_FLAG_BITS)))

    def lock_wait_sql(self, seconds: int) -> str:
        return f"SET LOCAL lock_timeout = {seconds * 1000}"

    def is_statement_timeout(self, error: BaseException) -> bool:
        return isinstance(error, sa_exc.DBAPIError) and sqlstate(error.orig) == QUERY_CANCELED

    def cancel_statement(self, dbapi_connection: Any) -> None:
        # psycopg 3.2 and later have cancel_safe, older psycopg 3 and psycopg2 have cancel.
        self._call_cancel(dbapi_connection, "cancel_safe", "cancel")

    # PostgreSQL 13+: the top-level transaction's full 64-bit id, which never wraps around, NULL
    # until it writes. pg_xact_status answers for it from any connection while the server keeps its
    # commit log, which covers any xid of the last few minutes by far. For an older one it says NULL.
    # After a crash, though, an id whose transaction never reached the WAL on disk is handed out
    # again, and pg_xact_status then answers for another transaction: so the id is read with the
    # server's incarnation, in the same value.
    current_xid_sql = f"SELECT CAST(pg_current_xact_id_if_assigned() AS text) || ' ' || {_INCARNATION}"

    def xact_status_sql(self, xid: str) -> str:
        match = _XID.fullmatch(xid)
        if match is None:
            raise ValueError(f"not a value of current_xid_sql: {xid!r}")
        number, incarnation = match.groups()
        # No transaction at or after pg_snapshot_xmax has ended, and pg_xact_status raises for an
        # id not handed out yet: so it is asked only below. In the incarnation the id was read in,
        # an id at or beyond it is the unit's transaction, still running. Since a restart or a crash
        # recovery, the id was not handed out again, or is another transaction's, still running;
        # either way the unit's transaction did not commit, since its commit record on disk would
        # have moved the next id past it. If the id was handed out again and that transaction
        # aborted, the unit's did not commit either. But 'committed' may be the other's.
        return (
            "SELECT CASE WHEN q.x >= pg_snapshot_xmax(pg_current_snapshot()) "
            "THEN CASE WHEN q.same THEN 'in progress' ELSE 'aborted' END "
            "WHEN q.same THEN pg_xact_status(q.x) "
            f"WHEN pg_xact_status(q.x) = 'committed' THEN '{COMMITTED_SINCE_RESTART}' "
            "ELSE pg_xact_status(q.x) END "
            f"FROM (SELECT CAST('{number}' AS xid8) AS x, {_INCARNATION} = '{incarnation}' AS same) AS q"
        )

    def connect_timeout_params(self, driver: str, seconds: float) -> dict[str, Any]:
        if driver in ("asyncpg", "pg8000"):
            return {"timeout": seconds}
        # libpq, under psycopg and psycopg2: whole seconds, and less than 2 counts as 2.
        return {"connect_timeout": max(2, math.ceil(seconds))}


def _read_backend(dbapi_connection: Any) -> BackendId | None:
    """
    A new connection's backend, or None if its driver's pid is not the server's (a pooler between)
    or unknown. Run in the pool's ``connect`` event, so it ends the transaction the query began.
    """
    pid = driver_pid(dbapi_connection)
    if pid is None:
        return None
    try:
        cursor = dbapi_connection.cursor()
        try:
            cursor.execute(IDENTITY_SQL)
            row = cursor.fetchone()
        finally:
            cursor.close()
    except Exception as error:  # the connection is unusable: the pool will find out
        logger.debug("PostgreSQL: reading a new connection's backend failed: %s", error)
        row = None
    finally:
        try:
            dbapi_connection.rollback()
        except Exception as error:
            logger.debug("PostgreSQL: rolling back after reading a connection's backend failed: %s", error)
    if row is None or int(row[0]) != pid:
        return None
    return BackendId(pid, int(row[1]))


DIALECT = PostgreSQL()
