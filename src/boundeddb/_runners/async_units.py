"""
The base of the two async runners, which run each unit on an AsyncSession of its own.

It holds their typed public verbs.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, AsyncIterable, Awaitable, Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Any, Literal

from sqlalchemy import Table
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker
from sqlalchemy.orm import sessionmaker

from .._arguments import check_priority
from .._batch import BatchPolicy
from .._executors.async_session import AsyncSessionExecutor
from .._journal import Journal
from .._loads.call import DEFAULT_BATCH
from .._outcome import LoadReport, Outcome, RunReport
from .._progress import feedback_request
from .._typing import AsyncUnit, ItemT, T
from .loads import LoadsRunner

if TYPE_CHECKING:
    from rich.progress import Progress


class AsyncUnitsRunner(LoadsRunner):
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

    def _new_executor(self, batch: BatchPolicy | None) -> AsyncSessionExecutor:
        return AsyncSessionExecutor(
            self._sessions,
            engine=self._engine,
            dialect=self._dialect,
            attempts=self._attempts,
            timeout=self._timeout,
            runner=type(self).__name__,
            verify_commits=self._verify_commits,
            batch=batch,
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

    async def load(
        self,
        target: type[Any] | Table,
        rows: Iterable[Any] | AsyncIterable[Any],
        *,
        columns: Sequence[str] | None = None,
        batch: int = DEFAULT_BATCH,
        errors: Literal["collect", "raise"] = "collect",
        journal: Journal[Any] | None = None,
        progress: bool | str | Progress = False,
    ) -> LoadReport:
        """
        Write many rows into one table through the database's bulk path, ``batch`` rows per transaction.

        On PostgreSQL with asyncpg or psycopg the rows go through ``COPY``; elsewhere through
        ``insert(table)`` with many rows, which the drivers send as multi-row ``INSERT`` statements.
        Each value is stored as ``session.execute(insert(target), rows)`` stores it: Python defaults
        for missing keys, server defaults for columns no row gives, each type's bind processing.
        At most :attr:`limit` chunks, so connections, are in flight, and at most about
        ``limit x batch`` rows are held. The runner's ``batch=`` for units plays no part: each chunk
        is one transaction. ``timeout=`` bounds each chunk's transaction, and ``retry=`` runs a
        chunk whose transaction failed with a transient error again. :doc:`/how-to/load` shows an
        import, and :doc:`/explanation/loads` how refused rows are found.

        Args:
            target: An ORM mapped class (rows keyed by attribute key) or a Core
                :class:`~sqlalchemy.schema.Table` (keyed by column key).
            rows: Iterable or async iterable of mappings, of instances of the mapped class, or of
                sequences of values in the order of ``columns``. Pulled lazily, one row at a time.
            columns: The keys of each sequence's values, in order.
            batch: Rows per transaction.
            errors: ``"collect"`` rejects each row the database refuses for its data (a
                constraint, a value it cannot store) alone and goes on: it is in
                :attr:`LoadReport.rejected <boundeddb.LoadReport.rejected>` and every other row is
                committed. ``"raise"`` stops at the first refused row, its chunk rolled back, and
                raises :class:`~boundeddb.LoadFailed`.
            journal: A :class:`~boundeddb.Journal` without ``key``: each chunk records the input
                indexes it committed in its own transaction, and a rerun over the same input in the
                same order skips them (:attr:`LoadReport.skipped <boundeddb.LoadReport.skipped>`)
                and tries rows rejected earlier again. So each row is loaded exactly once across
                crashes. :doc:`/explanation/guarantees` says where that ends.
            progress: As for :meth:`run`; the bar counts chunks, that is transactions.

        Returns:
            A :class:`~boundeddb.LoadReport`: rows loaded, skipped and rejected.

        Raises:
            TypeError: ``target`` is not a mapped class or a Table, or a row is of no kind above.
            ValueError: a row has a key the target does not have, or ``batch`` is below 1, or
                sequences come without ``columns``. Found among the first ``batch`` rows, nothing was
                written; later, the chunks before stay committed and the message says how many rows.
            LoadFailed: ``errors="raise"`` and a row was refused, or a chunk failed for another
                reason (a lost connection once retries ran out, a timeout, a COMMIT of unknown fate),
                or the journal's lookup failed once retries ran out, before any chunk. Its
                ``report`` says what committed.

        Cancelling the call rolls back the chunks in flight and returns their connections; chunks
        that committed stay committed.

        .. versionadded:: 0.3.0
        """
        return await self._load(
            target, rows, columns=columns, batch=batch, errors=errors, journal=journal, progress=progress,
            verb=f"{type(self).__name__}.load",
        )  # fmt: skip

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

        Cancelled, the call rolls its unit back, which never commits, unless the unit's COMMIT had
        begun (with ``batch=``, its batch's) or the unit had settled: then the call waits for the
        outcome, calls ``on_outcome`` with it (ok, failed, or ``commit_unknown``; what it raises
        is logged), and raises the cancellation. So a cancelled ``submit()`` whose ``on_outcome``
        was not called did not commit and never will; where it was called, its outcome is what
        the server did ("On cancellation" in :doc:`/explanation/guarantees`).

        Raises:
            Exception: the unit's own exception, unchanged. Its transaction was rolled back.
        """
        result: T = await self._submit_unit(unit, priority, on_outcome)
        return result
