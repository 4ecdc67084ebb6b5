"""
The thread executor: sync units on a ``Session``, in worker threads, under the runner's limiter.

For a plain iterable a thread is a lane that pulls, runs and settles units itself. Otherwise each
unit takes one trip to a thread. No worker thread touches an anyio primitive. A cancelled run stops
the statements in flight through the dialect, never commits a unit that had not begun to, and
discards the connections it sent a cancellation to. See "Sync units: lanes and handles" in
``docs/explanation/architecture.md``.
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import Callable
from time import perf_counter
from types import FunctionType
from typing import Any, NoReturn

import anyio
import anyio.abc
import anyio.lowlevel
import anyio.to_thread
from sqlalchemy.engine import URL, Engine
from sqlalchemy.orm import Session

from .._batch import BatchPolicy
from .._core.attempts import Attempts, Retry
from .._core.limiter import Limiter, Slot
from .._core.pacing import EXHAUSTED, MORE, RETRY, Body, Served, serve_one
from .._core.run import END, REFUSED, Run
from .._dialects import Dialect
from .._outcome import Outcome, committed_outcome
from .batch_script import attempt_batch_sync
from .deadlines import StatementDeadlines
from .script import attempt_sync
from .thread_batches import BatchLanes
from .thread_caller import CallerTeam, in_caller
from .thread_handles import CANCEL_AGAIN_S, Handle, Stopped, ThreadWorker
from .verify import bind_script, verified_sync

__all__ = ["ThreadExecutor"]

logger = logging.getLogger("boundeddb.units")


class ThreadExecutor:
    """Runs ``def unit(session: Session)`` in worker threads."""

    def __init__(
        self,
        sessions: Callable[[], Session],
        *,
        engine: Engine,
        dialect: Dialect,
        attempts: Attempts,
        limiter: Limiter,
        timeout: float | None,
        max_threads: int,
        verify_commits: bool = False,
        batch: BatchPolicy | None = None,
    ) -> None:
        self._dialect = dialect
        self._url = engine.url
        self._attempts = attempts
        self._limiter = limiter
        self._script: Callable[[Handle, Any, int], Any] = bind_script(
            attempt_sync, verified_sync, engine, dialect, verify_commits, sessions, dialect, timeout
        )
        self._max_threads = max_threads
        #: Where the server cannot be told a statement timeout, a thread of ours stops the statement.
        self._deadlines = (
            StatementDeadlines(dialect, timeout)
            if timeout is not None
            and dialect.stops_statements
            and dialect.statement_timeout_sql(timeout) is None
            else None
        )
        self._threads: tuple[object, anyio.CapacityLimiter] | None = None
        self._last_checked: object = None
        self._last_code: object = None
        if batch is not None:  # a batch's attempt, and its pinpointing twin, from batch_script
            scripts = tuple(
                bind_script(
                    attempt_batch_sync, verified_sync, engine, dialect, verify_commits,
                    pinpoint, sessions, dialect, timeout,
                )
                for pinpoint in (False, True)
            )  # fmt: skip
            lanes = BatchLanes(batch, attempts, self.attempt, scripts, self._in_thread, limiter.should_yield)  # type: ignore[arg-type]
            self.serve = lanes.serve  # type: ignore[method-assign]

    def check(self, unit: object, index: int) -> str | None:
        if not callable(unit):
            return (
                f"unit {index} is {unit!r}, which is not callable: pass a function that takes "
                "the session, e.g. def unit(session): ..."
            )
        fn = getattr(unit, "fn", unit)  # map()'s units keep their function visible
        if fn is self._last_checked:  # map() gives every unit the same function: check it once
            return None
        code = None
        if fn.__class__ is FunctionType:  # closures of one function share its code, and whether it is async
            code = fn.__code__
            if code is self._last_code:
                return None
        if inspect.iscoroutinefunction(fn) or inspect.iscoroutinefunction(getattr(fn, "__call__", None)):  # noqa: B004
            return (
                f"unit {index} is an async function: ThreadOffloadRunner runs plain "
                "`def unit(session: Session)` in worker threads; run async units with SemaphoreRunner"
            )
        self._last_checked, self._last_code = fn, code
        return None

    def worker(self, slot: Slot) -> ThreadWorker:
        return ThreadWorker(slot, Handle(self._dialect, self._deadlines))

    def _thread_limiter(self) -> anyio.CapacityLimiter:
        """The runner's own CapacityLimiter on this event loop, not anyio's default of 40."""
        token = anyio.lowlevel.current_token()
        if self._threads is None or self._threads[0] != token:
            self._threads = (token, anyio.CapacityLimiter(self._max_threads))
        return self._threads[1]

    # -- serving units ---------------------------------------------------------------------------

    def team(self, run: Run[Any], *, alone: bool = False) -> ThreadTeam | CallerTeam:
        return CallerTeam(run) if alone else ThreadTeam(run, self._dialect, self._url)

    async def serve(self, run: Run[Any], worker: ThreadWorker, wait_s: float) -> Served:
        if not run.pulls_in_threads:
            return await serve_one(self._attempts, self.attempt, run, worker, wait_s)
        served: Served = await self._thread(worker, self._lane, run, worker, wait_s)
        return served

    async def attempt(self, worker: ThreadWorker, unit: Any, index: int) -> Any:
        return await self._thread(worker, self._script, worker.handle, unit, index)

    async def _thread(self, worker: ThreadWorker, fn: Callable[..., Any], *args: Any) -> Any:
        """``fn(*args)`` in one of the runner's threads, for ``worker``: in a team, or in its caller."""
        if worker.in_caller is not None:
            return await in_caller(worker, self._dialect, self._url, self._thread_limiter(), fn, *args)
        try:
            return await anyio.to_thread.run_sync(fn, *args, limiter=self._thread_limiter())
        except Stopped:
            pass
        await _cancelled()

    async def _in_thread(self, fn: Callable[..., Any], *args: Any) -> Any:
        """``fn(*args)`` in one of the runner's worker threads: a batch's attempt, or its lane."""
        try:
            return await anyio.to_thread.run_sync(fn, *args, limiter=self._thread_limiter())
        except Stopped:
            pass
        await _cancelled()

    def _lane(self, run: Run[Any], worker: ThreadWorker, wait_s: float) -> Served:
        """Pull, run and settle units in this thread until the lane is to end."""
        script, settle, finish = self._script, self._attempts.settle, run.finish
        should_yield, handle = self._limiter.should_yield, worker.handle
        while True:
            pulled = run.pull_sync()
            if pulled is END:
                return EXHAUSTED
            if pulled is not REFUSED:
                unit, index = pulled
                started = perf_counter()
                try:
                    value = script(handle, unit, index)
                except Exception as error:
                    settled = settle(error, index, 1, perf_counter() - started, wait_s)
                    if not isinstance(settled, Outcome):
                        worker.retry = Retry(unit, index, 2, settled, wait_s)
                        return RETRY
                    finish(settled)
                else:
                    finish(committed_outcome(index, value, perf_counter() - started, wait_s))
                wait_s = 0.0
            if run.stopping or run.drained:
                return EXHAUSTED
            if should_yield():
                return MORE  # someone else waits for one of the runner's slots: give ours up


