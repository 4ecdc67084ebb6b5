"""
Batches: many units in one transaction, and what happens to each unit when the transaction fails.

A worker holding a slot pulls up to ``size`` units and has the executor run them one after another
in one session, committed once. Every unit's outcome waits for that COMMIT. When the transaction
fails, :class:`Batches` finds who failed it without taking anyone else's writes with it:

1. A transient error, by the runner's retry policy, runs the whole batch again after a back-off.
2. A unit that raised runs alone, as it would without batches; the others run again as a batch.
3. A failure that names no unit, the flush before COMMIT or the COMMIT itself, runs the batch once
   more with each unit's changes flushed as it returns: the unit whose flush fails is named (2).
4. If that names no unit either (a deferred constraint), the batch is bisected: each half in its
   own transaction, until the culprit stands alone.
5. A COMMIT whose fate is unknown leaves every unit of the batch ``commit_unknown``.

A batch of one unit runs the executor's one-unit attempt, so a unit alone meets exactly its retries,
its timeout and its error. See "Batches" in ``docs/explanation/architecture.md``.
"""

from __future__ import annotations

import math
from collections.abc import Awaitable, Callable
from time import perf_counter
from typing import Any, Protocol

import anyio

from .._outcome import Outcome
from .attempts import AttemptFn, Attempts, CommitUnknown, CommitVerified, ConnectFailed, Retry
from .pacing import EXHAUSTED, MORE, Served, Worker
from .run import END, REFUSED, Pulled, Run

__all__ = ["BatchAttemptFn", "BatchUnitFailed", "Batches", "Pending"]

#: A unit pulled from its run, and its index.
Pending = tuple[Any, int]
#: One attempt of a batch by a worker: the units' values in order, or it raises.
BatchAttemptFn = Callable[[Any, list[Pending], int], Awaitable[list[Any]]]


class BatchUnitFailed(Exception):
    """Carries the error of the unit at ``position`` of a batch: the batch was rolled back."""

    def __init__(self, position: int, error: Exception) -> None:
        super().__init__(position, error)
        self.position = position
        self.error = error


class BatchSize(Protocol):
    """What :class:`Batches` needs of a :class:`~boundeddb.BatchPolicy`."""

    @property
    def size(self) -> int: ...

    @property
    def linger(self) -> float: ...


