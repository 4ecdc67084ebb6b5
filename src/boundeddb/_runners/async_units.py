"""What the two async runners share: AsyncSession per unit, and their typed public verbs."""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import AsyncGenerator, AsyncIterable, Awaitable, Callable, Iterable
from typing import Any

import anyio
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncSession, async_sessionmaker
from sqlalchemy.orm import sessionmaker

from .._errors import UnitTimeout
from .._outcome import Outcome, RunReport
from .._typing import AsyncUnit, ItemT, T
from .base import BaseRunner
from .checks import ended_transaction_message, units_of
from .tasks import (
    CommitUnknown,
    ConnectFailed,
    RunState,
    UnitMisuse,
    commit_fate_unknown,
    logger,
    note_lost_connection,
)


def check_async_sessions(sessions: object, runner: str) -> Any:
    """Accept an ``async_sessionmaker`` (or a ``sessionmaker(class_=AsyncSession)``)."""
    if isinstance(sessions, async_sessionmaker):
        return sessions
    if isinstance(sessions, sessionmaker):
        if isinstance(sessions.class_, type) and issubclass(sessions.class_, AsyncSession):
            return sessions
        msg = (
            f"{runner} runs async units and needs an async_sessionmaker, got a sync sessionmaker: "
            "pass async_sessionmaker(create_async_engine(url)), or use ThreadOffloadRunner for "
            "sync sessions"
        )
        raise TypeError(msg)
    msg = (
        f"sessions must be an async_sessionmaker, got {type(sessions).__name__}: "
        "pass async_sessionmaker(create_async_engine(url))"
    )
    raise TypeError(msg)


async def _cancel_once(body: asyncio.Future[Any]) -> Any:
    """
    Await a unit's body; if we are cancelled, cancel the body exactly once and wait for it.

    anyio cancels level-triggered: it would cancel SQLAlchemy's own clean-up of an interrupted
    statement again and again, so that asyncpg aborts the socket before its CancelRequest reaches
    the server, and the statement runs on there. One plain cancellation lets SQLAlchemy and asyncpg
    stop the statement on the server and close the connection properly.
    """
    try:
        return await asyncio.shield(body)
    except BaseException:
        if not body.done():
            body.cancel()
            with anyio.CancelScope(shield=True):
                await asyncio.wait({body})
        raise


async def close_session(session: AsyncSession, connection: AsyncConnection | None) -> None:
    """Roll back whatever is open and return the connection; invalidate it if that fails."""
    with anyio.CancelScope(shield=True):
        try:
            await session.close()
        except Exception as error:
            logger.warning(
                "closing a unit's session failed (%s); invalidating its connection",
                type(error).__qualname__,
            )
            await invalidate(connection)


async def invalidate(connection: AsyncConnection | None) -> None:
    """Discard ``connection`` from the pool (SQLAlchemy closes it), so it can be neither leaked
    nor handed back with a transaction still open."""
    if connection is None:
        return
    with anyio.CancelScope(shield=True):
        try:
            await connection.invalidate()
        except Exception as error:  # already closed or gone: nothing left to return
            logger.debug("invalidating a connection failed: %s", type(error).__qualname__)


class _Attempt:
    """What one attempt's clean-up needs to know."""

    __slots__ = ("committing", "connection")

    def __init__(self) -> None:
        self.committing = False
        self.connection: AsyncConnection | None = None


