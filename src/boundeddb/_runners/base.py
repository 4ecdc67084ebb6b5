"""The lifecycle every runner shares: slots, the per-unit path, batches, streams and submits.

A concrete runner supplies two things:
``_attempt`` (run one unit once, in its own session and transaction) and, for
:class:`~boundeddb.ChunkedRunner`, a different ``_pace`` (how units are started).
Everything else — the slot acquired *before* a unit is pulled, retries that give their slot back,
outcomes, stats, stopping at the first failure, cancellation — lives here, once.
"""

from __future__ import annotations

import sys
import threading
from collections.abc import AsyncGenerator, AsyncIterable, Awaitable, Callable, Iterable
from contextlib import contextmanager, suppress
from time import perf_counter
from typing import Any, Generic, TypeVar

import anyio
import anyio.lowlevel
from sqlalchemy.engine import Engine

from .._errors import RunFailed, RunnerBusyElsewhereError, RunnerClosedError
from .._outcome import Outcome, RunReport
from .._stats import LoopLag, StatsRecorder
from .checks import ErrorsMode, check_errors, check_retry, check_timeout, checked_iterable
from .tasks import (
    END,
    CommitUnknown,
    ConnectFailed,
    Puller,
    RunState,
    Slot,
    UnitMisuse,
    UnitTasks,
    _background,
    call_when_cancelled,
    logger,
)

MakerT = TypeVar("MakerT")

if sys.version_info < (3, 11):  # pragma: no cover
    from exceptiongroup import BaseExceptionGroup


class _Binding:
    """The runner's slots, which belong to one event loop at a time."""

    def __init__(self, token: object, limit: int) -> None:
        self.token = token
        # fast_acquire: no extra trip through the event loop when a slot is free (the hot path).
        self.gate = anyio.Semaphore(limit, fast_acquire=True)
        self.thread_limiter = anyio.CapacityLimiter(limit)
        self.users = 0


