"""ThreadOffloadRunner: sync units in worker threads under the runner's own CapacityLimiter."""

from __future__ import annotations

import inspect
from collections.abc import AsyncGenerator, AsyncIterable, Awaitable, Callable, Iterable
from functools import partial
from time import perf_counter
from typing import Any, final

import anyio
import anyio.lowlevel
import anyio.to_thread
from sqlalchemy import exc as sa_exc
from sqlalchemy.engine import Connection
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker
from sqlalchemy.orm import Session, sessionmaker

from .._errors import UnitTimeout
from .._outcome import Outcome, RunReport
from .._retry import RetryPolicy
from .._typing import ItemT, SyncUnit, T
from .base import BaseRunner
from .checks import BoundItem, ErrorsMode, bound_engine, ended_transaction_message, resolve_limit, units_of
from .lanes import Handle, Lanes, cancel_all
from .tasks import (
    CommitUnknown,
    ConnectFailed,
    Puller,
    RunState,
    UnitMisuse,
    commit_fate_unknown,
    logger,
    note_lost_connection,
)

#: SQLSTATE query_canceled: PostgreSQL's answer to statement_timeout (and to a cancel request).
_QUERY_CANCELED = "57014"


def _close(session: Session, connection: Connection | None) -> None:
    """Roll back whatever is open and return the connection; invalidate it if that fails."""
    try:
        session.close()
    except Exception as error:
        logger.warning(
            "closing a unit's session failed (%s); invalidating its connection",
            type(error).__qualname__,
        )
        _invalidate(connection)


def _invalidate(connection: Connection | None) -> None:
    """Discard ``connection`` from the pool, so it is neither leaked nor returned mid-transaction."""
    if connection is None:
        return
    try:
        connection.invalidate()
    except Exception as error:  # already closed or gone: nothing left to return
        logger.debug("invalidating a connection failed: %s", type(error).__qualname__)


