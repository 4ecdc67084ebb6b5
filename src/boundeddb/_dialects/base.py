"""
What boundeddb needs to know of a database and its drivers, with the answers for an unknown one.

Each module of this package describes one database: a :class:`Dialect` subclass named ``DIALECT``,
and ``NAMES``, the ``engine.dialect.name`` values it serves. The defaults here assume
nothing: no error is transient but a lost connection, statements cannot be stopped from another
thread, and a thread's unit cannot be given a per-statement timeout.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

from sqlalchemy import bindparam, select
from sqlalchemy import exc as sa_exc

from .._errors import UnitTimeout

__all__ = ["COMMITTED_SINCE_RESTART", "STATEMENT_ENDED", "Dialect", "is_socket_error", "may_hold_connections"]

logger = logging.getLogger("boundeddb.dialects")

#: What :meth:`Dialect.xact_status_sql` answers when the server says ``committed`` of the id, but has
#: restarted or recovered from a crash since the id was read, and may have handed it out again: the
#: commit may be another transaction's.
COMMITTED_SINCE_RESTART = "committed, restarted since"
#: How many driver errors back, each raised while handling the one before, a lost connection is looked for.
_CONTEXT_DEPTH = 3


def is_socket_error(error: BaseException | None) -> bool:
    """
    A refused, reset or aborted connection: :class:`ConnectionError`, or a bare :class:`OSError`,
    which is asyncio's "Multiple exceptions" when every address refused. Not its other subclasses:
    :class:`TimeoutError`, :class:`FileNotFoundError` and :class:`PermissionError` are OSErrors too.
    """
    return isinstance(error, ConnectionError) or type(error) is OSError


def may_hold_connections(pool: Any) -> bool:
    """
    Whether ``pool`` may hold connections made before a runner's listeners on it (a ``QueuePool``
    counts them; of any other pool, assume so).
    """
    try:
        return bool(pool.checkedin() + pool.checkedout() > 0)
    except AttributeError:
        return True


class StatementEnded(Exception):
    """Why a connection is discarded when no statement of it still runs on the server: none to stop."""


#: Passed to ``Connection.invalidate()`` for a connection discarded after its statement returned.
STATEMENT_ENDED = StatementEnded("discarded after its statement's cancellation: no statement running")


class Dialect:
    """The facts of one database and its drivers that the runners act on."""

    #: ``engine.dialect.name``, for messages.
    name = "default"

    # -- what an error means -------------------------------------------------------------------

    def is_connection_error(self, error: BaseException) -> bool:
        """
        Whether ``error`` says the connection to the server was lost, refused or invalidated.

        So is a driver error whose ``__context__`` is one: after a lost socket, the rollback that
        SQLAlchemy attempts can fail with words of its own, and that error is the one raised:
        psycopg's "another command is already in progress".
        """
        if not isinstance(error, sa_exc.DBAPIError):
            return is_socket_error(error)
        candidate: BaseException | None = error
        for _ in range(_CONTEXT_DEPTH):
            if not isinstance(candidate, sa_exc.DBAPIError):
                return False
            if candidate.connection_invalidated:
                return True
            orig = candidate.orig
            if orig is not None and self._is_lost(orig):
                return True
            candidate = candidate.__context__
        return False

    def _is_lost(self, orig: BaseException) -> bool:
        """Whether a driver's own exception says the connection is gone."""
        return is_socket_error(orig) or is_socket_error(orig.__cause__)

    def is_transient(self, error: BaseException) -> bool:
        """Whether ``error`` is worth a retry in a fresh transaction: :func:`boundeddb.is_transient`."""
        return self.is_connection_error(error)

    def is_overload(self, error: BaseException) -> bool:
        """
        Whether ``error`` says the database or the pool is overloaded, for ``limit="auto"``:
        a unit or pool timeout, or a transient error that is not a lost connection, such as a
        deadlock, a serialization failure or a lock wait timeout.
        """
        if isinstance(error, (UnitTimeout, sa_exc.TimeoutError)):
            return True
        return self.is_transient(error) and not self.is_connection_error(error)

    def commit_fate_unknown(self, error: BaseException) -> bool:
        """Whether ``error``, raised by COMMIT, leaves open whether the transaction committed."""
        return self.is_connection_error(error) or isinstance(error, TimeoutError)

    def note_lost_connection(self, error: BaseException, dbapi_connection: Any) -> None:
        """
        Mark a driver error as a lost connection if the unit's own connection says it is closed.

        SQLAlchemy recognises disconnects by their messages, and misses some, such as psycopg's
        "sending query failed: ... another command is already in progress" after the backend was
        terminated. The DBAPI connection's own state is the better witness: if it is closed, set
        SQLAlchemy's ``connection_invalidated`` flag, so that the error is retried as transient, or
        reported as ``commit_unknown`` during COMMIT, and the connection is discarded, not reused.
        ``dbapi_connection`` is ``None`` when SQLAlchemy has already discarded it.
        """
        if not isinstance(error, sa_exc.DBAPIError) or error.connection_invalidated:
            return
        if dbapi_connection is not None and self.driver_says_closed(dbapi_connection):
            error.connection_invalidated = True

    def driver_says_closed(self, dbapi_connection: Any) -> bool:
        """Whether the driver's own connection object reports itself closed."""
        raw = getattr(dbapi_connection, "driver_connection", dbapi_connection)  # asyncpg's adapter
        is_closed = getattr(raw, "is_closed", None)
        return bool(is_closed() if callable(is_closed) else getattr(raw, "closed", False))

    # -- verifying commits: verify_commits=True ----------------------------------------------------

    #: SQL that returns, as text, the current transaction's id and what else :meth:`xact_status_sql`
    #: needs to know, or ``NULL`` if it wrote nothing yet. ``None`` where the database cannot be
    #: asked afterwards what became of a transaction whose connection was lost, so that
    #: ``verify_commits=True`` is refused.
    current_xid_sql: str | None = None

    def xact_status_sql(self, xid: str) -> str:
        """
        SQL that returns what became of the transaction ``xid``, a value of :attr:`current_xid_sql`:
        ``'committed'``, ``'aborted'``, ``'in progress'``, ``NULL`` if the server no longer knows,
        or :data:`COMMITTED_SINCE_RESTART`.
        """
        raise NotImplementedError

    def connect_timeout_params(self, driver: str, seconds: float) -> dict[str, Any]:
        """Connect arguments that make ``driver`` give up opening a connection after ``seconds``."""
        return {}

    def check_engine(self, engine: Any) -> None:
        """Raise :class:`ValueError` for an engine where a unit cannot be one transaction. Here, none."""

    # -- stopping statements ------------------------------------------------------------------------

    #: Whether :meth:`cancel_statement` can stop a statement from another thread.
    stops_statements = False

    def prepare_engine(self, engine: Any) -> None:
        """Set up what this database needs on a runner's engine, once per pool. Nothing by default."""

    def statement_timeout_sql(self, timeout: float) -> str | None:
        """SQL that makes the server stop any statement of this transaction after ``timeout`` s, if any."""
        return None

    def load_prepare_sql(self, driver_connection: Any) -> str | None:
        """
        SQL that a ``load()`` chunk's transaction runs first, if this database needs it before the
        savepoints that isolate refused rows.
        """
        return None

    #: The most keys one journal lookup asks for, within the driver's limit on parameters.
    most_keys_looked_up = 500

    def journal_lookup(self, table: Any) -> Any:
        """
        The statement that returns which of the bound list ``keys`` have a row of the bound ``job``
        in the journal ``table``: here an expanding ``IN``.
        """
        return select(table.c.item_key).where(
            table.c.job == bindparam("job"), table.c.item_key.in_(bindparam("keys", expanding=True))
        )

    def done_keys(self, result: Any, keys: list[str]) -> set[str]:
        """Which of ``keys`` have a row, from the ``result`` of :meth:`journal_lookup`: its rows' keys."""
        return {row[0] for row in result}

    def lock_wait_sql(self, seconds: int) -> str | None:
        """
        SQL that bounds how long this connection waits for a row lock, or None if the driver does.

        For the journal's probe of a lost COMMIT. A setting that outlives the transaction leaves
        the connection to be discarded afterwards: see :attr:`lock_wait_outlives_transaction`.
        """
        return None

    #: Whether :meth:`lock_wait_sql` sets the session, not only the transaction.
    lock_wait_outlives_transaction = False

    def is_statement_timeout(self, error: BaseException) -> bool:
        """Whether ``error`` is the server stopping a statement for :meth:`statement_timeout_sql`."""
        return False

    def cancel_statement(self, dbapi_connection: Any) -> None:
        """Ask the server to stop the statement running on ``dbapi_connection``, from another thread."""
        logger.debug("%s: no way to stop a statement from another thread", self.name)

    def cancel_statements(self, dbapi_connections: Sequence[Any]) -> None:
        """Stop the statements of a cancelled run, running on ``dbapi_connections``, one after the other."""
        for dbapi_connection in dbapi_connections:
            self.cancel_statement(dbapi_connection)

    def _call_cancel(self, dbapi_connection: Any, *methods: str) -> None:
        """Call the first of ``methods`` the DBAPI connection has. The unit may have just finished."""
        for method in methods:
            cancel = getattr(dbapi_connection, method, None)
            if cancel is not None:
                try:
                    cancel()
                except Exception as error:
                    logger.debug("cancelling a unit's statement failed: %s", type(error).__qualname__)
                return

    # -- discarded connections ---------------------------------------------------------------------

    def ending_connections(self, url: Any) -> bool:
        """
        Whether connections discarded from an engine on ``url`` are still being ended on the server
        from another thread, as MySQL's ``KILL CONNECTION`` does. Never here: a closed connection ends
        at once.
        """
        return False

    def wait_connections_ended(self, url: Any) -> None:
        """Block until :meth:`ending_connections` is over for ``url``, for at most a few seconds."""
