"""ThreadOffloadRunner: sync units in worker threads, under the runner's limit."""

from __future__ import annotations

from collections.abc import AsyncGenerator, AsyncIterable, Callable, Iterable
from functools import partial
from typing import TYPE_CHECKING, Any, Literal, final

from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker
from sqlalchemy.orm import Session, sessionmaker

from .._arguments import ErrorsMode, check_priority
from .._autolimit import AutoLimit
from .._batch import BatchPolicy
from .._executors.threads import ThreadExecutor
from .._journal import Journal
from .._outcome import Outcome, RunReport
from .._progress import feedback_request
from .._retry import RetryPolicy
from .._typing import ItemT, SyncUnit, T
from .binding import run_blocking
from .items import BoundItem, check_now
from .loads import ThreadLoadsRunner

if TYPE_CHECKING:
    from rich.progress import Progress


@final
class ThreadOffloadRunner(ThreadLoadsRunner):
    """
    Run plain sync units, ``def unit(session: Session)``, in worker threads, at most ``limit`` at once.

    Awaiting it from asyncio or trio never blocks the event loop: each unit runs in a worker thread
    under the runner's own :class:`anyio.CapacityLimiter`, not anyio's process-wide one of 40.
    Plain sync programs call :meth:`run_sync`.
    This is the shape that the "threads beat asyncio for CRUD" argument recommends: the driver and
    the ORM run in threads, with the GIL released during I/O.

    Args:
        sessions: The :class:`~sqlalchemy.orm.sessionmaker` each unit's session comes from, on a
            sync driver such as psycopg, psycopg2 or pysqlite. It must be bound to one engine.
        limit: Most units in flight at once, so most threads and connections. Defaults to the
            pool's capacity. ``"auto"`` or an :class:`~boundeddb.AutoLimit` lets the runner find it
            and move it while it works. *New in 0.2.0.*
        errors: ``"raise"`` or ``"collect"``, as for :class:`~boundeddb.SemaphoreRunner`.
        retry: See :class:`~boundeddb.RetryPolicy`.
        timeout: Seconds each unit attempt may take. A thread cannot be killed: on PostgreSQL the
            runner sets ``statement_timeout`` for the unit's transaction, so the server stops a
            slow statement. On other databases the unit runs to its end. Either way a unit that
            took longer is rolled back and fails with :class:`~boundeddb.UnitTimeout`, and its slot
            stays taken until its thread has really finished.
        reserve: As for :class:`~boundeddb.SemaphoreRunner`. *New in 0.2.0.*
        verify_commits: As for :class:`~boundeddb.SemaphoreRunner`. *New in 0.2.0.*
        on_outcome: As for :class:`~boundeddb.SemaphoreRunner`. *New in 0.2.0.*
        batch: As for :class:`~boundeddb.SemaphoreRunner`. Each batch runs in one worker thread,
            one session and one transaction. *New in 0.3.0.*

    Cancelling a call cancels the statements in flight with the DBAPI connection's ``cancel()`` or
    SQLite's ``interrupt()``, waits for the threads to finish, rolls back and returns their
    connections before the cancellation propagates. A thread cannot be stopped, so a unit that was
    running goes on until it returns. It is then rolled back, never committed, whatever it did
    meanwhile. Only a unit whose COMMIT had already begun finishes it.

    .. versionadded:: 0.1.0
    .. versionchanged:: 0.2.0
       A unit running when its call is cancelled is rolled back when it returns.
    """

    _async_units = False

    def __init__(
        self,
        sessions: sessionmaker[Any],
        *,
        limit: int | Literal["auto"] | AutoLimit | None = None,
        errors: ErrorsMode = "raise",
        retry: RetryPolicy | None = None,
        timeout: float | None = None,
        reserve: int = 0,
        verify_commits: bool = False,
        on_outcome: Callable[[Outcome[Any]], object] | None = None,
        batch: int | BatchPolicy | None = None,
    ) -> None:
        super().__init__(sessions, limit, errors, retry, timeout, reserve, verify_commits, on_outcome, batch)

    def _check_sessions(self, sessions: object) -> sessionmaker[Any]:
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
        return sessions

    def __enter__(self) -> ThreadOffloadRunner:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def close(self) -> None:
        """Refuse new work from now on: the sync twin of :meth:`aclose`."""
        self._close()

    def _new_executor(self, batch: BatchPolicy | None) -> ThreadExecutor:
        return ThreadExecutor(
            self._sessions,
            engine=self._engine,
            dialect=self._dialect,
            attempts=self._attempts,
            limiter=self._limiter,
            timeout=self._timeout,
            max_threads=self._max_limit,
            verify_commits=self._verify_commits,
            batch=batch,
        )

    # -- the public verbs ---------------------------------------------------------------------------

    async def run(
        self,
        units: Iterable[SyncUnit[T]] | AsyncIterable[SyncUnit[T]],
        *,
        priority: int = 0,
        progress: bool | str | Progress = False,
        on_outcome: Callable[[Outcome[T]], object] | None = None,
    ) -> RunReport[T]:
        """
        Run every unit in a worker thread, each in its own session and transaction.

        Behaves as :meth:`boundeddb.SemaphoreRunner.run` does, from its lazy input to cancellation,
        ``priority``, ``progress`` and ``on_outcome``, with
        ``def unit(session: Session) -> T`` units. It works under asyncio and trio. ``on_outcome``
        and the progress bar run on the event loop, never in the units' worker threads.
        """
        request = feedback_request(progress, on_outcome, "ThreadOffloadRunner.run")
        return await self._run_units(units, priority, request=request)

    async def map(
        self,
        fn: Callable[[Session, ItemT], T],
        items: Iterable[ItemT] | AsyncIterable[ItemT],
        *,
        priority: int = 0,
        progress: bool | str | Progress = False,
        on_outcome: Callable[[Outcome[T]], object] | None = None,
        journal: Journal[ItemT] | None = None,
    ) -> RunReport[T]:
        """
        Run ``fn(session, item)`` for every item in worker threads, as :meth:`run` does.

        ``journal`` as for :meth:`boundeddb.SemaphoreRunner.map`. *New in 0.3.0.*
        """
        units = self._journalled(fn, items, journal)
        priority = check_priority(priority)
        check_now(BoundItem(fn, None), 0, self._executor.check)  # one function for all items: check it now
        request = feedback_request(progress, on_outcome, "ThreadOffloadRunner.map", items)
        return await self._run_units(units, priority, request=request, journalled=journal is not None)

    def stream(
        self,
        units: Iterable[SyncUnit[T]] | AsyncIterable[SyncUnit[T]],
        *,
        priority: int = 0,
        progress: bool | str | Progress = False,
        on_outcome: Callable[[Outcome[T]], object] | None = None,
    ) -> AsyncGenerator[Outcome[T], None]:
        """
        Yield each unit's :class:`~boundeddb.Outcome` as it finishes, in O(limit) memory.

        As :meth:`boundeddb.SemaphoreRunner.stream`. Under trio, close the stream promptly if you
        break out early: ``async with contextlib.aclosing(runner.stream(units)) as outcomes:``.
        """
        request = feedback_request(progress, on_outcome, "ThreadOffloadRunner.stream")
        return self._stream_units(units, check_priority(priority), request)

    async def submit(
        self,
        unit: SyncUnit[T],
        *,
        priority: int = 0,
        on_outcome: Callable[[Outcome[T]], object] | None = None,
    ) -> T:
        """
        Run one sync unit in a worker thread under the runner's shared limit, and return its value.

        ``priority`` as for :meth:`boundeddb.SemaphoreRunner.run`: ``submit(unit, priority=1)``
        from a request handler goes ahead of a bulk run's units, and may use the ``reserve``.
        ``on_outcome``, and what a cancelled call tells it, as for
        :meth:`boundeddb.SemaphoreRunner.submit`, on the event loop.

        Raises:
            Exception: the unit's own exception, unchanged.
        """
        result: T = await self._submit_unit(unit, priority, on_outcome)
        return result

    def run_sync(
        self,
        units: Iterable[SyncUnit[T]],
        *,
        priority: int = 0,
        progress: bool | str | Progress = False,
        on_outcome: Callable[[Outcome[T]], object] | None = None,
    ) -> RunReport[T]:
        """
        Run every unit from plain sync code, as :meth:`run` does, and return the report.

        ``progress`` and ``on_outcome`` as for :meth:`run`: both are served in the calling thread.

        It runs a private event loop in the calling thread for the duration of the call.
        Ctrl-C, a :exc:`KeyboardInterrupt`, cancels the statements in flight, rolls back and returns
        every connection before it propagates. The stats carry no loop lag: no loop of yours ran.

        Raises:
            RuntimeError: if called from async code. There, ``await runner.run(units)`` instead.
        """
        request = feedback_request(progress, on_outcome, "ThreadOffloadRunner.run_sync")
        call = partial(self._run_units, units, priority, measure_loop_lag=False, request=request)
        report: RunReport[T] = run_blocking(call, "run_sync", "await runner.run(units)")
        return report

    def map_sync(
        self,
        fn: Callable[[Session, ItemT], T],
        items: Iterable[ItemT],
        *,
        priority: int = 0,
        progress: bool | str | Progress = False,
        on_outcome: Callable[[Outcome[T]], object] | None = None,
        journal: Journal[ItemT] | None = None,
    ) -> RunReport[T]:
        """
        Run ``fn(session, item)`` for every item from plain sync code, as :meth:`run_sync` does.

        ``journal`` as for :meth:`boundeddb.SemaphoreRunner.map`.

        .. versionadded:: 0.3.0
        """
        units = self._journalled(fn, items, journal)
        check_now(BoundItem(fn, None), 0, self._executor.check)
        request = feedback_request(progress, on_outcome, "ThreadOffloadRunner.map_sync", items)
        call = partial(
            self._run_units,
            units,
            priority,
            measure_loop_lag=False,
            request=request,
            journalled=journal is not None,
        )
        report: RunReport[T] = run_blocking(call, "map_sync", "await runner.map(fn, items)")
        return report
