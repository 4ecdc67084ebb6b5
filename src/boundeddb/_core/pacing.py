"""
How a run starts its units: up to ``limit`` long-lived workers, each taking a slot before it pulls.

A worker takes a slot from the runner's limiter, has the executor serve units while it holds it,
gives it back, and paces itself. :class:`SlidingWindow` starts the next unit as soon as a slot is
free, and hands a unit owed a retry to a worker of its own, which backs off without a slot.
:class:`Chunks` runs one unit per worker, then waits for the whole chunk. How workers run and stop
is the executor's: a :class:`Team`.
"""

from __future__ import annotations

import enum
import sys
from collections.abc import Awaitable, Callable, Coroutine
from time import perf_counter
from typing import Any, Final, Protocol, TypeVar

import anyio

from .._outcome import Outcome, committed_outcome
from .adaptive import LimitController
from .attempts import AttemptFn, Attempts, Retry
from .feedback import Feedback
from .limiter import Limiter, Slot
from .recorder import LoopLag
from .run import END, REFUSED, Run

if sys.version_info < (3, 11):  # pragma: no cover
    from exceptiongroup import BaseExceptionGroup

__all__ = [
    "IN_PLACE",
    "Body",
    "Chunks",
    "Executor",
    "Pacer",
    "Served",
    "SlidingWindow",
    "Team",
    "Worker",
    "drive",
    "serve_one",
]


class Served(enum.Enum):
    """How a worker's turn with its slot ended: what :meth:`Executor.serve` returns."""

    #: Units were served, and the input may hold more.
    MORE = "more"
    #: The input ran out, or the run stopped starting units.
    EXHAUSTED = "exhausted"
    #: A unit's attempt failed and it is owed another: the worker's ``retry`` holds it.
    RETRY = "retry"


# The per-unit path returns and compares these by identity, as module globals.
MORE: Final = Served.MORE
EXHAUSTED: Final = Served.EXHAUSTED
RETRY: Final = Served.RETRY


class Worker:
    """One of a run's workers. Executors add what they need to stop one."""

    __slots__ = ("retry", "slot")

    def __init__(self, slot: Slot) -> None:
        self.slot = slot
        #: The unit owed another attempt when :meth:`Executor.serve` returned ``RETRY``.
        self.retry: Retry | None = None


WorkerT = TypeVar("WorkerT", bound=Worker)
Body = Callable[[WorkerT], Coroutine[Any, Any, None]]


class Team(Protocol[WorkerT]):
    """A run's workers, as an executor runs them."""

    async def run(self, workers: list[WorkerT], body: Body[WorkerT]) -> None:
        """Run ``body(worker)`` for each worker, and for those spawned meanwhile, until all are done.

        If cancelled: stop every worker, wait for all of them, then let the cancellation go on.
        """
        ...

    def spawn(self, worker: WorkerT, body: Body[WorkerT]) -> None:
        """Start one more worker, unless the run is cancelled."""
        ...


class Executor(Protocol[WorkerT]):
    """How units run: the seam between the core and a kind of session, async or in threads."""

    def check(self, unit: object, index: int) -> str | None:
        """What is wrong with ``unit`` for this executor, or ``None``."""
        ...

    def worker(self, slot: Slot) -> WorkerT: ...

    def team(self, run: Run[Any], *, alone: bool = False) -> Team[WorkerT]:
        """The workers of ``run``; ``alone``: its one worker, awaited from the caller's task (submit())."""
        ...

    async def serve(self, run: Run[Any], worker: WorkerT, wait_s: float) -> Served:
        """Run units while ``worker`` holds its slot, and say how the turn ended."""
        ...

    async def attempt(self, worker: WorkerT, unit: Any, index: int) -> Any:
        """One attempt of ``unit``: its value, or it raises."""
        ...


