"""
Lanes: how ThreadOffloadRunner runs a plain iterable of units without waking the event loop per unit.

A *lane* is a worker thread that holds one of the runner's slots and pulls units itself, one at a
time under a lock, as a ``ThreadPoolExecutor.map`` worker would. The event loop only starts lanes
and waits for them, so with the GIL busy in the ORM it is not a hop that every unit must wait for.
The contract is the per-unit path's: a unit is pulled only by a lane that holds a slot (so at most
``limit`` are materialised), its outcome and stats are recorded the same way, and:

- a lane gives its slot back as soon as anything else waits for one of the runner's slots
  (a ``submit()``, another batch), so sharing the limit stays fair;
- a unit to be retried leaves its lane: it backs off without a slot on the per-unit path;
- stopping (a failure with ``errors="raise"``, a cancellation) ends each lane after its unit.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Awaitable, Callable, Iterator
from threading import Lock
from time import perf_counter
from typing import TYPE_CHECKING, Any

import anyio
import anyio.to_thread

from .._outcome import Outcome
from .tasks import END, RunState, Slot, UnitMisuse, UnitTasks, logger

if TYPE_CHECKING:
    from .thread_offload import ThreadOffloadRunner


class Handle:
    """The DBAPI connection of one unit running in a thread, so that a cancellation can stop it."""

    __slots__ = ("cancelled", "dbapi")

    def __init__(self) -> None:
        self.dbapi: Any = None
        self.cancelled = False

    def cancel(self) -> None:
        """Ask the server to stop this unit's statement (called from another thread)."""
        self.cancelled = True
        dbapi = self.dbapi
        if dbapi is None:
            return
        for method in ("cancel_safe", "cancel", "interrupt"):  # psycopg 3.2+, psycopg2/3, sqlite3
            cancel = getattr(dbapi, method, None)
            if cancel is not None:
                try:
                    cancel()
                except Exception as error:  # the unit may have just finished
                    logger.debug("cancelling a unit's statement failed: %s", type(error).__qualname__)
                return


def cancel_all(handles: list[Handle]) -> None:
    for handle in handles:
        handle.cancel()


@dataclasses.dataclass(frozen=True, slots=True)
class _Retry:
    unit: Any
    index: int
    error: Exception
    wait_s: float


class Lanes:
    """One ``run()`` of a plain iterable, in up to ``limit`` lanes."""

    def __init__(
        self,
        runner: ThreadOffloadRunner,
        iterator: Iterator[Any],
        gate: anyio.Semaphore,
        limiter: anyio.CapacityLimiter,
        state: RunState,
        deliver: Callable[[Outcome[Any]], Awaitable[None]],
    ) -> None:
        self._runner = runner
        self._iterator = iterator
        self._gate = gate
        self._limiter = limiter
        self._state = state
        self._deliver = deliver
        self._pull_lock = Lock()
        self._next_index = 0
        self._exhausted = False
        self._running = 0
        self._ended = anyio.Event()

    def _done(self) -> bool:
        return self._exhausted or self._state.stop

    async def run(self) -> None:
        """Keep up to ``limit`` lanes going until the input is exhausted or the run stops."""
        async with (
            UnitTasks(self._runner, self._state, self._deliver) as retries,
            anyio.create_task_group() as lanes,
        ):
            while True:
                while self._running < self._runner.limit and not self._done():
                    waited = perf_counter()
                    await self._gate.acquire()
                    if self._done():
                        self._gate.release()
                        break
                    self._running += 1
                    lanes.start_soon(self._lane, Slot(self._gate), perf_counter() - waited, retries)
                if self._running == 0:
                    return
                await self._ended.wait()
                self._ended = anyio.Event()

    async def _lane(self, slot: Slot, wait_s: float, retries: UnitTasks) -> None:
        handed_over = False
        try:
            try:
                retry = await anyio.to_thread.run_sync(self._work, wait_s, limiter=self._limiter)
            finally:
                self._running -= 1
                self._ended.set()
            if retry is not None:
                runner, state = self._runner, self._state
                backed_off = await runner._back_off(retry.index, 1, retry.error, slot, state)
                retries.start(retry.unit, retry.index, slot, retry.wait_s + backed_off, attempt=2)
                handed_over = True
        finally:
            if not handed_over:
                slot.release()

    def _pull(self) -> tuple[Any, int]:
        """The next unit and its index, or ``END``; in a worker thread, under the pull lock."""
        with self._pull_lock:
            if self._done():
                return END, -1
            try:
                unit = next(self._iterator, END)
            except Exception as error:  # the caller's iterable failed: drain, then re-raise it
                self._state.input_error, self._state.stop = error, True
                unit = END
            if unit is END:
                self._exhausted = True
                return END, -1
            index = self._next_index
            self._next_index += 1
            return unit, index

    def _work(self, wait_s: float) -> _Retry | None:
        """A lane's body, in a worker thread: run units until done, yielding the slot when asked."""
        state, gate = self._state, self._gate
        collect, recorder = state.collect, state.recorder
        assert collect is not None
        while True:
            # Register before pulling: the canceller sets ``stop`` and then cancels every handle
            # it finds, so a lane either is found or finds ``stop`` set (no unit slips between).
            handle = Handle()
            state.handles.add(handle)
            try:
                outcome = self._run_next(handle, wait_s)
            finally:
                state.handles.discard(handle)
            if outcome is None:
                return None
            if isinstance(outcome, _Retry):
                return outcome
            if recorder is not None:
                recorder.unit_finished(outcome.error is None, outcome.latency_s, 1)
            collect(outcome)
            wait_s = 0.0
            if gate.statistics().tasks_waiting:
                return None  # someone else is waiting for one of the runner's slots: give ours up

    def _run_next(self, handle: Handle, wait_s: float) -> Outcome[Any] | _Retry | None:
        """Pull one unit and run its first attempt; ``None`` when the lane is to end."""
        runner, state = self._runner, self._state
        unit, index = self._pull()
        if unit is END:
            return None
        try:
            runner._check_unit(unit, index)
        except UnitMisuse as misuse:
            state.misuse, state.stop = misuse.error, True
            return None
        if state.recorder is not None:
            state.recorder.unit_started()
        started = perf_counter()
        try:
            value = runner._in_thread(unit, index, handle)
        except Exception as error:
            latency = perf_counter() - started
            outcome = runner._settle_failure(error, index, 1, latency, wait_s, state)
            return _Retry(unit, index, error, wait_s) if outcome is None else outcome
        return Outcome(index, value, None, perf_counter() - started, wait_s)
