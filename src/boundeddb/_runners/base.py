"""
The base of every in-process runner: what turns each public verb into a run of the core.

A concrete runner supplies its executor, which runs one attempt on the event loop or in a thread.
:class:`~boundeddb.ChunkedRunner` supplies its pacer too. The core, ``boundeddb._core``, does the rest.
"""

from __future__ import annotations

import math
from collections.abc import AsyncGenerator, AsyncIterable, Callable, Iterable
from contextlib import AbstractContextManager
from functools import partial
from typing import Any, TypeVar

import anyio
import anyio.lowlevel
from sqlalchemy.engine import Engine

from .._arguments import (
    check_errors,
    check_priority,
    check_retry,
    check_timeout,
    check_verify_commits,
)
from .._batch import BatchPolicy, check_batch
from .._core.adaptive import LimitController, limit_figures
from .._core.attempts import Attempts
from .._core.background import Background
from .._core.feedback import Feedback
from .._core.journalled import JournalledRun, Units
from .._core.limiter import Limiter, Slot
from .._core.pacing import IN_PLACE, Executor, Pacer, SlidingWindow, drive
from .._core.recorder import LoopLag, NullRecorder, Recorder
from .._core.run import Run, SinkT
from .._core.sinks import CallbackSink, ListSink, StreamSink
from .._dialects import Dialect, for_name
from .._errors import RunnerClosedError
from .._outcome import Outcome, RunReport
from .._progress import FeedbackRequest, open_feedback
from .._retry import RetryPolicy
from .._stats import RunnerStatistics, RunStats
from .binding import LoopBinding
from .items import check_when_pulled, checked_units
from .journal_units import map_units
from .observers import Observers
from .pools import LimitPlan, bound_engine, resolve_limit_or_auto, with_reserve
from .submits import gather_for, submit_unit

__all__ = ["BaseRunner"]

RunnerT = TypeVar("RunnerT", bound="BaseRunner")


def _controller(plan: LimitPlan, limiter: Limiter, dialect: Dialect) -> LimitController | None:
    """The controller that moves the limit of a ``limit="auto"`` runner, or None for a fixed limit."""
    if not plan.auto:
        return None
    return LimitController(
        limiter, low=plan.low, high=plan.high, initial=plan.initial, is_overload=dialect.is_overload
    )


def _describe(name: str, stats: RunnerStatistics, closed: bool) -> str:
    """A runner's repr: its limit and reserve, what it holds and what waits, and whether it is closed."""
    reserve = f" reserve={stats.reserve}" if stats.reserve else ""
    state = " closed" if closed else ""
    return f"<{name} limit={stats.limit}{reserve} in_flight={stats.in_flight} waiting={stats.waiting}{state}>"


