"""
A ``submit()``'s unit on a thread, awaited from its caller's task: no task group, no worker task.

A run's workers are tasks of a :class:`~boundeddb._executors.threads.ThreadTeam`, beside which the
team stops their statements when the run is cancelled: an attempt's wait for its thread cannot be
cancelled, so something else must act meanwhile. A lone unit (``drive(alone=True)``) is awaited
from its caller's task instead, and its wait for the thread *can* be cancelled: the caller then
stops the unit's statement itself, waits for the thread to end and for the discarded connections
to end on the server, and only then lets the cancellation go on. What a task group and a task cost
per call is saved; the cancellation path pays them instead.

An attempt whose COMMIT had begun when the caller was cancelled cannot be stopped: the caller waits
for it, and if it may have committed, its result settles the unit as if nothing had happened, the
run stops, and :class:`CallerTeam` raises the cancellation once the unit's outcome is in the run's
sink, where ``submit()`` finds it and tells its ``on_outcome``. A lane (``threads.py``) settles its
unit in its thread, so only a retried unit's attempt, run alone in a thread, comes back this way.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import anyio
import anyio.to_thread
from sqlalchemy.engine import URL

from .._core.attempts import CommitUnknown, CommitVerified
from .._core.pacing import Body
from .._core.run import Run
from .._dialects import Dialect
from .thread_handles import CANCEL_AGAIN_S, Handle, Stopped, ThreadWorker

__all__ = ["CallerTeam", "in_caller"]

_NEW, _RUNNING, _ABANDONED = range(3)


class CallerTeam:
    """The one worker of a one-unit run, run in the caller's task. A lone unit retries in place."""

    def __init__(self, run: Run[Any]) -> None:
        self._run = run
        #: The caller's cancellation, held while the attempt it could not stop settles the unit.
        self._cancelled: BaseException | None = None

    async def run(self, workers: list[ThreadWorker], body: Body[ThreadWorker]) -> None:
        (worker,) = workers
        worker.in_caller = self
        await body(worker)
        if self._cancelled is not None:
            raise self._cancelled

    def hold(self, cancelled: BaseException) -> None:
        """Raise ``cancelled`` once the unit has settled, from what its attempt did; start nothing more."""
        self._cancelled = cancelled
        self._run.stop()

    def spawn(self, worker: ThreadWorker, body: Body[ThreadWorker]) -> None:
        raise AssertionError(
            "a lone unit retries in place: its run's pacer hands no retry off"
        )  # pragma: no cover


class _ThreadCall:
    """``fn(*args)`` in a worker thread: its outcome, and whether it started, ran or never will."""

    __slots__ = ("_args", "_error", "_fn", "_state", "_state_lock", "_value", "finished")

    def __init__(self, fn: Callable[..., Any], args: tuple[Any, ...]) -> None:
        self._fn, self._args = fn, args
        self._state = _NEW
        self._state_lock = threading.Lock()
        self._value: Any = None
        self._error: BaseException | None = None
        #: Held until the call has run: acquired here, released by the thread.
        self.finished = threading.Lock()
        self.finished.acquire()

    def run(self) -> None:
        """In the worker thread: run it, unless the caller gave up before it started."""
        with self._state_lock:
            if self._state == _ABANDONED:
                return
            self._state = _RUNNING
        try:
            self._value = self._fn(*self._args)
        except BaseException as error:  # Stopped included: the caller reads it in outcome()
            self._error = error
        finally:
            self.finished.release()

    def abandon(self) -> bool:
        """The caller was cancelled: True if the call had not started, and now never will."""
        with self._state_lock:
            if self._state == _NEW:
                self._state = _ABANDONED
                return True
            return False

    def wait(self, timeout: float) -> bool:
        """In a thread: whether the call ended within ``timeout`` seconds."""
        if self.finished.acquire(timeout=timeout):
            self.finished.release()
            return True
        return False

    def may_have_committed(self) -> bool:
        """Once it ended: whether it ran to a COMMIT that may have happened (a lane: without a retry owed)."""
        error = self._error
        return self._state == _RUNNING and (
            error is None
            or isinstance(error, CommitUnknown)
            or (isinstance(error, CommitVerified) and error.committed)
        )

    def outcome(self) -> Any:
        """The call's value, or it raises what the call raised."""
        if self._error is not None:
            raise self._error
        return self._value


async def in_caller(
    worker: ThreadWorker,
    dialect: Dialect,
    url: URL,
    limiter: anyio.CapacityLimiter,
    fn: Callable[..., Any],
    *args: Any,
) -> Any:
    """
    ``fn(*args)`` in one of the runner's threads, awaited from the caller's task: its value.

    If the caller is cancelled meanwhile, stop the statement of ``worker``'s attempt until the
    thread is done, then wait for the connections the dialect ends, then re-raise: the unit is
    rolled back and closed before the cancellation leaves the runner. An attempt whose COMMIT had
    begun, and may have happened, is not rolled back: its result is returned, and the
    cancellation raised once the unit has settled (see the module docstring). ``Stopped`` never
    comes out: only that cancellation stops the attempt.
    """
    call = _ThreadCall(fn, args)
    try:
        await anyio.to_thread.run_sync(call.run, abandon_on_cancel=True, limiter=limiter)
    except anyio.get_cancelled_exc_class() as cancelled:
        # In a task of its own: anyio's group waits for it through a second native cancellation,
        # which then goes no further: the first one is raised, or held while the unit settles.
        with anyio.CancelScope(shield=True):
            try:
                async with anyio.create_task_group() as group:
                    group.start_soon(_wind_down, worker.handle, call, dialect, url)
            except anyio.get_cancelled_exc_class():
                pass
        team = worker.in_caller
        if team is None or worker.retry is not None or not call.may_have_committed():
            raise  # nothing of it committed: stopped, failed, or a lane whose unit is owed a retry
        team.hold(cancelled)
    try:
        return call.outcome()
    except Stopped:  # pragma: no cover - only a cancellation, handled above, stops the attempt
        raise AssertionError("a lone unit was stopped, yet its caller was not cancelled") from None


async def _wind_down(handle: Handle, call: _ThreadCall, dialect: Dialect, url: URL) -> None:
    """Stop the attempt's statement until its thread is done; then wait for the connections ending."""
    with anyio.CancelScope(shield=True):  # anyio's group cancels its scope on a native cancellation
        if call.abandon():
            return  # it never started: nothing to stop, nothing to close
        while True:
            dbapi = handle.cancel()  # the attempt stops at its next step, its connection discarded
            if dbapi is not None:
                await anyio.to_thread.run_sync(dialect.cancel_statements, [dbapi])
            if await anyio.to_thread.run_sync(call.wait, CANCEL_AGAIN_S):
                break
        if dialect.ending_connections(url):
            await anyio.to_thread.run_sync(dialect.wait_connections_ended, url)
