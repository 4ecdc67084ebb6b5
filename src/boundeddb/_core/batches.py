"""
Batches: many units in one transaction, and what happens to each unit when the transaction fails.

A worker holding a slot pulls up to ``size`` units and has the executor run them one after another
in one session, committed once. Every unit's outcome waits for that COMMIT. When the transaction
fails, :class:`Batches` finds who failed it without taking anyone else's writes with it, in the
order that "Batches" in ``docs/explanation/architecture.md`` gives: the whole batch again for a
transient error, a unit that raised alone, a pinpointing pass for a failure that names no unit,
then bisection. A batch of one unit runs the executor's one-unit attempt, so a unit alone meets
exactly its retries, its timeout and its error.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Awaitable, Callable
from time import perf_counter
from typing import Any, Protocol

import anyio

from .._outcome import Outcome
from .attempts import AttemptFn, Attempts, CommitUnknown, CommitVerified, ConnectFailed, Retry
from .pacing import EXHAUSTED, MORE, Served, Worker
from .run import END, REFUSED, Pulled, Run
from .withdrawals import NO_WITHDRAWALS, Withdrawals, Withdrawn

__all__ = [
    "BatchAttemptFn",
    "BatchSize",
    "BatchUnitFailed",
    "BatchUnits",
    "Batches",
    "Failure",
    "Pending",
    "Withdrawn",
    "committed",
]

#: A unit pulled from its run, and its index.
Pending = tuple[Any, int]


class BatchUnits(list[Pending]):
    """The units of one batch's attempt, and the withdrawals of their run (see ``withdrawals.py``)."""

    __slots__ = ("withdrawals",)

    def __init__(self, units: list[Pending], withdrawals: Withdrawals) -> None:
        super().__init__(units)
        #: Shared with the run and its ``submit()`` calls: units may be withdrawn while the attempt runs.
        self.withdrawals = withdrawals


#: One attempt of a batch by a worker: the units' values in order, or it raises.
BatchAttemptFn = Callable[[Any, BatchUnits, int], Awaitable[list[Any]]]