@final
class ThreadOffloadRunner(BaseRunner[Any]):
    """
    Run plain sync units (``def unit(session: Session)``) in worker threads, at most ``limit`` at once.

    Awaiting it from asyncio or trio never blocks the event loop: each unit runs in a worker thread
    under the runner's own :class:`anyio.CapacityLimiter` (not anyio's process-wide default of 40).
    Plain sync programs call :meth:`run_sync`.
    This is the shape that the "threads beat asyncio for CRUD" argument recommends: the driver and
    the ORM run in threads, with the GIL released during I/O.

    Args:
        sessions: The :class:`~sqlalchemy.orm.sessionmaker` each unit's session comes from
            (psycopg, psycopg2, pysqlite, ...); it must be bound to one engine.
        limit: Most units (threads, connections) in flight at once; defaults to the pool's capacity.
        errors: ``"raise"`` or ``"collect"``, as for :class:`~boundeddb.SemaphoreRunner`.
        retry: See :class:`~boundeddb.RetryPolicy`.
        timeout: Seconds each unit attempt may take. A thread cannot be killed: on PostgreSQL the
            runner sets ``statement_timeout`` for the unit's transaction, so the server stops a
            slow statement; on other databases the unit runs to its end. Either way a unit that
            took longer is rolled back and fails with :class:`~boundeddb.UnitTimeout`, and its slot
            stays taken until its thread has really finished.

    Cancelling a call cancels the statements in flight (the DBAPI connection's ``cancel()``),
    waits for the threads to finish, rolls back and returns their connections before the
    cancellation propagates.

    .. versionadded:: 0.1.0
    """

    _unit_example = "def unit(session): ..."

    def __init__(
        self,
        sessions: sessionmaker[Any],
        *,
        limit: int | None = None,
        errors: ErrorsMode = "raise",
        retry: RetryPolicy | None = None,
        timeout: float | None = None,
    ) -> None:
        self._check_sessions(sessions)
        engine = bound_engine(sessions)
        super().__init__(
            sessions,
            limit=resolve_limit("limit", limit, engine, "ThreadOffloadRunner"),
            errors=errors,
            retry=retry,
            timeout=timeout,
            engine=engine,
        )
        self._statement_timeout = engine.dialect.name == "postgresql" and self._timeout is not None

    @staticmethod
    def _check_sessions(sessions: object) -> None:
        is_async = isinstance(sessions, async_sessionmaker) or (
            isinstance(sessions, sessionmaker)
            and isinstance(sessions.class_, type)
            and issubclass(sessions.class_, AsyncSession)
        )
        if is_async:
            msg = (
                "ThreadOffloadRunner runs sync units in threads and needs a sync sessionmaker, "
                "got an async_sessionmaker: pass sessionmaker(create_engine(url)) "
                "(e.g. postgresql+psycopg), or use SemaphoreRunner for async units"
            )
            raise TypeError(msg)
        if not isinstance(sessions, sessionmaker):
            msg = (
                f"sessions must be a sqlalchemy.orm.sessionmaker, got {type(sessions).__name__}: "
                "pass sessionmaker(create_engine(url))"
            )
            raise TypeError(msg)

    async def __aenter__(self) -> ThreadOffloadRunner:
        return self

    def __enter__(self) -> ThreadOffloadRunner:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def close(self) -> None:
        """Refuse new work from now on (the sync twin of :meth:`aclose`)."""
        self._closed = True

    # -- the per-unit path ------------------------------------------------------------------------

    def _check_unit(self, unit: object, index: int) -> None:
        super()._check_unit(unit, index)
        fn = unit.fn if isinstance(unit, BoundItem) else unit
        if inspect.iscoroutinefunction(fn) or inspect.iscoroutinefunction(
            getattr(fn, "__call__", None)  # noqa: B004 -- async callables objects too
        ):
            msg = (
                f"unit {index} is an async function: ThreadOffloadRunner runs plain "
                "`def unit(session: Session)` in worker threads; run async units with SemaphoreRunner"
            )
            raise UnitMisuse(msg)

    async def _attempt(self, unit: Any, index: int, state: RunState) -> Any:
        handle = Handle()
        state.handles.add(handle)
        binding = self._binding
        assert binding is not None
        try:
            return await anyio.to_thread.run_sync(
                self._in_thread, unit, index, handle, limiter=binding.thread_limiter
            )
        finally:
            state.handles.discard(handle)

    def _in_thread(self, unit: Any, index: int, handle: Handle) -> Any:
        session: Session = self._sessions()
        connection: Connection | None = None
        try:
            transaction = session.begin()
            try:
                connection = session.connection()
            except Exception as error:  # nothing was sent: safe to retry
                raise ConnectFailed(error) from None
            if self._statement_timeout:
                milliseconds = max(1, round(self._timeout * 1000))  # type: ignore[operator]
                connection.exec_driver_sql(f"SET LOCAL statement_timeout = {milliseconds}")
            handle.dbapi = connection.connection.dbapi_connection
            if handle.cancelled:
                raise anyio.get_cancelled_exc_class()()  # pragma: no cover - narrow race
            started = perf_counter()
            try:
                value = unit(session)
            except sa_exc.DBAPIError as error:
                note_lost_connection(error, connection)
                if self._statement_timeout and not handle.cancelled and _is_query_canceled(error):
                    raise UnitTimeout(index, self._timeout) from error  # type: ignore[arg-type]
                raise
            if inspect.isawaitable(value):
                if inspect.iscoroutine(value):
                    value.close()
                msg = (
                    f"unit {index} returned an awaitable: ThreadOffloadRunner runs plain "
                    "`def unit(session: Session)`; run async units with SemaphoreRunner"
                )
                raise UnitMisuse(msg)
            if not transaction.is_active:
                raise UnitMisuse(ended_transaction_message(index))
            if self._timeout is not None and perf_counter() - started > self._timeout:
                raise UnitTimeout(index, self._timeout)
            handle.dbapi = None  # from here on a cancellation must not interrupt the COMMIT
            try:
                session.commit()
            except Exception as error:
                note_lost_connection(error, connection)
                # A failed COMMIT can leave the transaction open on the connection: discard it.
                _invalidate(connection)
                if commit_fate_unknown(error):
                    raise CommitUnknown(error) from None
                raise
            return value
        finally:
            handle.dbapi = None
            _close(session, connection)

    async def _pace(
        self,
        pull: Puller,
        gate: anyio.Semaphore,
        state: RunState,
        deliver: Callable[[Outcome[Any]], Awaitable[None]],
        window: anyio.Semaphore | None,
    ) -> None:
        """A plain iterable in ``run()``: lanes (see ``lanes.py``); anything else: unit by unit."""
        binding = self._binding
        if window is None and pull.iterator is not None and state.collect is not None and binding:
            lanes = Lanes(self, pull.iterator, gate, binding.thread_limiter, state, deliver)
            await lanes.run()
        else:
            await super()._pace(pull, gate, state, deliver, window)

    def _on_cancel_statements(self, state: RunState) -> Callable[[], Awaitable[None]] | None:
        async def cancel_statements() -> None:
            state.stop = True  # lanes end after their unit
            handles = list(state.handles)
            if handles:
                await anyio.to_thread.run_sync(cancel_all, handles)

        return cancel_statements

    # -- the public verbs ---------------------------------------------------------------------------

    async def run(self, units: Iterable[SyncUnit[T]] | AsyncIterable[SyncUnit[T]]) -> RunReport[T]:
        """
        Run every unit in a worker thread, each in its own session and transaction.

        Behaves as :meth:`boundeddb.SemaphoreRunner.run` does (lazy input, input order, errors,
        cancellation), with ``def unit(session: Session) -> T`` units; works under asyncio and trio.
        """
        return await self._run_units(units)

    async def map(
        self,
        fn: Callable[[Session, ItemT], T],
        items: Iterable[ItemT] | AsyncIterable[ItemT],
    ) -> RunReport[T]:
        """Run ``fn(session, item)`` for every item in worker threads, as :meth:`run` does."""
        return await self._run_units(units_of(fn, items, "ThreadOffloadRunner"))

    def stream(
        self, units: Iterable[SyncUnit[T]] | AsyncIterable[SyncUnit[T]]
    ) -> AsyncGenerator[Outcome[T], None]:
        """
        Yield each unit's :class:`~boundeddb.Outcome` as it finishes, in O(limit) memory.

        As :meth:`boundeddb.SemaphoreRunner.stream`. Under trio, close the stream promptly if you
        break out early (``async with contextlib.aclosing(runner.stream(units)) as outcomes:``).
        """
        return self._stream_units(units)

    async def submit(self, unit: SyncUnit[T]) -> T:
        """
        Run one sync unit in a worker thread under the runner's shared limit, and return its value.

        Raises:
            Exception: the unit's own exception, unchanged.
        """
        result: T = await self._submit_unit(unit)
        return result

    def run_sync(self, units: Iterable[SyncUnit[T]]) -> RunReport[T]:
        """
        Run every unit from plain sync code, as :meth:`run` does, and return the report.

        It runs a private event loop in the calling thread for the duration of the call.
        Ctrl-C (:exc:`KeyboardInterrupt`) cancels the statements in flight, rolls back and returns
        every connection before it propagates. The stats carry no loop lag (no loop of yours ran).

        Raises:
            RuntimeError: if called from async code; ``await runner.run(units)`` there instead.
        """
        try:
            anyio.lowlevel.current_token()
        except RuntimeError:
            pass  # no event loop here: good
        else:
            msg = (
                "run_sync() was called from async code, where it would block the event loop: "
                "use `await runner.run(units)` instead"
            )
            raise RuntimeError(msg)
        report: RunReport[T] = anyio.run(partial(self._run_units, units, measure_loop_lag=False))
        return report


def _is_query_canceled(error: sa_exc.DBAPIError) -> bool:
    orig = error.orig
    return any(
        getattr(candidate, attribute, None) == _QUERY_CANCELED
        for candidate in (orig, getattr(orig, "__cause__", None))
        for attribute in ("sqlstate", "pgcode")
    )
