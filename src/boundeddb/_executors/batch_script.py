"""
The transaction script of one batch: many units one after another in one session, one COMMIT.

The twin of ``script.py`` for ``batch=``, step for step: a unit that raises fails the attempt with
:class:`~boundeddb._core.batches.BatchUnitFailed`, which names it, and everything is rolled back.
Each unit has its own ``timeout``, and the COMMIT has one of its own. The units' changes are flushed
before COMMIT, so that a failure of theirs leaves the connection in the pool. Only a failed COMMIT
discards it. What a failure means for the batch's units is the core's to decide, in ``_core/batches.py``.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from time import perf_counter
from typing import Any, Protocol

from sqlalchemy.engine import Connection
from sqlalchemy.ext.asyncio import AsyncSession
from sqlalchemy.orm import Session

from .._core.attempts import CommitUnknown, ConnectFailed, UnitMisuse
from .._core.batches import BatchUnitFailed, BatchUnits
from .._core.withdrawals import Withdrawn
from .._dialects import STATEMENT_ENDED, Dialect
from .._errors import UnitTimeout
from .script import (
    AsyncGuard,
    DeadlinePassed,
    Stopped,
    SyncGuard,
    close_async,
    close_sync,
    ended_transaction_message,
    flush_and_read_xid,
    invalidate_async,
    invalidate_sync,
    note_failure,
    returned_awaitable,
    returned_no_awaitable,
)

__all__ = ["attempt_batch_async", "attempt_batch_sync"]

#: What units commonly return, never awaitable: the per-unit check skips ``inspect.isawaitable()`` for them.
NOT_AWAITABLE: frozenset[type] = frozenset({type(None), bool, int, float, str, bytes, tuple, list, dict})


class BatchGuard(AsyncGuard, Protocol):
    def next_unit(self, index: int) -> None:
        """The batch's next unit or its COMMIT starts: a deadline of its own."""
        ...


async def attempt_batch_async(
    pinpoint: bool,
    sessions: Callable[[], AsyncSession],
    dialect: Dialect,
    runner: str,
    xid_sql: str | None,
    guard: BatchGuard,
    units: BatchUnits,
    first: int,
) -> list[Any]:
    """
    Run ``units`` once in a new AsyncSession and transaction; their values, or it raises.

    With ``pinpoint``, each unit's changes are flushed as it returns, so that a failure the batch's
    flush would name no unit for, a duplicate key say, names its unit instead.
    """
    session = sessions()
    xid = None
    values: list[Any] = []
    try:
        transaction = session.sync_session.begin()
        guard.connecting(first)
        withdrawn = units.withdrawals.indexes
        for position, (unit, index) in enumerate(units):
            if position:
                guard.next_unit(index)
            if index in withdrawn:
                raise BatchUnitFailed(position, Withdrawn(index))
            try:
                result = unit(session)
                if not inspect.isawaitable(result):
                    raise returned_no_awaitable(result, index, runner)
                values.append(await result)
                if session.sync_session.get_transaction() is not transaction:
                    raise UnitMisuse(ended_transaction_message(index))
                if pinpoint:
                    await session.flush()
            except UnitMisuse as error:
                raise BatchUnitFailed(position, error) from None
            except BaseException as error:
                own = guard.interrupted(error)  # its own deadline passed: UnitTimeout
                if own is None:
                    if not isinstance(error, Exception):
                        raise
                    note_failure(dialect, guard, error)  # raises ConnectFailed if it never connected
                    own = error
                raise BatchUnitFailed(position, own) from None
        guard.next_unit(units[-1][1])  # the COMMIT's own deadline
        try:  # the units' changes, sent before COMMIT: a failure here names no unit, and
            # leaves the connection fit to be rolled back and reused
            if xid_sql is None:
                await session.flush()
            else:
                xid = await session.run_sync(flush_and_read_xid, xid_sql, guard)
        except Exception as error:
            note_failure(dialect, guard, error)
            raise
        _commit_begins(units)  # no await of ours from here to the COMMIT
        guard.committing()
        try:
            await session.commit()
        except Exception as error:
            note_failure(dialect, guard, error)
            await invalidate_async(session, guard.connection)
            if dialect.commit_fate_unknown(error):
                probe = getattr(units[0][0], "probe_async", None)
                if probe is not None:  # journalled units: one's row tells what became of the batch
                    raise await probe(CommitUnknown(error, xid, values)) from None
                raise CommitUnknown(error, xid, values) from None
            raise
        return values
    except BaseException as error:
        if isinstance(error, (BatchUnitFailed, ConnectFailed)):
            raise
        replacement = guard.interrupted(error)
        if replacement is None:
            raise
        if isinstance(replacement, CommitUnknown):  # timed out during COMMIT
            replacement.xid, replacement.value = xid, values
        raise replacement from (error if isinstance(error, Exception) else None)
    finally:
        guard.closing()
        try:
            await close_async(session, guard.connection)
        finally:
            guard.closed()