async def serve_one(
    attempts: Attempts, attempt_fn: AttemptFn[WorkerT], run: Run[Any], worker: WorkerT, wait_s: float
) -> Served:
    """
    Pull one unit and attempt it once: an executor's ``serve``, one unit at a time.

    Bind the first two arguments with ``functools.partial``: every await between a worker and its unit
    is paid again each time the unit waits for the database, so this is the only one.
    """
    pulled = run.pull_sync() if run.pulls_sync else await run.pull()
    if pulled is END:
        return EXHAUSTED
    if pulled is not REFUSED:
        unit, index = pulled
        started = perf_counter()
        try:
            value = await attempt_fn(worker, unit, index)
        except Exception as error:
            settled = attempts.settle(error, index, 1, perf_counter() - started, wait_s)
            if not isinstance(settled, Outcome):
                worker.retry = Retry(unit, index, 2, settled, wait_s)
                return RETRY
        else:
            settled = committed_outcome(index, value, perf_counter() - started, wait_s)
        run.finish(settled)
    return EXHAUSTED if run.drained else MORE


class Pacer(Protocol):
    """What a worker does between two units."""

    #: Whether a unit to be retried is handed to a worker of its own, rather than retried in place.
    hands_off_retries: bool
    #: The pause between units, or ``None`` for none, as in the sliding window.
    between: Callable[[], Awaitable[None]] | None

    def leave(self) -> None:
        """A worker is done: the input ran out, or the run stopped."""
        ...


class SlidingWindow:
    """Start the next unit as soon as a slot is free."""

    hands_off_retries: bool = True
    between: Callable[[], Awaitable[None]] | None = None

    def leave(self) -> None:
        pass


class InPlace:
    """
    Each worker retries its unit itself, after a back-off: a lone unit's run (``submit()``), and a
    ProcessRunner worker's call, whose input waits for the parent (``BaseRunner._feed``).
    """

    hands_off_retries: bool = False
    between: Callable[[], Awaitable[None]] | None = None

    def leave(self) -> None:
        pass


IN_PLACE: Final = InPlace()


class Chunks:
    """Each of a run's ``workers`` runs one unit, then all wait until the last of them has finished."""

    hands_off_retries: bool = False

    def __init__(self, workers: int) -> None:
        self._parties = workers
        self._arrived = 0
        self._released = anyio.Event()
        self.between: Callable[[], Awaitable[None]] | None = self._arrive

    async def _arrive(self) -> None:
        self._arrived += 1
        if self._arrived >= self._parties:
            self._release()
        else:
            await self._released.wait()

    def leave(self) -> None:
        self._parties -= 1
        if self._arrived and self._arrived >= self._parties:
            self._release()

    def _release(self) -> None:
        self._arrived = 0
        released, self._released = self._released, anyio.Event()
        released.set()


#: How often, in seconds, a run with an auto limit has its controller look at the latest latencies.
ADJUST_INTERVAL_S = 0.02


