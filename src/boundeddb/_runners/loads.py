"""
``load()`` on the in-process runners: its call run as chunks, one transaction each, and
ThreadOffloadRunner's two verbs. The async runners' verb is in ``async_units.py``.

``boundeddb._loads`` does the work; :doc:`/explanation/loads` tells how.
"""

from __future__ import annotations

from collections.abc import AsyncIterable, Iterable, Sequence
from functools import partial
from typing import TYPE_CHECKING, Any, Literal

from sqlalchemy import Table

from .._core.limiter import Slot
from .._core.pacing import Executor, drive
from .._core.recorder import LoopLag
from .._core.run import Run
from .._journal import Journal
from .._loads.call import DEFAULT_BATCH, LoadCall
from .._outcome import LoadReport, Outcome
from .._progress import feedback_request, open_feedback
from .._stats import RunStats
from .base import BaseRunner
from .binding import run_blocking
from .journal_rows import JournalRows

if TYPE_CHECKING:
    from rich.progress import Progress

__all__ = ["LoadsRunner", "ThreadLoadsRunner"]


class LoadsRunner(BaseRunner):
    """What every in-process runner's ``load()`` shares."""

    #: ``load()``'s executor, one transaction per chunk whatever ``batch=`` says: made at its first call.
    _load_executor: Executor[Any] | None = None

    async def _run_load(
        self,
        call: LoadCall,
        *,
        measure_loop_lag: bool,
        progress: object,
        description: str,
    ) -> tuple[list[Outcome[Any]], RunStats, Run[Any]]:
        """
        Run a ``load()``'s chunks, one transaction each whatever ``batch=`` says, stopping at the first
        failure: the outcomes in input order, the stats and the run, whose errors are the caller's to raise.
        First its journal's lookup, within a slot as a unit's attempt: if it fails, :class:`LoadFailed`.
        """
        if self._load_executor is None:
            self._load_executor = self._new_executor(None)
        with self._bound(), self._observers.recording(self._engine.pool) as recorder:
            if call.journalled:
                slot = Slot(self._limiter, 0)
                await slot.take()
                try:
                    await call.look_up(slot)
                except Exception as error:  # once the retry policy gave up: before the first chunk
                    raise call.lookup_failed(error, self._stats(recorder)) from error
                finally:
                    slot.give()
            units = call.units()
            request = feedback_request(progress, None, description, call.chunks_total)  # type: ignore[arg-type]
            feedback = None
            try:
                sink = call.sink(recorder)
                run = self._new_run(
                    units, sink, recorder, priority=0, stop_on_failure=True, request=request, batched=False
                )
                loop_lag = recorder.loop_lag = LoopLag() if measure_loop_lag else None
                feedback = open_feedback(run, recorder, self._limiter, request, type(self).__name__)
                workers = int(min(self._limiter.share(run.priority), max(1, run.size)))
                pacer, executor = self._new_pacer(workers), self._load_executor
                await drive(run, executor, self._attempts, pacer, self._limiter, workers, loop_lag=loop_lag,
                            controller=self._controller, feedback=feedback)  # fmt: skip
            finally:
                if feedback is not None:
                    feedback.close()
        return sink.outcomes, self._stats(recorder), run

    async def _load(
        self,
        target: object,
        rows: object,
        *,
        columns: object,
        batch: object,
        errors: object,
        journal: object,
        progress: object,
        verb: str,
        measure_loop_lag: bool = True,
    ) -> LoadReport:
        """``load()``: every argument checked, then the journal looked up, then the chunks run."""
        with self._bound():  # a closed runner refuses before any database work
            pass
        journal_rows = None
        if journal is not None:
            if not isinstance(journal, Journal):
                msg = (
                    f"journal must be a boundeddb.Journal, got {type(journal).__name__}: pass e.g. "
                    f'journal=Journal("import-2026-11") to {verb}()'
                )
                raise TypeError(msg)
            checked = journal
            if checked.key is not None:
                msg = (
                    f"{verb}() names rows by their input index: pass a Journal without key=, "
                    f"e.g. journal=Journal({checked.job!r})"
                )
                raise ValueError(msg)
            journal_rows = JournalRows(
                checked.job, checked.table, self._engine, self._dialect, self._attempts,
                async_units=self._async_units, create_table=checked.create_table,
            )  # fmt: skip
        call = LoadCall(
            self._engine, self._dialect, target, rows, columns=columns, batch=batch, errors=errors,
            journal=journal_rows, async_units=self._async_units,
        )  # fmt: skip
        outcomes, stats, run = await self._run_load(
            call, measure_loop_lag=measure_loop_lag, progress=progress, description=f"{verb}: chunks"
        )
        return call.report(outcomes, stats, run)


class ThreadLoadsRunner(LoadsRunner):
    """ThreadOffloadRunner's ``load()`` and ``load_sync()``."""

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
        Write many rows into one table, as :meth:`boundeddb.SemaphoreRunner.load` does, in worker threads.

        Each chunk is written in a worker thread, on a sync driver's bulk path (psycopg 3's
        ``COPY``). A plain iterable of rows is pulled by the worker threads themselves, one thread
        at a time; an async iterable on the event loop. It works under asyncio and trio.

        .. versionadded:: 0.3.0
        """
        return await self._load(
            target, rows, columns=columns, batch=batch, errors=errors, journal=journal, progress=progress,
            verb="ThreadOffloadRunner.load",
        )  # fmt: skip

    def load_sync(
        self,
        target: type[Any] | Table,
        rows: Iterable[Any],
        *,
        columns: Sequence[str] | None = None,
        batch: int = DEFAULT_BATCH,
        errors: Literal["collect", "raise"] = "collect",
        journal: Journal[Any] | None = None,
        progress: bool | str | Progress = False,
    ) -> LoadReport:
        """
        :meth:`load` for plain sync code: it blocks until every row is written or rejected.

        Ctrl-C cancels it as it cancels :meth:`run_sync`: chunks in flight are rolled back.

        .. versionadded:: 0.3.0
        """
        call = partial(
            self._load, target, rows, columns=columns, batch=batch, errors=errors, journal=journal,
            progress=progress, verb="ThreadOffloadRunner.load_sync", measure_loop_lag=False,
        )  # fmt: skip
        report: LoadReport = run_blocking(call, "load_sync", "await runner.load(target, rows)")
        return report