class BaseRunner:
    """Shared machinery. The concrete runners document the public API."""

    #: The argument that sets the limit, as messages name it: ``chunk_size`` for
    #: :class:`~boundeddb.ChunkedRunner`.
    _limit_name = "limit"
    #: Whether units are ``async def``, awaited by the executor, rather than run in threads.
    _async_units = True
    #: ``submit()``'s unit, run alone or in a batch with other calls' units: see ``submits.py``.
    _submit_unit = submit_unit

    def __init__(
        self,
        sessions: object,
        limit: object,
        errors: object,
        retry: object,
        timeout: object,
        reserve: object,
        verify_commits: object,
        on_outcome: object = None,
        batch: object = None,
    ) -> None:
        """Check every argument before any database work, and build what every call shares."""
        self._sessions = self._check_sessions(sessions)
        self._engine = engine = bound_engine(self._sessions)
        planned = self._plan_limit(limit, engine)
        plan = planned if isinstance(planned, LimitPlan) else LimitPlan(planned, planned, planned)
        plan = with_reserve(plan, reserve, self._limit_name)
        self._limiter = Limiter(plan.initial, plan.reserve)
        #: The most the limit can be: what the executor sizes itself for.
        self._max_limit = plan.high
        self._errors = check_errors(errors)
        self._retry: RetryPolicy = check_retry(retry)
        self._timeout = check_timeout(timeout)
        self._dialect: Dialect = for_name(engine.dialect.name)
        self._verify_commits = check_verify_commits(verify_commits, self._dialect, engine.dialect.name)
        self._dialect.check_engine(engine)
        self._dialect.prepare_engine(engine)
        self._controller = _controller(plan, self._limiter, self._dialect)
        failed = self._controller.failed if self._controller is not None else None
        self._observers = Observers(self, engine.dialect.name, on_outcome, async_units=self._async_units)
        self._attempts = Attempts(self._retry, failed=failed, labels=self._observers.labels)
        #: ``batch=``: None for one transaction per unit, the hot path's default.
        self._batch: BatchPolicy | None = check_batch(batch)
        self._gather = gather_for(self, self._batch, self._limiter)
        self._executor: Executor[Any] = self._new_executor(self._batch)
        self._closed = False
        self._binding = LoopBinding(type(self).__name__)

    def _check_sessions(self, sessions: object) -> Any:
        """``sessions`` if it is the kind of sessionmaker this runner runs units on, else a TypeError."""
        raise NotImplementedError

    def _plan_limit(self, limit: object, engine: Engine) -> int | LimitPlan:
        """The limit asked for, checked against the engine's pool: fixed, or ``"auto"``'s plan."""
        return resolve_limit_or_auto(self._limit_name, limit, engine, type(self).__name__)

    def _new_executor(self, batch: BatchPolicy | None) -> Executor[Any]:
        raise NotImplementedError

    def _new_pacer(self, workers: int) -> Pacer:
        return SlidingWindow()

    # -- public read-only state ---------------------------------------------------------------

    @property
    def limit(self) -> int:
        """
        The most units of this runner in flight at once, across all its calls.

        With ``limit="auto"``, where the limit is now: it moves while the runner works.
        """
        return self._limiter.limit

    @property
    def in_flight(self) -> int:
        """Units holding a slot right now."""
        return self._limiter.in_flight

    def statistics(self) -> RunnerStatistics:
        """
        What the runner holds and what waits for it now, across all its calls.

        It is a cheap snapshot under the runner's lock, so a metrics endpoint or a gauge callback can
        call it as often as it scrapes. See :doc:`/how-to/priorities`.

        .. versionadded:: 0.2.0
        """
        return self._observers.statistics(self._limiter.statistics())

    def __repr__(self) -> str:
        return _describe(type(self).__name__, self._limiter.statistics(), self._closed)

    # -- lifecycle ----------------------------------------------------------------------------

    async def aclose(self) -> None:
        """
        Refuse new work from now on. Calls already running finish as usual.

        The engine is the caller's: it is not disposed. With ``batch=``, units of :meth:`submit`
        calls that wait for their batch to fill start at once.
        """
        self._close()

    def _close(self) -> None:
        self._closed = True
        if self._gather is not None:
            self._gather.close()

    async def __aenter__(self: RunnerT) -> RunnerT:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    def _bound(self) -> AbstractContextManager[None]:
        """Use the runner from the current event loop, through :class:`.binding.LoopBinding`."""
        if self._closed:
            msg = f"this {type(self).__name__} is closed: create a new runner"
            raise RunnerClosedError(msg)
        return self._binding.bound()

    # -- runs ------------------------------------------------------------------------------------

    def _new_run(
        self,
        units: Units,
        sink: SinkT,
        recorder: NullRecorder,
        *,
        priority: int,
        stop_on_failure: bool | None = None,
        window: anyio.Semaphore | None = None,
        request: FeedbackRequest | None = None,
        on_outcome: Callable[[Outcome[Any]], object] | None = None,
        journalled: bool = False,
        batched: bool | None = None,
    ) -> Run[SinkT]:
        """A run of ``units``, observed as ``observers.Observers`` says. ``errors`` sets stop_on_failure."""
        controller = self._controller
        if stop_on_failure is None:
            stop_on_failure = self._errors == "raise"
        hook, telemetry = self._observers.for_call(
            priority, on_outcome if request is None else request.on_outcome
        )
        return (JournalledRun if journalled else Run)(
            units,  # type: ignore[arg-type]  # JournalChunks come journalled only
            sink,
            check=check_when_pulled(units, self._executor.check),
            stop_on_failure=stop_on_failure,
            recorder=recorder,
            priority=priority,
            window=window,
            observe=None if controller is None else controller.observe,
            on_outcome=hook,
            size=None if request is None else request.size,
            telemetry=telemetry,
            batched=self._batch is not None if batched is None else batched,
        )

    # fmt: off
    async def _drive(self, run: Run[Any], loop_lag: LoopLag | None = None, *, adapt: bool = True,
                     feedback: Feedback | None = None, workers: int | None = None, slot: Slot | None = None,
                     pacer: Pacer | None = None) -> None:
        # fmt: on
        size = 1 if self._batch is None else self._batch.size
        if workers is None:
            wanted = run.size if size == 1 or run.size == math.inf else math.ceil(run.size / size)
            workers = int(min(self._limiter.share(run.priority), max(1, wanted)))
        pacer = self._new_pacer(workers) if pacer is None else pacer
        controller = self._controller if adapt else None
        # A batch waits for an async input with a deadline: a task of its own pulls it ahead.
        read_ahead = None if self._batch is None else run.read_ahead(self._max_limit * size)
        await drive(run, self._executor, self._attempts, pacer, self._limiter, workers, loop_lag=loop_lag,
                    controller=controller, feedback=feedback, read_ahead=read_ahead, slot=slot)  # fmt: skip

    def _stats(self, recorder: Recorder) -> RunStats:
        return recorder.finish(**limit_figures(self._limiter, self._controller, recorder.started))

    # -- the verbs ------------------------------------------------------------------------------

    async def _run_units(
        self,
        units: Units,
        priority: object,
        *,
        measure_loop_lag: bool = True,
        request: FeedbackRequest | None = None,
        journalled: bool = False,
    ) -> RunReport[Any]:
        priority = check_priority(priority)
        units = units if journalled else checked_units(units, self._executor.check)  # map() checked its items
        with self._bound(), self._observers.recording(self._engine.pool) as recorder:
            feedback = None
            try:
                sink = ListSink()
                run = self._new_run(
                    units, sink, recorder, priority=priority, request=request, journalled=journalled
                )
                loop_lag = recorder.loop_lag = LoopLag() if measure_loop_lag else None
                feedback = open_feedback(run, recorder, self._limiter, request, type(self).__name__)
                await self._drive(run, loop_lag, feedback=feedback)
            finally:
                if feedback is not None:
                    feedback.close()
        return run.report(sink.outcomes, self._stats(recorder))

    async def _stream_units(
        self, units: Iterable[Any] | AsyncIterable[Any], priority: int, request: FeedbackRequest | None = None
    ) -> AsyncGenerator[Outcome[Any], None]:
        units = checked_units(units, self._executor.check)
        with self._bound(), self._observers.recording(self._engine.pool, keep_latencies=False) as recorder:
            # Pulled, not consumed: at most twice the limit, or twice an auto limit's ceiling, in units
            # or in batches of units. So memory is O(limit), or O(limit x size).
            lookahead = 2 * (self._limiter.limit if self._controller is None else self._max_limit)
            lookahead *= 1 if self._batch is None else self._batch.size
            sink = StreamSink(lookahead)
            run = self._new_run(units, sink, recorder, priority=priority, window=sink.window, request=request)
            loop_lag = recorder.loop_lag = LoopLag()
            feedback = open_feedback(run, recorder, self._limiter, request, type(self).__name__)

            async def drive() -> None:
                try:
                    await self._drive(run, loop_lag, feedback=feedback)
                finally:
                    if feedback is not None:
                        feedback.close()

            try:
                async with Background(partial(sink.produce, drive)):
                    while (outcome := await sink.next()) is not None:
                        yield outcome
            finally:
                sink.close()
        run.raise_for(RunReport(sink.failures, self._stats(recorder)))

    def _journalled(self, fn: object, items: object, journal: object) -> Units:
        """``map(fn, items)``'s units, through ``journal`` unless it is None."""
        name, engine, dialect, asyncs = type(self).__name__, self._engine, self._dialect, self._async_units
        return map_units(fn, items, journal, name, engine, dialect, self._attempts, async_units=asyncs)

    async def _feed(self, units: AsyncIterable[Any], settled: Callable[[Outcome[Any]], None]) -> None:
        """Run a ProcessRunner worker's call: ``units``, each outcome handed to ``settled`` on the loop."""
        # IN_PLACE: a retry needs no slot beyond its worker's ("The core", docs/explanation/architecture.md).
        with self._bound(), self._observers.recording(self._engine.pool, keep_latencies=False) as recorder:
            run = self._new_run(units, CallbackSink(settled), recorder, priority=0)
            await self._drive(run, pacer=IN_PLACE)
