"""
Batches of sync units in worker threads: where it can, a thread runs whole batches as a lane.

A lane is what ``threads.py`` makes of one-unit work on a plain iterable: a thread that pulls, runs
and settles units itself, with no trip through the event loop between them. Here a lane fills a
batch, runs it in one transaction and settles its units, batch after batch. A batch that fails goes
back to the loop, where :class:`~boundeddb._core.batches.Batches` settles its units from that
failure. Any other input, and a run with telemetry, takes one trip to a thread per attempt.
"""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable
from time import perf_counter
from typing import Any

from .._core.attempts import AttemptFn, Attempts
from .._core.batches import Batches, BatchSize, BatchUnits, Failure, Pending, committed
from .._core.pacing import EXHAUSTED, MORE, Served
from .._core.run import Run
from .thread_handles import Handle, ThreadWorker

__all__ = ["BatchLanes"]

#: A batch script of ``batch_script.py``, bound to its session factory and dialect.
BatchScript = Callable[["Handle", BatchUnits, int], list[Any]]
#: Runs a function in one of the runner's worker threads; a run's cancellation goes through it.
InThread = Callable[..., Awaitable[Any]]


class BatchLanes:
    """The thread executor's ``serve`` with ``batch=``."""

    __slots__ = ("_batches", "_in_thread", "_plain", "_should_yield", "_size")

    def __init__(
        self,
        policy: BatchSize,
        attempts: Attempts,
        attempt: AttemptFn[Any],
        scripts: tuple[BatchScript, BatchScript],
        in_thread: InThread,
        should_yield: Callable[[], bool],
    ) -> None:
        """``scripts``: the batch's attempt, and its twin that flushes each unit as it returns."""
        plain, pinpoint = scripts
        self._plain = plain
        self._in_thread = in_thread
        self._should_yield = should_yield
        self._size = policy.size
        self._batches = Batches(
            policy,
            attempts,
            attempt,
            functools.partial(self._attempt, plain),
            functools.partial(self._attempt, pinpoint),
        )

    async def _attempt(
        self, script: BatchScript, worker: ThreadWorker, units: BatchUnits, first: int
    ) -> list[Any]:
        values: list[Any] = await self._in_thread(script, worker.handle, units, first)
        return values

    async def serve(self, run: Run[Any], worker: ThreadWorker, wait_s: float) -> Served:
        """Run batches in a lane until it is to end; settle on the loop the batch that did not commit."""
        if not run.pulls_in_threads or run.telemetry is not None:
            return await self._batches.serve(run, worker, wait_s)
        served: Served
        served, unsettled = await self._in_thread(self._lane, run, worker, wait_s)
        if unsettled is not None:
            batch, wait_s, failure = unsettled
            await self._batches.settle(run, worker, batch, wait_s, failure)
        return served

    def _lane(
        self, run: Run[Any], worker: ThreadWorker, wait_s: float
    ) -> tuple[Served, tuple[list[Pending], float, Failure | None] | None]:
        """
        Fill, run and settle batches in this thread until the lane is to end.

        Return how it ended, and a batch left for the loop to settle: one that failed, with its
        failure, or a batch of one unit, which runs as a unit alone does.
        """
        script, size, handle, should_yield = self._plain, self._size, worker.handle, self._should_yield
        while True:
            batch, ended = run.pull_many_sync(size)
            served = EXHAUSTED if ended else MORE
            if len(batch) == 1:
                return served, (batch, wait_s, None)
            if batch:
                started = perf_counter()
                try:
                    values = script(handle, BatchUnits(batch, run.withdrawals), batch[0][1])
                except Exception as error:
                    return served, (batch, wait_s, (error, started))
                committed(run, batch, values, started, wait_s, 1)
                wait_s = 0.0
            if ended or run.stopping:
                return EXHAUSTED, None
            if should_yield():
                return MORE, None  # someone else waits for one of the runner's slots: give ours up