#: What a batch's first attempt, made elsewhere, raised, and when that attempt started (perf_counter).
Failure = tuple[Exception, float]


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
        """``pinpoint``: an attempt that flushes each unit as it returns, so that the failing one is named."""
        self.size = policy.size
        self.linger = policy.linger
        self._attempts = attempts
        self._attempt = attempt
        self._attempt_batch = attempt_batch
        self._pinpoint = pinpoint

    async def serve(self, run: Run[Any], worker: Worker, wait_s: float) -> Served:
        """Pull up to ``size`` units and run them as one batch. EXHAUSTED once the input is."""
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
        return EXHAUSTED if ended or run.drained else MORE

    async def _fill(self, run: Run[Any]) -> tuple[list[Pending], bool]:
        """
        The next batch, and whether the input ended with it.

        The first unit is waited for as long as the input takes, the others for at most ``linger``
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

    async def settle(
        self,
        run: Run[Any],
        worker: Worker,
        batch: list[Pending],
        wait_s: float,
        failure: Failure | None = None,
    ) -> None:
        """
        Run ``batch`` until every unit of it has its outcome.

        ``failure``: the batch's first attempt was made elsewhere, a thread's lane, and failed so.
        """
        todo: list[tuple[list[Pending], bool]] = [(batch, True)]
        while todo:
            group, may_pinpoint = todo.pop()
            if len(group) == 1 and failure is None:
                await self._alone(run, worker, group[0], wait_s)
            else:
                todo.extend(
                    reversed(await self._attempt_group(run, worker, group, wait_s, may_pinpoint, failure))
                )
                failure = None

    async def _alone(self, run: Run[Any], worker: Worker, pending: Pending, wait_s: float) -> None:
        """One unit in its own transaction, with its own retries: as without batches."""
        unit, index = pending
        withdrawals = run.withdrawals
        if index in withdrawals.indexes:
            run.finish(Outcome(index, None, Withdrawn(index), 0.0, wait_s, 0))
            return
        attempt = self._attempt
        if withdrawals is not NO_WITHDRAWALS:  # a submit()'s: its caller may withdraw it until its COMMIT
            attempt = functools.partial(self._withdrawable, withdrawals)
        started = perf_counter()
        try:
            value = await attempt(worker, unit, index)
        except Exception as error:
            settled = self._attempts.settle(error, index, 1, perf_counter() - started, wait_s)
            if not isinstance(settled, Outcome):
                retry = Retry(unit, index, 2, settled, wait_s)
                settled = await self._attempts.rest(attempt, worker, worker.slot, run.recorder, retry)
        else:
            settled = Outcome(index, value, None, perf_counter() - started, wait_s)
        if settled.error is None:
            run.recorder.batch_committed()
        run.finish(settled)

    async def _withdrawable(self, withdrawals: Withdrawals, worker: Worker, unit: Any, index: int) -> Any:
        """
        One attempt of a ``submit()``'s unit alone: as a batch of one, whose script checks that its
        caller has not withdrawn it and marks its COMMIT begun in one step. It fails as the unit would
        alone, with the unit's own error, or with :class:`Withdrawn`, which is not retried.
        """
        try:
            values = await self._attempt_batch(worker, BatchUnits([(unit, index)], withdrawals), index)
        except BatchUnitFailed as failed:
            error = failed.error
        except CommitVerified as verified:
            if verified.committed:  # the server committed the batch of one: its value, not the list
                verified.value = verified.value[0]
            raise
        else:
            return values[0]
        raise error  # outside the handler: the unit's own exception keeps its own context

    async def _attempt_group(
        self,
        run: Run[Any],
        worker: Worker,
        group: list[Pending],
        wait_s: float,
        may_pinpoint: bool,
        failure: Failure | None,
    ) -> list[tuple[list[Pending], bool]]:
        """
        Attempt ``group`` as one batch until it commits or must be split.

        Return the groups to run next, each with whether a failure that names no unit may still be
        pinpointed in it before it is bisected. With ``failure``, the first attempt is the one that
        failed so.
        """
        attempt = 1
        recorder = run.recorder
        attempt_batch = self._attempt_batch
        while True:
            started = perf_counter() if failure is None else failure[1]
            try:
                if failure is not None:
                    error, failure = failure[0], None
                    raise error
                values = await attempt_batch(worker, BatchUnits(group, run.withdrawals), group[0][1])
            except BatchUnitFailed as failed:
                ran = failed.position + 1
                if isinstance(failed.error, Withdrawn):  # its caller is gone: it is not run again
                    position = failed.position
                    recorder.rerun(failed.position)
                    run.finish(Outcome(group[position][1], None, failed.error, 0.0, wait_s, attempt))
                    return [(group[:position] + group[position + 1 :], may_pinpoint)]
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
                        committed(run, group, error.value, started, wait_s, attempt, verified=True)
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
                committed(run, group, values, started, wait_s, attempt)
                return []
            recorder.rerun(ran)
            await _back_off(worker, delay)
            attempt += 1


def committed(
    run: Run[Any],
    group: list[Pending],
    values: list[Any],
    started: float,
    wait_s: float,
    attempt: int,
    *,
    verified: bool = False,
) -> None:
    """``group`` committed in one transaction begun at ``started``: each unit's outcome. From any thread."""
    latency = perf_counter() - started
    if run.telemetry is not None:
        run.telemetry.batch_committed(len(group))
    run.finish_committed(group, values, latency, wait_s, attempt, verified)


async def _back_off(worker: Worker, delay: float) -> None:
    """Wait ``delay`` seconds before a batch runs again, without holding a slot meanwhile."""
    slot = worker.slot
    slot.give()
    await anyio.sleep(delay)
    await slot.take()
