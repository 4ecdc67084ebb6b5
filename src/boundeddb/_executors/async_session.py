"""
The async executor: units on an ``AsyncSession``, run inline in native asyncio worker tasks.

Each worker is cancelled exactly once, by ``Task.cancel()``, and never while it opens a connection,
while a cancelled run's unit commits, or while it closes its session: such a cancellation waits for
the next step. See "Async units: cancelled exactly once" in ``docs/explanation/architecture.md``.
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import sys
from collections.abc import Callable, Coroutine
from typing import Any

import anyio
import anyio.to_thread
from sqlalchemy import exc as sa_exc
from sqlalchemy.engine import URL, Engine
from sqlalchemy.ext.asyncio import AsyncSession
from sqlalchemy.pool import PoolProxiedConnection

from .._batch import BatchPolicy
from .._core.attempts import Attempts, CommitUnknown
from .._core.batches import Batches
from .._core.limiter import Slot
from .._core.pacing import Body, Served, Worker, serve_one
from .._core.run import Run
from .._dialects import Dialect
from .._errors import UnitTimeout
from .batch_script import attempt_batch_async
from .checkouts import HOOKS, install_connect_hooks
from .script import attempt_async
from .verify import bind_script, verified_async

__all__ = ["AsyncSessionExecutor", "AsyncWorker"]

#: The most seconds a cancellation waits for a connection that is being opened.
OPENING_GRACE_S = 5.0

_IDLE, _CONNECTING, _RUNNING, _COMMITTING, _CLOSING = range(5)


class AsyncWorker(Worker):
    """A worker task and the guard of its attempts. See the module docstring."""

    __slots__ = (
        "_grace",
        "_index",
        "_timeout",
        "_timer",
        "cancel_pending",
        "connection",
        "opening",
        "phase",
        "stop_requested",
        "task",
        "timed_out",
    )

    def __init__(self, slot: Slot, timeout: float | None) -> None:
        super().__init__(slot)
        self._timeout = timeout
        self.task: asyncio.Task[None] | None = None
        self.phase = _IDLE
        self.connection: PoolProxiedConnection | None = None
        self.opening = False
        self.stop_requested = False
        self.cancel_pending = False
        self.timed_out = False
        self._index = -1
        self._timer: asyncio.TimerHandle | None = None
        self._grace: asyncio.TimerHandle | None = None

    # -- the coordinator's side -----------------------------------------------------------------------

    def stop(self) -> None:
        """The run is cancelled: interrupt the worker now, or at its next step if now is a bad moment."""
        self.stop_requested = True
        if self.phase in (_IDLE, _CONNECTING, _RUNNING):
            self._interrupt_unless_opening()

    def _on_deadline(self) -> None:
        self._timer = None
        self.timed_out = True
        if self.phase in (_CONNECTING, _RUNNING, _COMMITTING):
            self._interrupt_unless_opening()

    def _interrupt_unless_opening(self) -> None:
        if not self.opening:
            self._interrupt()
        elif self._grace is None:
            assert self.task is not None
            self._grace = self.task.get_loop().call_later(OPENING_GRACE_S, self._interrupt)

    def _interrupt(self) -> None:
        if not self.cancel_pending and self.task is not None:
            self.cancel_pending = True
            self.task.cancel()

    # -- the pool's side: checkouts.HOOKS, called in this worker's task ------------------------------------

    def on_opening(self) -> None:
        """The task starts opening a new DBAPI connection: defer interruptions until it is open."""
        self.opening = True

    def on_checkout(self, connection: PoolProxiedConnection) -> None:
        """The task's session has its connection: what was deferred while it opened takes effect."""
        if self.connection is None:
            self.connection = connection
        if self.phase == _CONNECTING:
            self.phase = _RUNNING
        if self.opening:
            self._opened()
            if (self.stop_requested and self.phase == _RUNNING) or (
                self.timed_out and self.phase in (_RUNNING, _COMMITTING)
            ):
                self._interrupt()  # raised at the task's next await: its first statement

    def _opened(self) -> None:
        self.opening = False
        if self._grace is not None:
            self._grace.cancel()
            self._grace = None

    def cancel_again(self) -> None:
        """
        Our cancellation was caught so that a unit settles (``verify.py``): it takes effect again at
        the task's next await.
        """
        self._consume_cancel()
        self._interrupt()

    def _consume_cancel(self) -> None:
        """Our own cancellation was seen, or swallowed by the unit: take it back."""
        if self.cancel_pending:
            self.cancel_pending = False
            uncancel = getattr(self.task, "uncancel", None)  # Python 3.11+
            if uncancel is not None:
                uncancel()

    # -- the guard of an attempt, as script.attempt_async calls it ---------------------------------------

    def connecting(self, index: int) -> None:
        self._index = index
        self.phase = _CONNECTING
        self.connection = None
        self.opening = False
        self.timed_out = False
        if self._timeout is not None:
            assert self.task is not None
            self._timer = self.task.get_loop().call_later(self._timeout, self._on_deadline)

    def connect_failed(self, error: Exception) -> bool:
        """Whether ``error``, raised before the session had a connection, is the connect failing."""
        return self.opening or isinstance(error, sa_exc.TimeoutError)  # opening, or a pool timeout

    def next_unit(self, index: int) -> None:
        """A batch's next unit, or its COMMIT, starts: a ``timeout`` of its own from now."""
        self._index = index
        if self._timer is not None:
            self._timer.cancel()
            assert self.task is not None
            assert self._timeout is not None
            self._timer = self.task.get_loop().call_later(self._timeout, self._on_deadline)

    def committing(self) -> None:
        """Where a deferred cancellation or a deadline that passed takes effect."""
        self._opened()
        if self.stop_requested:
            raise asyncio.CancelledError
        if self.timed_out:  # the unit swallowed our cancellation, or its connection opened too late
            self._consume_cancel()
            raise self._timeout_error()
        self.phase = _COMMITTING

    def interrupted(self, error: BaseException) -> Exception | None:
        """What the attempt failed with, if it failed because its own deadline passed."""
        if not self.timed_out or self.stop_requested or isinstance(error, UnitTimeout):
            return None
        self._consume_cancel()
        return self._timeout_error()

    def _timeout_error(self) -> Exception:
        assert self._timeout is not None
        timeout = UnitTimeout(self._index, self._timeout)
        return CommitUnknown(timeout) if self.phase == _COMMITTING else timeout

    def closing(self) -> None:
        self.phase = _CLOSING
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._opened()

    def closed(self) -> None:
        self.phase = _IDLE
        self.connection = None
        if self.stop_requested:  # deferred while closing: take effect at the next await
            self._interrupt()