def attempt_batch_sync(
    pinpoint: bool,
    sessions: Callable[[], Session],
    dialect: Dialect,
    timeout: float | None,
    xid_sql: str | None,
    guard: SyncGuard,
    units: BatchUnits,
    first: int,
) -> list[Any]:
    """As :func:`attempt_batch_async`, in this thread."""
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
        values: list[Any] = []
        withdrawn = units.withdrawals.indexes
        for position, (unit, index) in enumerate(units):
            if index in withdrawn:
                raise BatchUnitFailed(position, Withdrawn(index))
            guard.running(dbapi_connection)  # each unit's statements have a deadline of their own
            started = perf_counter()
            try:
                value = _run_sync_unit(session, transaction, unit, index)
                if pinpoint:
                    session.flush()
                if timeout is not None and (guard.timed_out or perf_counter() - started > timeout):
                    raise UnitTimeout(index, timeout)
            except (UnitMisuse, UnitTimeout) as error:
                raise BatchUnitFailed(position, error) from None
            except Exception as error:
                dialect.note_lost_connection(error, dbapi_connection)
                if guard.cancelled:  # as in attempt_sync
                    raise Stopped from error
                if timeout is not None and (guard.timed_out or dialect.is_statement_timeout(error)):
                    raise BatchUnitFailed(position, UnitTimeout(index, timeout)) from error
                raise BatchUnitFailed(position, error) from None
            values.append(value)
        xid = None
        try:  # as in attempt_batch_async
            session.flush()
            if xid_sql is not None:
                xid = connection.exec_driver_sql(xid_sql).scalar()
        except Exception as error:
            dialect.note_lost_connection(error, dbapi_connection)
            if guard.cancelled:
                raise Stopped from error
            raise
        _commit_begins(units)
        try:
            guard.committing()
        except DeadlinePassed:
            assert timeout is not None
            raise BatchUnitFailed(len(units) - 1, UnitTimeout(units[-1][1], timeout)) from None
        try:
            session.commit()
        except Exception as error:
            dialect.note_lost_connection(error, dbapi_connection)
            invalidate_sync(connection)
            if dialect.commit_fate_unknown(error):
                probe = getattr(units[0][0], "probe_sync", None)
                if probe is not None:  # as in attempt_batch_async
                    raise probe(CommitUnknown(error, xid, values)) from None
                raise CommitUnknown(error, xid, values) from None
            raise
        return values
    finally:
        if guard.closing():
            invalidate_sync(connection, STATEMENT_ENDED)
        try:
            close_sync(session, connection)
        finally:
            guard.closed()


def _commit_begins(units: BatchUnits) -> None:
    """
    Just before COMMIT, in one step with the callers that give up: a unit whose ``submit()`` was
    cancelled meanwhile fails the batch; else its COMMIT begins, and no unit can be withdrawn any more.
    """
    position = units.withdrawals.commit_begins(units)
    if position is not None:
        raise BatchUnitFailed(position, Withdrawn(units[position][1]))


def _run_sync_unit(session: Session, transaction: Any, unit: Any, index: int) -> Any:
    """One unit of a batch in this thread: its value. A misuse raises :class:`UnitMisuse`."""
    value = unit(session)
    if value.__class__ not in NOT_AWAITABLE and inspect.isawaitable(value):
        raise returned_awaitable(value, index)
    if session.get_transaction() is not transaction:
        raise UnitMisuse(ended_transaction_message(index))
    return value