class ThreadTeam:
    """Worker tasks of one run in an anyio task group. A cancellation cancels their statements."""

    def __init__(self, run: Run[Any], dialect: Dialect, url: URL) -> None:
        self._run = run
        self._dialect = dialect
        self._url = url
        self._workers: list[ThreadWorker] = []
        self._group: anyio.abc.TaskGroup | None = None
        #: Workers started and not yet done; ``_done`` is set when the last of them is.
        self._live = 0
        self._done = anyio.Event()

    def spawn(self, worker: ThreadWorker, body: Body[ThreadWorker]) -> None:
        assert self._group is not None
        self._workers.append(worker)
        self._live += 1
        # Once the run is cancelled, the worker stops at its first checkpoint.
        self._group.start_soon(self._lifetime, worker, body)

    async def _lifetime(self, worker: ThreadWorker, body: Body[ThreadWorker]) -> None:
        try:
            await body(worker)
        finally:
            self._live -= 1
            if not self._live:
                self._done.set()

    async def run(self, workers: list[ThreadWorker], body: Body[ThreadWorker]) -> None:
        async with anyio.create_task_group() as self._group:
            for worker in workers:
                self.spawn(worker, body)
            try:
                if self._live:
                    await self._done.wait()
            except BaseException:  # cancelled, or a worker failed
                # In a task of the group: out of reach of a second native cancellation of this one,
                # which may be a submit()'s caller (drive(alone=True)).
                self._group.start_soon(self._wind_down)
                raise

    async def _wind_down(self) -> None:
        """
        Stop the statement of every unit still running one, until none is; then wait for the
        workers, and for the connections discarded mid-statement to end on the server.

        A cancel request stops only the statement running when it reaches the server: one that
        arrives just before a unit sends its next statement is lost, and that statement would run
        to its end. So it is sent again while any unit is still running.
        """
        self._run.stopping = True
        with anyio.CancelScope(shield=True):  # started in a cancelled group: shielded from its first step
            await self._stop_busy()
            if self._live:
                await self._done.wait()
            if self._dialect.ending_connections(self._url):
                await anyio.to_thread.run_sync(self._dialect.wait_connections_ended, self._url)

    async def _stop_busy(self) -> None:
        while busy := [dbapi for worker in self._workers if (dbapi := worker.handle.cancel()) is not None]:
            logger.debug(
                "run cancelled: stopping %d statement(s) of %d worker(s)", len(busy), len(self._workers)
            )
            await anyio.to_thread.run_sync(self._dialect.cancel_statements, busy)
            await anyio.sleep(CANCEL_AGAIN_S)
        logger.debug("run cancelled: no statement of its %d workers left to stop", len(self._workers))


async def _cancelled() -> NoReturn:
    """A thread was stopped by the run's cancellation: let that cancellation through."""
    await anyio.lowlevel.checkpoint()
    raise AssertionError("a unit was stopped, yet its run was not cancelled")  # pragma: no cover