class AsyncSessionExecutor:
    """Runs ``async def unit(session: AsyncSession)`` inline in native asyncio worker tasks."""

    def __init__(
        self,
        sessions: Callable[[], AsyncSession],
        *,
        engine: Engine,
        dialect: Dialect,
        attempts: Attempts,
        timeout: float | None,
        runner: str,
        verify_commits: bool = False,
        batch: BatchPolicy | None = None,
    ) -> None:
        install_connect_hooks(engine)
        self._attempts = attempts
        self._timeout = timeout
        self._dialect = dialect
        self._url = engine.url
        self.attempt: Callable[[AsyncWorker, Any, int], Coroutine[Any, Any, Any]] = bind_script(
            attempt_async, verified_async, engine, dialect, verify_commits, sessions, dialect, runner
        )
        #: Pull one unit and attempt it, with no await between the worker and the unit but this one.
        self.serve: Callable[[Run[Any], AsyncWorker, float], Coroutine[Any, Any, Served]] = functools.partial(
            serve_one, attempts, self.attempt
        )
        if batch is not None:  # a batch's attempt, and its pinpointing twin, from batch_script
            plain, pinpoint = (
                bind_script(
                    attempt_batch_async, verified_async, engine, dialect, verify_commits,
                    pinpoint, sessions, dialect, runner,
                )
                for pinpoint in (False, True)
            )  # fmt: skip
            self.serve = Batches(batch, attempts, self.attempt, plain, pinpoint).serve

    def check(self, unit: object, index: int) -> str | None:
        if callable(unit):
            return None
        return (
            f"unit {index} is {unit!r}, which is not callable: pass a function that takes "
            "the session, e.g. async def unit(session): ..."
        )

    def worker(self, slot: Slot) -> AsyncWorker:
        return AsyncWorker(slot, self._timeout)

    def team(self, run: Run[Any], *, alone: bool = False) -> NativeTeam:
        return NativeTeam(run, self._dialect, self._url)


