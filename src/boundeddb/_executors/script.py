"""
The transaction script of one attempt, as async and sync twins side by side.

Begin, connect, run the unit, check it left the transaction alone, read the transaction's id
with ``verify_commits``, commit, and always close. Each step is reported to a guard, which decides
where a cancellation or a timeout takes effect. See "The transaction script" in
``docs/explanation/architecture.md``.
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import Callable
from time import perf_counter
from typing import Any, Protocol

from sqlalchemy.engine import Connection
from sqlalchemy.ext.asyncio import AsyncSession
from sqlalchemy.orm import Session
from sqlalchemy.pool import PoolProxiedConnection

from .._core.attempts import CommitUnknown, ConnectFailed, UnitMisuse
from .._dialects import STATEMENT_ENDED, Dialect
from .._errors import UnitTimeout

__all__ = [
    "AsyncGuard",
    "DeadlinePassed",
    "Stopped",
    "SyncGuard",
    "attempt_async",
    "attempt_sync",
    "flush_and_read_xid",
    "note_failure",
    "returned_awaitable",
    "returned_no_awaitable",
]

logger = logging.getLogger("boundeddb.units")


class AsyncGuard(Protocol):
    #: The connection the unit's session checked out in this attempt, if it did.
    connection: PoolProxiedConnection | None

    def connecting(self, index: int) -> None: ...
    def connect_failed(self, error: Exception) -> bool: ...
    def committing(self) -> None: ...
    def interrupted(self, error: BaseException) -> Exception | None: ...
    def closing(self) -> None: ...
    def closed(self) -> None: ...


class DeadlinePassed(Exception):
    """A sync guard refuses to commit: ``deadlines.py`` stopped the unit's statement at its timeout."""


class Stopped(BaseException):
    """
    A thread's run was cancelled: the attempt stops here and rolls back. It never reaches a unit's
    caller. Raised by the guard at a step, and by a sync script whose unit failed once the run was
    cancelled: that failure is the cancellation's doing (its statement was stopped), not the unit's.
    """


class SyncGuard(Protocol):
    cancelled: bool
    #: The unit's statement was stopped at its timeout: the attempt fails with UnitTimeout.
    timed_out: bool

    def connecting(self) -> None: ...
    def running(self, dbapi_connection: Any) -> None: ...
    def committing(self) -> None: ...
    def closing(self) -> bool:
        """Whether to discard the connection rather than return it to the pool."""
        ...

    def closed(self) -> None: ...


def ended_transaction_message(index: int) -> str:
    return (
        f"unit {index} ended the runner's transaction itself (it called session.commit(), "
        "rollback() or close()): whatever it committed stays committed and the rest was rolled "
        "back. The runner owns the transaction and commits when the unit returns: remove the call "
        "(use session.flush() to send changes early)"
    )


def returned_no_awaitable(result: object, index: int, runner: str) -> UnitMisuse:
    """The misuse of an async runner's unit that returned something other than an awaitable."""
    msg = (
        f"unit {index} returned {type(result).__name__}, not an awaitable: "
        f"{runner} runs `async def unit(session: AsyncSession)`; "
        "run plain functions with ThreadOffloadRunner"
    )
    return UnitMisuse(msg)


def returned_awaitable(value: object, index: int) -> UnitMisuse:
    """The misuse of a thread unit that returned an awaitable, which is closed unawaited."""
    if inspect.iscoroutine(value):
        value.close()
    msg = (
        f"unit {index} returned an awaitable: ThreadOffloadRunner runs plain "
        "`def unit(session: Session)`; run async units with SemaphoreRunner"
    )
    return UnitMisuse(msg)


# -- async: AsyncSession, in the worker's own task ------------------------------------------------------


async def attempt_async(
    sessions: Callable[[], AsyncSession],
    dialect: Dialect,
    runner: str,
    xid_sql: str | None,
    guard: AsyncGuard,
    unit: Any,
    index: int,
) -> Any:
    """
    Run ``unit`` once in a new AsyncSession and transaction: its value, or it raises.

    With ``xid_sql``, given by ``verify_commits``, a :class:`CommitUnknown` carries the
    transaction's id, ``None`` if it wrote nothing, and the unit's value.

    The session connects at the unit's first statement, as it would in hand-written code: asking
    for the connection up front costs a greenlet per unit. The guard hears of the checkout from the
    pool through ``checkouts.HOOKS``, so an error before it is known to have sent nothing.
    """
    session = sessions()
    xid = value = None
    try:
        transaction = session.sync_session.begin()
        guard.connecting(index)
        result = unit(session)
        if not inspect.isawaitable(result):
            raise returned_no_awaitable(result, index, runner)
        try:
            value = await result
        except Exception as error:
            note_failure(dialect, guard, error)
            raise
        if session.sync_session.get_transaction() is not transaction:
            raise UnitMisuse(ended_transaction_message(index))
        if xid_sql is not None:
            try:
                xid = await session.run_sync(flush_and_read_xid, xid_sql, guard)
            except Exception as error:  # before COMMIT: a failure like any of the unit's own
                note_failure(dialect, guard, error)
                raise
        guard.committing()
        try:
            await session.commit()  # connects here if the unit sent nothing itself
        except Exception as error:
            note_failure(dialect, guard, error)
            # A failed COMMIT can leave the transaction open on the connection: discard it.
            await invalidate_async(session, guard.connection)
            if dialect.commit_fate_unknown(error):
                probe = getattr(unit, "probe_async", None)
                if probe is not None:  # a journalled unit: its journal row tells what became of it
                    raise await probe(CommitUnknown(error, xid, value)) from None
                raise CommitUnknown(error, xid, value) from None
            raise
        return value
    except BaseException as error:
        replacement = guard.interrupted(error)
        if replacement is None:
            raise
        if isinstance(replacement, CommitUnknown):  # timed out during COMMIT
            replacement.xid, replacement.value = xid, value
        raise replacement from (error if isinstance(error, Exception) else None)
    finally:
        guard.closing()
        try:
            await close_async(session, guard.connection)
        finally:
            guard.closed()