class AsyncUnitsRunner(BaseRunner[Any]):
    """The verbs of the async runners, typed for ``async def unit(session: AsyncSession) -> T``."""

    async def _attempt(self, unit: Any, index: int, state: RunState) -> Any:
        session: AsyncSession = self._sessions()
        attempt = _Attempt()
        try:
            body = asyncio.ensure_future(self._body(session, unit, index, attempt))
            if self._timeout is None:
                return await _cancel_once(body)
            with anyio.move_on_after(self._timeout):
                return await _cancel_once(body)
            timeout = UnitTimeout(index, self._timeout)
            raise CommitUnknown(timeout) if attempt.committing else timeout
        finally:
            await close_session(session, attempt.connection)

    async def _body(self, session: AsyncSession, unit: Any, index: int, attempt: _Attempt) -> Any:
        transaction = session.sync_session.begin()
        try:
            # Connect before the unit runs: a failure here means nothing was sent (safe to retry),
            # and the clean-up keeps hold of the connection in case it has to invalidate it.
            attempt.connection = await session.connection()
        except Exception as error:
            raise ConnectFailed(error) from None
        result = unit(session)
        if not inspect.isawaitable(result):
            msg = (
                f"unit {index} returned {type(result).__name__}, not an awaitable: "
                f"{type(self).__name__} runs `async def unit(session: AsyncSession)`; "
                "run plain functions with ThreadOffloadRunner"
            )
            raise UnitMisuse(msg)
        try:
            value = await result
        except Exception as error:
            note_lost_connection(error, attempt.connection)
            raise
        if not transaction.is_active:
            raise UnitMisuse(ended_transaction_message(index))
        attempt.committing = True
        try:
            await session.commit()
        except Exception as error:
            note_lost_connection(error, attempt.connection)
            # A failed COMMIT can leave the transaction open on the connection: discard it.
            await invalidate(attempt.connection)
            if commit_fate_unknown(error):
                raise CommitUnknown(error) from None
            raise
        return value

    async def run(self, units: Iterable[AsyncUnit[T]] | AsyncIterable[AsyncUnit[T]]) -> RunReport[T]:
        """
        Run every unit, each in its own session and transaction, at most :attr:`limit` at once.

        Units are pulled from ``units`` lazily, one slot at a time, so a generator of a million
        units is fine. Each unit gets a new :class:`~sqlalchemy.ext.asyncio.AsyncSession`;
        its transaction commits if the unit returns and rolls back if it raises.

        Args:
            units: Iterable or async iterable of ``async def unit(session: AsyncSession) -> T``.

        Returns:
            A :class:`~boundeddb.RunReport`: one :class:`~boundeddb.Outcome` per unit in input order,
            and the run's :class:`~boundeddb.RunStats`.

        Raises:
            RunFailed: with ``errors="raise"``, after the first failure: no new unit is started,
                the units in flight finish, then the units' own exceptions are raised as a group
                holding the partial report.
            UnitMisuseError: a unit was not callable or not async; raised after in-flight units finish.

        Cancelling the call cancels the units in flight, rolls their transactions back and returns
        their connections to the pool before the cancellation propagates.
        """
        return await self._run_units(units)

    async def map(
        self,
        fn: Callable[[AsyncSession, ItemT], Awaitable[T]],
        items: Iterable[ItemT] | AsyncIterable[ItemT],
    ) -> RunReport[T]:
        """
        Run ``fn(session, item)`` for every item, as :meth:`run` does for units.

        Args:
            fn: ``async def fn(session: AsyncSession, item) -> T``.
            items: Iterable or async iterable of items, pulled lazily.
        """
        return await self._run_units(units_of(fn, items, type(self).__name__))

    def stream(
        self, units: Iterable[AsyncUnit[T]] | AsyncIterable[AsyncUnit[T]]
    ) -> AsyncGenerator[Outcome[T], None]:
        """
        Run the units as :meth:`run` does, yielding each :class:`~boundeddb.Outcome` as it finishes.

        Outcomes come in completion order, and no more than about twice :attr:`limit` of them
        exist at once, so memory stays flat however many units there are: if you consume slowly,
        the runner starts new units slowly. Breaking out of the loop stops the stream: units in
        flight are cancelled and rolled back.

        Raises:
            RunFailed: with ``errors="raise"``, after yielding the first failure and the units that
                were in flight with it; its report holds only the failed outcomes (the stream keeps
                no others).
        """
        return self._stream_units(units)

    async def submit(self, unit: AsyncUnit[T]) -> T:
        """
        Run one unit under the runner's shared limit and return its value.

        Meant for web handlers: every concurrent :meth:`submit` (and batch) of one runner shares
        the same :attr:`limit`, so a burst of requests queues for a slot instead of exhausting the pool.

        Raises:
            Exception: the unit's own exception, unchanged (its transaction was rolled back).
        """
        result: T = await self._submit_unit(unit)
        return result