class NativeTeam:
    """Worker tasks of one run, outside anyio's cancel scopes: each is stopped exactly once, by us."""

    def __init__(self, run: Run[Any], dialect: Dialect, url: URL) -> None:
        self._run = run
        self._dialect = dialect
        self._url = url
        self._workers: list[AsyncWorker] = []
        self._tasks: set[asyncio.Task[None]] = set()
        self._cancelled = False

    def spawn(self, worker: AsyncWorker, body: Body[AsyncWorker]) -> None:
        if self._cancelled:
            return  # the run is cancelled: a unit owed a retry is dropped with it
        worker.task = _start(worker, body)
        self._workers.append(worker)
        self._tasks.add(worker.task)

    async def run(self, workers: list[AsyncWorker], body: Body[AsyncWorker]) -> None:
        for worker in workers:
            self.spawn(worker, body)
        try:
            while pending := {task for task in self._tasks if not task.done()}:
                done, _ = await asyncio.wait(pending, return_when=asyncio.FIRST_EXCEPTION)
                for task in done:
                    if not task.cancelled() and task.exception() is not None:
                        raise task.exception()  # type: ignore[misc]  # a bug of ours: stop the rest
        except BaseException:
            self._cancelled = self._run.stopping = True
            for worker in self._workers:
                worker.stop()
            with anyio.CancelScope(shield=True):
                await _despite_cancellation(self._wind_down())
            raise

    async def _wind_down(self) -> None:
        """Wait for every worker, and for the connections they discarded mid-statement to end."""
        await asyncio.wait(self._tasks)
        # A connection discarded mid-statement may still hold its transaction on the server.
        if self._dialect.ending_connections(self._url):
            await anyio.to_thread.run_sync(self._dialect.wait_connections_ended, self._url)


async def _despite_cancellation(coroutine: Coroutine[Any, Any, None]) -> None:
    """
    Run ``coroutine`` to its end in a task of its own, waiting for it through any native
    cancellation of ours: the caller's task may run the team (``drive(alone=True)``).
    """
    task = asyncio.ensure_future(coroutine)
    while not task.done():
        try:
            await asyncio.wait((task,))
        except asyncio.CancelledError:
            continue  # the caller raises its first cancellation once the workers are done
    task.result()


def _start(worker: AsyncWorker, body: Body[AsyncWorker]) -> asyncio.Task[None]:
    """A task for ``body(worker)`` whose context tells the engine's connect hook who is opening."""
    loop = asyncio.get_running_loop()
    if sys.version_info < (3, 11):  # pragma: no cover - no context= before Python 3.11
        return loop.create_task(_in_own_context(worker, body))
    context = contextvars.copy_context()
    context.run(HOOKS.set, worker)
    return loop.create_task(body(worker), context=context)


async def _in_own_context(worker: AsyncWorker, body: Body[AsyncWorker]) -> None:  # pragma: no cover
    HOOKS.set(worker)  # this task's context only
    await body(worker)