class BaseRunner(Generic[MakerT]):
    """Shared machinery; see the concrete runners for the public API."""

    def __init__(
        self,
        sessions: MakerT,
        *,
        limit: int,
        errors: object,
        retry: object,
        timeout: object,
        engine: Engine,
    ) -> None:
        self._sessions = sessions
        self._engine = engine
        self._limit = limit
        self._errors = check_errors(errors)
        self._retry = check_retry(retry)
        self._timeout = check_timeout(timeout)
        self._closed = False
        self._binding: _Binding | None = None
        self._binding_lock = threading.Lock()

    # -- public read-only state ---------------------------------------------------------------

    @property
    def limit(self) -> int:
        """The most units of this runner in flight at once, across all its calls."""
        return self._limit

    @property
    def in_flight(self) -> int:
        """Units holding a slot right now."""
        binding = self._binding
        return 0 if binding is None else self._limit - binding.gate.value

    def __repr__(self) -> str:
        binding = self._binding
        waiting = 0 if binding is None else binding.gate.statistics().tasks_waiting
        state = " closed" if self._closed else ""
        return (
            f"<{type(self).__name__} limit={self._limit} in_flight={self.in_flight} waiting={waiting}{state}>"
        )

    # -- lifecycle ----------------------------------------------------------------------------

    async def aclose(self) -> None:
        """
        Refuse new work from now on; calls already running finish as usual.

        The engine is the caller's: it is not disposed.
        """
        self._closed = True

    async def __aenter__(self) -> Any:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    @contextmanager
    def _bound(self) -> Any:
        """Use the runner from the current event loop, refusing a second loop while one is busy."""
        if self._closed:
            msg = f"this {type(self).__name__} is closed: create a new runner"
            raise RunnerClosedError(msg)
        token = anyio.lowlevel.current_token()
        with self._binding_lock:
            binding = self._binding
            if binding is None or binding.token != token:
                if binding is not None and binding.users:
                    msg = (
                        f"this {type(self).__name__} has work in flight on another event loop; its limit "
                        "is enforced within one loop at a time. Create one runner per event loop "
                        "(or per thread calling run_sync) — they can share the engine."
                    )
                    raise RunnerBusyElsewhereError(msg)
                binding = self._binding = _Binding(token, self._limit)
            binding.users += 1
        try:
            yield binding
        finally:
            with self._binding_lock:
                binding.users -= 1

    # -- what a concrete runner supplies --------------------------------------------------------

    def _check_unit(self, unit: object, index: int) -> None:
        """Raise UnitMisuse if ``unit`` can be seen to be of the wrong kind before it runs."""
        if not callable(unit):
            msg = (
                f"unit {index} is {unit!r}, which is not callable: pass a function that takes "
                f"the session, e.g. {self._unit_example}"
            )
            raise UnitMisuse(msg)

    _unit_example = "async def unit(session): ..."

    async def _attempt(self, unit: Any, index: int, state: RunState) -> Any:
        raise NotImplementedError

    def _on_cancel_statements(self, state: RunState) -> Callable[[], Awaitable[None]] | None:
        """A coroutine that stops in-flight statements when a run is cancelled, if needed."""
        return None

    # -- one unit: attempts, retries, slot hand-back ---------------------------------------------

    def _settle_failure(
        self, error: Exception, index: int, attempt: int, latency: float, wait_s: float, state: RunState
    ) -> Outcome[Any] | None:
        """The outcome of a failed attempt, or ``None`` if the unit is to be tried again."""
        if isinstance(error, UnitMisuse):
            if state.misuse is None:
                state.misuse = error.error
            state.stop = True
            return Outcome(index, None, error.error, latency, wait_s, attempt)
        if isinstance(error, CommitUnknown):
            logger.warning(
                "unit %d: the connection failed during COMMIT (%s); it may have committed",
                index,
                type(error.error).__qualname__,
            )
            if state.stop_on_failure:
                state.stop = True
            return Outcome(index, None, error.error, latency, wait_s, attempt, True)
        if isinstance(error, ConnectFailed):
            # The unit never ran: retrying is safe whatever the error, if the policy allows more.
            if attempt < self._retry.attempts:
                return None
            error = error.error
        elif self._retry.should_retry(error, attempt):
            return None
        logger.debug("unit %d failed after %d attempt(s): %s", index, attempt, type(error).__qualname__)
        if state.stop_on_failure:
            state.stop = True
        return Outcome(index, None, error, latency, wait_s, attempt)

    async def _unit_task(
        self,
        unit: Any,
        index: int,
        slot: Slot,
        wait_s: float,
        state: RunState,
        deliver: Callable[[Outcome[Any]], Awaitable[None]],
        attempt: int = 1,
    ) -> None:
        try:
            while True:
                started = perf_counter()
                try:
                    value = await self._attempt(unit, index, state)
                except Exception as error:
                    settled = self._settle_failure(
                        error, index, attempt, perf_counter() - started, wait_s, state
                    )
                    if settled is not None:
                        outcome = settled
                        break
                    wait_s += await self._back_off(index, attempt, error, slot, state)
                    attempt += 1
                else:
                    outcome = Outcome(index, value, None, perf_counter() - started, wait_s, attempt)
                    break
        finally:
            slot.release()
        if state.recorder is not None:
            state.recorder.unit_finished(outcome.error is None, outcome.latency_s, attempt)
        await deliver(outcome)

    async def _back_off(
        self, index: int, attempt: int, error: Exception, slot: Slot, state: RunState
    ) -> float:
        """Give the slot back, sleep the policy's delay, take a slot again; return the slot wait."""
        delay = self._retry.delay(attempt)
        shown = error.error if isinstance(error, ConnectFailed) else error
        logger.warning(
            "unit %d attempt %d failed with %s; retrying in %.3f s",
            index,
            attempt,
            type(shown).__qualname__,
            delay,
        )
        slot.release()  # never hold a connection slot while backing off
        if state.recorder is not None:
            state.recorder.attempt_paused()
        await anyio.sleep(delay)
        waited = perf_counter()
        await slot.reacquire()
        if state.recorder is not None:
            state.recorder.attempt_resumed()
        return perf_counter() - waited

    # -- many units: pulling lazily under the limit -----------------------------------------------

    async def _pace(
        self,
        pull: Puller,
        gate: anyio.Semaphore,
        state: RunState,
        deliver: Callable[[Outcome[Any]], Awaitable[None]],
        window: anyio.Semaphore | None,
    ) -> None:
        """Sliding window: start a unit whenever a slot is free; acquire the slot *before* pulling."""
        index = 0
        async with UnitTasks(self, state, deliver) as units:
            while True:
                slot, unit, wait_s = await self._next_unit(pull, gate, state, window, index)
                if slot is None:
                    return
                units.start(unit, index, slot, wait_s)
                index += 1

    async def _next_unit(
        self,
        pull: Puller,
        gate: anyio.Semaphore,
        state: RunState,
        window: anyio.Semaphore | None,
        index: int,
    ) -> tuple[Slot | None, Any, float]:
        """Acquire a slot, then pull and check one unit; ``(None, ...)`` (slot released) when done."""
        if state.stop:
            return None, END, 0.0
        if window is not None:
            await window.acquire()
        waited = perf_counter()
        await gate.acquire()
        wait_s = perf_counter() - waited
        unit = END
        try:
            if not state.stop:
                unit = await pull()
                if unit is not END:
                    self._check_unit(unit, index)
        except UnitMisuse as misuse:
            state.misuse, state.stop, unit = misuse.error, True, END
        except Exception as error:  # the caller's iterable failed: drain, then re-raise it
            state.input_error, state.stop, unit = error, True, END
        finally:
            if unit is END:
                gate.release()
                if window is not None:
                    window.release()
        if unit is END:
            return None, END, wait_s
        return Slot(gate), unit, wait_s

    async def _drive(
        self,
        units: Iterable[Any] | AsyncIterable[Any],
        binding: _Binding,
        state: RunState,
        deliver: Callable[[Outcome[Any]], Awaitable[None]],
        window: anyio.Semaphore | None = None,
    ) -> None:
        """Run every unit of ``units`` (with the loop-lag ticker and the canceller beside them)."""
        pull = Puller(units)

        async def pace() -> None:
            await self._pace(pull, binding.gate, state, deliver, window)

        ticker = state.recorder is not None and state.measure_loop_lag
        await self._beside_helpers(state, pace, ticker=ticker)

    async def _beside_helpers(
        self, state: RunState, work: Callable[[], Awaitable[None]], *, ticker: bool
    ) -> None:
        """
        Run ``work`` as a child task, beside the loop-lag ticker and the statement canceller.

        As a child (not in the caller's task), the work and the canceller are cancelled together
        when the caller is: by a cancel scope, but also by a native ``Task.cancel()``,
        ``asyncio.timeout()`` or Ctrl-C in ``run_sync()``, which only reach the caller's task.
        """
        on_cancel = self._on_cancel_statements(state)
        try:
            async with anyio.create_task_group() as helpers:
                if ticker and state.recorder is not None:
                    lag = state.recorder.loop_lag = LoopLag()
                    helpers.start_soon(lag.tick_forever)
                if on_cancel is not None:
                    helpers.start_soon(call_when_cancelled, on_cancel)

                async def run_work() -> None:
                    try:
                        await work()
                    finally:
                        helpers.cancel_scope.cancel()

                helpers.start_soon(run_work)
        except BaseExceptionGroup as group:  # an unexpected error of our own: show it plainly
            if len(group.exceptions) == 1:
                raise group.exceptions[0] from None
            raise

    def _new_state(self, *, keep_latencies: bool = True, measure_loop_lag: bool = True) -> RunState:
        recorder = StatsRecorder(self._engine.pool, keep_latencies=keep_latencies)
        return RunState(
            stop_on_failure=self._errors == "raise",
            recorder=recorder,
            measure_loop_lag=measure_loop_lag,
        )

    async def _run_units(
        self, units: Iterable[Any] | AsyncIterable[Any], *, measure_loop_lag: bool = True
    ) -> RunReport[Any]:
        units = self._checked_units(units)
        outcomes: list[Outcome[Any]] = []
        state = self._new_state(measure_loop_lag=measure_loop_lag)
        lock = threading.Lock()

        def collect(outcome: Outcome[Any]) -> None:
            index = outcome.index
            with lock:
                if index >= len(outcomes):
                    outcomes.extend([outcome] * (index + 1 - len(outcomes)))
                outcomes[index] = outcome

        async def deliver(outcome: Outcome[Any]) -> None:
            collect(outcome)

        state.collect = collect

        assert state.recorder is not None
        try:
            with self._bound() as binding:
                await self._drive(units, binding, state, deliver)
        finally:
            state.recorder.close()
        report = RunReport(outcomes, state.recorder.finish())
        _raise_for_state(state, report, self._errors)
        return report

    async def _stream_units(
        self, units: Iterable[Any] | AsyncIterable[Any]
    ) -> AsyncGenerator[Outcome[Any], None]:
        units = self._checked_units(units)
        with self._bound() as binding:
            state = self._new_state(keep_latencies=False)
            recorder = state.recorder
            assert recorder is not None
            failures: list[Outcome[Any]] = []
            # Pulled but not yet consumed: at most twice the limit, so memory stays O(limit).
            window = anyio.Semaphore(2 * self._limit)
            send, receive = anyio.create_memory_object_stream[Outcome[Any]](self._limit)

            async def deliver(outcome: Outcome[Any]) -> None:
                if outcome.error is not None:
                    failures.append(outcome)
                with suppress(anyio.BrokenResourceError, anyio.ClosedResourceError):
                    await send.send(outcome)  # the consumer may have stopped listening

            async def produce(binding: _Binding) -> None:
                async with send:
                    await self._drive(units, binding, state, deliver, window)

            try:
                async with _background(produce, binding), receive:
                    async for outcome in receive:
                        window.release()
                        yield outcome
            finally:
                send.close()  # in case the producer was cancelled before it started
                receive.close()
                recorder.close()
        _raise_for_state(state, RunReport(failures, recorder.finish()), self._errors)

    async def _submit_unit(self, unit: Any) -> Any:
        self._check_unit_now(unit, 0)
        state = RunState(stop_on_failure=True, recorder=None)
        result: list[Outcome[Any]] = []

        async def deliver(outcome: Outcome[Any]) -> None:
            result.append(outcome)

        with self._bound() as binding:
            waited = perf_counter()
            await binding.gate.acquire()
            slot = Slot(binding.gate)
            wait_s = perf_counter() - waited

            # A child task, so that its shielded clean-up cannot be interrupted by a native
            # Task.cancel() aimed at the caller.
            async def run_unit() -> None:
                async with UnitTasks(self, state, deliver) as units:
                    units.start(unit, 0, slot, wait_s)

            try:
                await self._beside_helpers(state, run_unit, ticker=False)
            finally:
                slot.release()  # if the unit task never started
        if state.misuse is not None:
            raise state.misuse
        return result[0].unwrap()

    def _checked_units(self, units: object) -> Iterable[Any] | AsyncIterable[Any]:
        """``units`` if iterable; a list or tuple is checked whole, before any database work."""
        checked = checked_iterable(units, "units")
        if isinstance(checked, (list, tuple)):
            for index, unit in enumerate(checked):
                self._check_unit_now(unit, index)
        return checked

    def _check_unit_now(self, unit: object, index: int) -> None:
        try:
            self._check_unit(unit, index)
        except UnitMisuse as misuse:
            raise misuse.error from None


def _raise_for_state(state: RunState, report: RunReport[Any], errors: ErrorsMode) -> None:
    if state.misuse is not None:
        raise state.misuse
    if state.input_error is not None:
        raise state.input_error
    failures = [o.error for o in report.outcomes if o.error is not None]
    if errors == "raise" and failures:
        first = next(o for o in report.outcomes if o.error is not None)
        message = (
            f"{len(failures)} of {report.stats.submitted} units failed "
            f"(first: unit {first.index}: {type(first.error).__qualname__}); "
            "the rest committed or were never started"
        )
        raise RunFailed(message, failures, report=report)