class _Drive:
    """One run's workers: what each does, and the workers that carry retries."""

    def __init__(
        self,
        run: Run[Any],
        executor: Executor[Any],
        attempts: Attempts,
        pacer: Pacer,
        limiter: Limiter,
        controller: LimitController | None = None,
        alone: bool = False,
    ) -> None:
        self.run = run
        self.executor = executor
        self.attempts = attempts
        self.pacer = pacer
        self.limiter = limiter
        self.controller = controller
        self.team = executor.team(run, alone=alone)
        #: Workers started and not yet done, retry carriers aside, and whether one found the input
        #: exhausted. ``drive()`` sets them.
        self.live = 0
        self.exhausted = False

    async def adjust_forever(self) -> None:
        """With an auto limit: let the controller move the limit, and add workers when it rises."""
        assert self.controller is not None
        adjust, limiter, run = self.controller.adjust, self.limiter, self.run
        while True:
            await anyio.sleep(ADJUST_INTERVAL_S)
            adjust()
            wanted = min(limiter.share(run.priority), run.size)
            while self.live < wanted and not (self.exhausted or run.stopping):
                self.live += 1
                self.team.spawn(self.executor.worker(Slot(limiter, run.priority)), self.work)

    async def work(self, worker: Any) -> None:
        """A worker's life until the input runs out: take a slot, have units served, give it back, pace."""
        run, serve, pacer = self.run, self.executor.serve, self.pacer
        slot, window, between = worker.slot, run.window, pacer.between
        auto, limiter = self.controller is not None, self.limiter
        try:
            while not run.stopping:
                if auto and self.live > limiter.share(run.priority, limiter.target):
                    return  # the limit went down: one worker fewer
                if window is not None:
                    await window.acquire()
                waited = perf_counter()
                await slot.take()
                try:
                    served = await serve(run, worker, perf_counter() - waited)
                    if served is RETRY:
                        retry, worker.retry = worker.retry, None
                        assert retry is not None
                        if pacer.hands_off_retries:
                            run.recorder.attempt_paused()  # it gives up this worker's slot below
                            carrier = self.executor.worker(Slot(self.limiter, run.priority))
                            self.team.spawn(carrier, self._retrier(retry))
                        else:
                            await self._retry(worker, retry)
                finally:
                    slot.give()
                if served is EXHAUSTED:
                    self.exhausted = True
                    if window is not None:
                        window.release()
                    return
                if between is not None:
                    await between()
        finally:
            self.live -= 1
            pacer.leave()

    def _retrier(self, retry: Retry) -> Body[Any]:
        async def carry(worker: Any) -> None:
            try:
                await self._retry(worker, retry)
            finally:
                worker.slot.give()

        return carry

    async def _retry(self, worker: Any, retry: Retry) -> None:
        run = self.run
        run.finish(await self.attempts.rest(self.executor.attempt, worker, worker.slot, run.recorder, retry))


async def drive(
    run: Run[Any],
    executor: Executor[WorkerT],
    attempts: Attempts,
    pacer: Pacer,
    limiter: Limiter,
    workers: int,
    *,
    loop_lag: LoopLag | None = None,
    controller: LimitController | None = None,
    feedback: Feedback | None = None,
    read_ahead: Callable[[], Coroutine[Any, Any, None]] | None = None,
    slot: Slot | None = None,
    alone: bool = False,
) -> None:
    """
    Run every unit of ``run`` with ``workers`` workers, beside the loop-lag ticker.

    The controller's ticker, the feedback's and the task that reads an async input ahead run beside
    them too, if there are any. ``slot``, if given, is the first worker's.

    The workers run in a child task, not in the caller's: cancelled together with the ticker when
    the caller is — by a cancel scope, but also by a native ``Task.cancel()``,
    ``asyncio.timeout()`` or Ctrl-C in ``run_sync()``, which reach only the caller's task — and
    beyond the reach of a second native cancellation while they clean up.

    ``alone``: one unit and no helper, as ``submit()`` runs it. The team is run from the caller's
    task, without a task group of helpers to cancel when it is done: every team waits for its
    workers to clean up, also through a second native cancellation. Its one worker retries in
    place (``pacer`` is :data:`IN_PLACE`), and the executor may run it in the caller's task.
    """
    state = _Drive(run, executor, attempts, pacer, limiter, controller, alone)
    team = [executor.worker(Slot(limiter, run.priority)) for _ in range(workers - (slot is not None))]
    if slot is not None:
        team.insert(0, executor.worker(slot))
    state.live = workers
    if alone:  # see the docstring
        await state.team.run(team, state.work)
        return
    try:
        async with anyio.create_task_group() as helpers:
            if loop_lag is not None:
                helpers.start_soon(loop_lag.tick_forever)
            if controller is not None:
                helpers.start_soon(state.adjust_forever)
            if feedback is not None:
                helpers.start_soon(feedback.tick_forever)
            if read_ahead is not None:
                helpers.start_soon(read_ahead)

            async def work() -> None:
                try:
                    await state.team.run(team, state.work)
                finally:
                    helpers.cancel_scope.cancel()

            helpers.start_soon(work)
    except BaseExceptionGroup as group:  # an unexpected error of our own: show it plainly
        if len(group.exceptions) == 1:
            raise group.exceptions[0] from None
        raise
