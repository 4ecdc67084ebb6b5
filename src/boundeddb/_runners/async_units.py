"""
The base of the two async runners, which run each unit on an AsyncSession of its own.

It holds their typed public verbs.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, AsyncIterable, Awaitable, Callable, Iterable
from typing import TYPE_CHECKING, Any

from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker
from sqlalchemy.orm import sessionmaker

from .._arguments import check_priority
from .._executors.async_session import AsyncSessionExecutor
from .._journal import Journal
from .._outcome import Outcome, RunReport
from .._progress import feedback_request
from .._typing import AsyncUnit, ItemT, T
from .base import BaseRunner

if TYPE_CHECKING:
    from rich.progress import Progress


class AsyncUnitsRunner(BaseRunner):
    """The verbs of the async runners, typed for ``async def unit(session: AsyncSession) -> T``."""

    def _check_sessions(self, sessions: object) -> Any:
        """Accept an ``async_sessionmaker``, or a ``sessionmaker(class_=AsyncSession)``."""
        if isinstance(sessions, async_sessionmaker):
            return sessions
        if isinstance(sessions, sessionmaker):
            if isinstance(sessions.class_, type) and issubclass(sessions.class_, AsyncSession):
                return sessions
            msg = (
                f"{type(self).__name__} runs async units and needs an async_sessionmaker, got a sync "
                "sessionmaker: pass async_sessionmaker(create_async_engine(url)), or use "
                "ThreadOffloadRunner for sync sessions"
            )
            raise TypeError(msg)
        msg = (
            f"sessions must be an async_sessionmaker, got {type(sessions).__name__}: "
            "pass async_sessionmaker(create_async_engine(url))"
        )
        raise TypeError(msg)

    def _new_executor(self) -> AsyncSessionExecutor:
        return AsyncSessionExecutor(
            self._sessions,
            engine=self._engine,
            dialect=self._dialect,
            attempts=self._attempts,
            timeout=self._timeout,
            runner=type(self).__name__,
            verify_commits=self._verify_commits,
            batch=self._batch,
        )

    async def run(
        self,
        units: Iterable[AsyncUnit[T]] | AsyncIterable[AsyncUnit[T]],
        *,
        priority: int = 0,
        progress: bool | str | Progress = False,
        on_outcome: Callable[[Outcome[T]], object] | None = None,
    ) -> RunReport[T]:
        """
        Run every unit, each in its own session and transaction, at most :attr:`limit` at once.

        Units are pulled from ``units`` lazily, one slot at a time, so a generator of a million
        units is fine. Each unit gets a new :class:`~sqlalchemy.ext.asyncio.AsyncSession`, and
        its transaction commits if the unit returns and rolls back if it raises.

        Args:
            units: Iterable or async iterable of ``async def unit(session: AsyncSession) -> T``.
            priority: When a slot frees, the waiting unit of the highest priority gets it, first
                come first served within one. Each unit of the run waits for its slot before it
                is pulled. Above 0, it may also use the runner's ``reserve``. *New in 0.2.0.*
            progress: ``True`` shows a progress bar on stderr while the run lasts, if stderr is a
                terminal, so that logs stay clean: units done of the total if ``units`` has a
                length, rate, ETA, failed and retried units, and units in flight against the limit.
                A string is the bar's label, as in ``progress="backfill"``. A
                :class:`rich.progress.Progress` of yours gets a task instead.
                Needs rich: ``pip install 'boundeddb[progress]'``. *New in 0.2.0.*
            on_outcome: Called with each unit's :class:`~boundeddb.Outcome` as it settles, in
                completion order, on the event loop. Keep it cheap: the loop serves the units
                meanwhile. If it raises, the run stops as a failure does with ``errors="raise"``,
                and the call raises its exception. It is not called again.
                *New in 0.2.0.* See :doc:`/how-to/progress`.

        Returns:
            A :class:`~boundeddb.RunReport`: one :class:`~boundeddb.Outcome` per unit in input order,
            and the run's :class:`~boundeddb.RunStats`.

        Raises:
            RunFailed: with ``errors="raise"``, after the first failure: no new unit is started,
                the units in flight finish, then the units' own exceptions are raised as a group
                holding the partial report.
            UnitMisuseError: with ``errors="raise"``, a unit was not callable, not async, or ended
                the transaction itself. It is raised after in-flight units finish. With
                ``errors="collect"`` it is that unit's outcome. A list is checked up front either way.

        Cancelling the call cancels the units in flight, rolls their transactions back and returns
        their connections to the pool before the cancellation propagates: a unit in flight is never
        committed after the cancellation, even one that swallows it. Only a unit whose COMMIT had
        begun finishes it.
        """
        request = feedback_request(progress, on_outcome, f"{type(self).__name__}.run")
        return await self._run_units(units, priority, request=request)

    async def map(
        self,
        fn: Callable[[AsyncSession, ItemT], Awaitable[T]],
        items: Iterable[ItemT] | AsyncIterable[ItemT],
        *,
        priority: int = 0,
        progress: bool | str | Progress = False,
        on_outcome: Callable[[Outcome[T]], object] | None = None,
        journal: Journal[ItemT] | None = None,
    ) -> RunReport[T]:
        """
        Run ``fn(session, item)`` for every item, as :meth:`run` does for units.

        Args:
            fn: ``async def fn(session: AsyncSession, item) -> T``.
            items: Iterable or async iterable of items, pulled lazily.
            priority: As for :meth:`run`.
            progress: As for :meth:`run`. The total is ``len(items)``, if it has one.
            on_outcome: As for :meth:`run`.
            journal: Each unit writes its item's row in this :class:`~boundeddb.Journal` in its own
                transaction, and items whose row exists are skipped: run the same ``map()`` again
                after a crash and each item's effects happen exactly once. See :doc:`/how-to/journal`.
                *New in 0.3.0.*
        """
        request = feedback_request(progress, on_outcome, f"{type(self).__name__}.map", items)
        units = self._journalled(fn, items, journal)
        return await self._run_units(units, priority, request=request, journalled=journal is not None)

    def stream(
        self,
        units: Iterable[AsyncUnit[T]] | AsyncIterable[AsyncUnit[T]],
        *,
        priority: int = 0,
        progress: bool | str | Progress = False,
        on_outcome: Callable[[Outcome[T]], object] | None = None,
    ) -> AsyncGenerator[Outcome[T], None]:
        """
        Run the units as :meth:`run` does, yielding each :class:`~boundeddb.Outcome` as it finishes.

        Outcomes come in completion order, and no more than about twice :attr:`limit` of them
        exist at once, so memory stays flat however many units there are: if you consume slowly,
        the runner starts new units slowly. Breaking out of the loop stops the stream: units in
        flight are cancelled and rolled back.

        ``priority``, ``progress`` and ``on_outcome`` are as for :meth:`run`. ``on_outcome`` sees
        each outcome as it settles, before the stream yields it.

        Raises:
            RunFailed: with ``errors="raise"``, after yielding the first failure and the units that
                were in flight with it. Its report holds only the failed outcomes, since the stream
                keeps no others.
        """
        request = feedback_request(progress, on_outcome, f"{type(self).__name__}.stream")
        return self._stream_units(units, check_priority(priority), request)

    async def submit(
        self,
        unit: AsyncUnit[T],
        *,
        priority: int = 0,
        on_outcome: Callable[[Outcome[T]], object] | None = None,
    ) -> T:
        """
        Run one unit under the runner's shared limit and return its value.

        Meant for web handlers: every concurrent :meth:`submit` and run of one runner shares
        the same :attr:`limit`, so a burst of requests queues for a slot instead of exhausting the pool.
        ``on_outcome`` is called with the unit's :class:`~boundeddb.Outcome` once it settles, after
        the runner's own ``on_outcome`` and before this returns. If it raises, so does ``submit()``.
        *New in 0.2.0.*

        Raises:
            Exception: the unit's own exception, unchanged. Its transaction was rolled back.
        """
        result: T = await self._submit_unit(unit, priority, on_outcome)
        return result