def flush_and_read_xid(session: Session, xid_sql: str, guard: AsyncGuard) -> Any:
    """The transaction's id once the unit's pending changes are sent, as COMMIT would send them first."""
    session.flush()
    if guard.connection is None:  # it sent nothing, so it has no id
        return None
    return session.connection().exec_driver_sql(xid_sql).scalar()


def note_failure(dialect: Dialect, guard: AsyncGuard, error: Exception) -> None:
    """Raise :class:`ConnectFailed` if ``error`` is the session failing to connect, else note a lost one."""
    connection = guard.connection
    if connection is None:
        if guard.connect_failed(error):
            raise ConnectFailed(error) from None
    else:
        dialect.note_lost_connection(error, connection.dbapi_connection)


async def close_async(session: AsyncSession, connection: PoolProxiedConnection | None) -> None:
    """Roll back whatever is open and return the connection, or invalidate it if that fails."""
    try:
        await session.close()
    except Exception as error:
        logger.warning(_CLOSE_FAILED, type(error).__qualname__)
        await invalidate_async(session, connection)


async def invalidate_async(session: AsyncSession, connection: PoolProxiedConnection | None) -> None:
    """Discard ``connection`` from the pool, which closes it: not leaked, not reused mid-transaction."""
    if connection is None or not connection.is_valid:  # never connected, or already discarded
        return
    try:
        await session.run_sync(_invalidate, connection)
    except Exception as error:  # already closed or gone: nothing left to return
        logger.debug(_INVALIDATE_FAILED, type(error).__qualname__)


def _invalidate(_: Session, connection: PoolProxiedConnection) -> None:
    connection.invalidate()


# -- sync: Session, in a worker thread ------------------------------------------------------------------


def attempt_sync(
    sessions: Callable[[], Session],
    dialect: Dialect,
    timeout: float | None,
    xid_sql: str | None,
    guard: SyncGuard,
    unit: Any,
    index: int,
) -> Any:
    """
    Run ``unit`` once in a new Session and transaction, in this thread: its value, or it raises.

    ``xid_sql`` as for :func:`attempt_async`.
    """
    session = sessions()
    connection: Connection | None = None
    try:
        transaction = session.begin()
        guard.connecting()
        try:
            connection = session.connection()
        except Exception as error:
            raise ConnectFailed(error) from None
        if timeout is not None and (statement_timeout := dialect.statement_timeout_sql(timeout)):
            connection.exec_driver_sql(statement_timeout)
        dbapi_connection = connection.connection.dbapi_connection
        guard.running(dbapi_connection)
        started = perf_counter()
        try:
            value = unit(session)
        except Exception as error:
            dialect.note_lost_connection(error, dbapi_connection)
            if guard.cancelled:  # its run was cancelled meanwhile: not the unit's failure, nor its timeout
                raise Stopped from error
            if timeout is not None and (guard.timed_out or dialect.is_statement_timeout(error)):
                raise UnitTimeout(index, timeout) from error
            raise
        if inspect.isawaitable(value):
            raise returned_awaitable(value, index)
        if session.get_transaction() is not transaction:
            raise UnitMisuse(ended_transaction_message(index))
        if timeout is not None and (guard.timed_out or perf_counter() - started > timeout):
            raise UnitTimeout(index, timeout)
        xid = None
        if xid_sql is not None:
            try:
                session.flush()  # what COMMIT would send first: the id must cover it
                xid = connection.exec_driver_sql(xid_sql).scalar()
            except Exception as error:  # before COMMIT: a failure like any of the unit's own
                dialect.note_lost_connection(error, dbapi_connection)
                if guard.cancelled:
                    raise Stopped from error
                raise
        try:
            guard.committing()
        except DeadlinePassed:
            assert timeout is not None  # only StatementDeadlines, set up for a timeout, passes a deadline
            raise UnitTimeout(index, timeout) from None
        try:
            session.commit()
        except Exception as error:
            dialect.note_lost_connection(error, dbapi_connection)
            # A failed COMMIT can leave the transaction open on the connection: discard it.
            invalidate_sync(connection)
            if dialect.commit_fate_unknown(error):
                probe = getattr(unit, "probe_sync", None)
                if probe is not None:  # as in attempt_async
                    raise probe(CommitUnknown(error, xid, value)) from None
                raise CommitUnknown(error, xid, value) from None
            raise
        return value
    finally:
        if guard.closing():  # a cancellation was sent to its statement: never back to the pool
            invalidate_sync(connection, STATEMENT_ENDED)
        try:
            close_sync(session, connection)
        finally:
            guard.closed()


def close_sync(session: Session, connection: Connection | None) -> None:
    """Roll back whatever is open and return the connection, or invalidate it if that fails."""
    try:
        session.close()
    except Exception as error:
        logger.warning(_CLOSE_FAILED, type(error).__qualname__)
        invalidate_sync(connection)


def invalidate_sync(connection: Connection | None, reason: BaseException | None = None) -> None:
    """Discard ``connection`` from the pool: neither leaked nor returned mid-transaction."""
    if connection is None:
        return
    try:
        connection.invalidate(reason)
    except Exception as error:  # already closed or gone: nothing left to return
        logger.debug(_INVALIDATE_FAILED, type(error).__qualname__)


_CLOSE_FAILED = "closing a unit's session failed (%s); invalidating its connection"
_INVALIDATE_FAILED = "invalidating a connection failed: %s"