class Batches:
    """An executor's ``serve`` for a runner with batches: pull a batch, run it, settle every unit."""

    __slots__ = ("_attempt", "_attempt_batch", "_attempts", "_pinpoint", "linger", "size")

    def __init__(
        self,
        policy: BatchSize,
        attempts: Attempts,
        attempt: AttemptFn[Any],
        attempt_batch: BatchAttemptFn,
        pinpoint: BatchAttemptFn,
    ) -> None:
        """``pinpoint`` attempts a batch flushing each unit's changes as it returns (case 3)."""
        self.size = policy.size
        self.linger = policy.linger
        self._attempts = attempts
        self._attempt = attempt
        self._attempt_batch = attempt_batch
        self._pinpoint = pinpoint

    async def serve(self, run: Run[Any], worker: Worker, wait_s: float) -> Served:
        """Pull up to ``size`` units and run them as one batch; EXHAUSTED once the input is."""
        batch, ended = await self._fill(run)
        if batch:
            telemetry = run.telemetry
            if telemetry is None:
                await self.settle(run, worker, batch, wait_s)
            else:
                span, batch = telemetry.open_batch(batch)
                try:
                    await self.settle(run, worker, batch, wait_s)
                finally:
                    span.end()
        return EXHAUSTED if ended else MORE

    async def _fill(self, run: Run[Any]) -> tuple[list[Pending], bool]:
        """
        The next batch, and whether the input ended with it.

        The first unit is waited for as long as the input takes; the others for at most ``linger``
        seconds in all. A stream's window is taken once per unit: the worker took the first.
        """
        batch: list[Pending] = []
        window, size = run.window, self.size
        deadline = math.inf
        pulled_any = False
        while len(batch) < size:
            if pulled_any and window is not None:
                try:
                    window.acquire_nowait()
                except anyio.WouldBlock:
                    break  # the consumer is behind: start with what we have
            pulled: tuple[Any, int] | Pulled | None
            if run.pulls_sync:
                pulled = run.pull_sync()
            elif not pulled_any:
                pulled = await run.pull()
            else:
                if deadline == math.inf:
                    deadline = anyio.current_time() + self.linger
                pulled = await run.pull_before(deadline)
            if pulled is END or pulled is None:
                if pulled_any and window is not None:
                    window.release()
                # At the end of the input the worker gives one window back, unused or not: it
                # is the last pull of the stream, whose window then outgrows its size by one.
                return batch, pulled is END
            pulled_any = True
            if pulled is not REFUSED:
                batch.append(pulled)
        return batch, False

    async def settle(self, run: Run[Any], worker: Worker, batch: list[Pending], wait_s: float) -> None:
        """Run ``batch`` until every unit of it has its outcome (see the module docstring)."""
        todo: list[tuple[list[Pending], bool]] = [(batch, True)]
        while todo:
            group, may_pinpoint = todo.pop()
            if len(group) == 1:
                await self._alone(run, worker, group[0], wait_s)
            else:
                todo.extend(reversed(await self._attempt_group(run, worker, group, wait_s, may_pinpoint)))

    async def _alone(self, run: Run[Any], worker: Worker, pending: Pending, wait_s: float) -> None:
        """One unit in its own transaction, with its own retries: as without batches."""
        unit, index = pending
        started = perf_counter()
        try:
            value = await self._attempt(worker, unit, index)
        except Exception as error:
            settled = self._attempts.settle(error, index, 1, perf_counter() - started, wait_s)
            if not isinstance(settled, Outcome):
                retry = Retry(unit, index, 2, settled, wait_s)
                settled = await self._attempts.rest(self._attempt, worker, worker.slot, run.recorder, retry)
        else:
            settled = Outcome(index, value, None, perf_counter() - started, wait_s)
        if settled.error is None:
            run.recorder.batch_committed()
        run.finish(settled)

    async def _attempt_group(
        self, run: Run[Any], worker: Worker, group: list[Pending], wait_s: float, may_pinpoint: bool
    ) -> list[tuple[list[Pending], bool]]:
        """
        Attempt ``group`` as one batch until it commits or must be split: the groups to run next,
        each with whether it may still be pinpointed (case 3 of the module docstring).
        """
        attempt = 1
        recorder = run.recorder
        attempt_batch = self._attempt_batch
        while True:
            started = perf_counter()
            try:
                values = await attempt_batch(worker, group, group[0][1])
            except BatchUnitFailed as failed:
                ran = failed.position + 1
                delay = self._attempts.again(failed.error, attempt, perf_counter() - started)
                if delay is None:
                    recorder.rerun(ran)
                    position = failed.position
                    return [(group[:position] + group[position + 1 :], True), ([group[position]], True)]
            except CommitUnknown as unknown:
                self._attempts.commit_unknown(unknown, group[0][1], len(group))
                latency = perf_counter() - started
                for _, index in group:
                    run.finish(Outcome(index, None, unknown.error, latency, wait_s, attempt, True))
                return []
            except Exception as error:
                if isinstance(error, CommitVerified):
                    if error.committed:
                        self._finish(run, group, error.value, started, wait_s, attempt, verified=True)
                        return []
                    error = error.error  # the server aborted it: nothing of it committed
                ran = len(group)
                delay = self._attempts.again(error, attempt, perf_counter() - started)
                if delay is None:
                    if isinstance(error, ConnectFailed):  # nothing ran: each unit fails as it would alone
                        for _, index in group:
                            run.finish(Outcome(index, None, error.error, 0.0, wait_s, attempt))
                        return []
                    recorder.rerun(ran)
                    if may_pinpoint:  # once more, each unit's changes flushed as it returns
                        may_pinpoint, attempt_batch = False, self._pinpoint
                        continue
                    half = len(group) // 2
                    return [(group[:half], False), (group[half:], False)]
            else:
                self._finish(run, group, values, started, wait_s, attempt)
                return []
            recorder.rerun(ran)
            await _back_off(worker, delay)
            attempt += 1

    @staticmethod
    def _finish(
        run: Run[Any],
        group: list[Pending],
        values: list[Any],
        started: float,
        wait_s: float,
        attempt: int,
        *,
        verified: bool = False,
    ) -> None:
        latency = perf_counter() - started
        run.recorder.batch_committed()
        if run.telemetry is not None:
            run.telemetry.batch_committed(len(group))
        finish = run.finish
        for (_, index), value in zip(group, values, strict=True):
            finish(Outcome(index, value, None, latency, wait_s, attempt, commit_verified=verified))


async def _back_off(worker: Worker, delay: float) -> None:
    """Wait ``delay`` seconds before a batch runs again, without holding a slot meanwhile."""
    slot = worker.slot
    slot.give()
    await anyio.sleep(delay)
    await slot.take()
