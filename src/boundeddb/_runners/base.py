"""The lifecycle every runner shares: argument checks, slots, the per-unit path, batches and streams.

A concrete runner supplies two things:
``_attempt`` (run one unit once, in its own session and transaction) and, for
:class:`~boundeddb.ChunkedRunner`, a different ``_pace`` (how units are started).
Everything else — the slot acquired *before* a unit is pulled, retries that give their slot back,
outcomes, stats, stopping at the first failure, cancellation — lives here, once.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import math
import threading
from collections.abc import (
    AsyncGenerator,
    AsyncIterable,
    AsyncIterator,
    Awaitable,
    Callable,
    Iterable,
    Iterator,
)
from contextlib import contextmanager, suppress
from time import perf_counter
from typing import Any, Generic, Literal, NoReturn, TypeVar

import anyio
import anyio.lowlevel
from sqlalchemy.engine import Engine
from sqlalchemy.ext.asyncio import AsyncEngine
from sqlalchemy.pool import AssertionPool, Pool, QueuePool, StaticPool

from .._errors import RunFailed, RunnerBusyElsewhereError, RunnerClosedError, UnitMisuseError
from .._outcome import Outcome, RunReport
from .._retry import NO_RETRY, RetryPolicy, is_connection_error
from .._stats import LoopLag, StatsRecorder

logger = logging.getLogger("boundeddb")

ErrorsMode = Literal["raise", "collect"]
MakerT = TypeVar("MakerT")

#: Stand-in for "the input is exhausted".
_END: Any = object()


class CommitUnknown(Exception):
    """Carries a unit's error raised while the runner committed, when the commit may have happened."""

    def __init__(self, error: Exception) -> None:
        super().__init__(error)
        self.error = error


def commit_fate_unknown(error: Exception) -> bool:
    """Whether ``error``, raised by COMMIT, leaves open whether the transaction committed."""
    return is_connection_error(error) or isinstance(error, TimeoutError)


class UnitMisuse(Exception):
    """Carries the error about how a unit was written (not a database failure of the unit)."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.error = UnitMisuseError(message)


def check_positive_int(name: str, value: object, *, hint: str) -> int:
    """Return ``value`` if it is an int >= 1, else raise an error that names it and the fix."""
    if isinstance(value, bool) or not isinstance(value, int):
        msg = f"{name} must be an int >= 1, got {value!r} ({type(value).__name__}): {hint}"
        raise TypeError(msg)
    if value < 1:
        msg = f"{name} must be >= 1, got {value!r}: {hint}"
        raise ValueError(msg)
    return value


def check_errors(errors: object) -> ErrorsMode:
    if errors not in ("raise", "collect"):
        msg = (
            f"errors must be 'raise' (stop at the first failed unit and raise RunFailed) "
            f"or 'collect' (run every unit, failures become outcomes), got {errors!r}"
        )
        raise ValueError(msg)
    return errors


def check_timeout(timeout: object) -> float | None:
    if timeout is None:
        return None
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)):
        msg = (
            f"timeout must be a number of seconds (per unit attempt) or None, got {timeout!r} "
            f"({type(timeout).__name__}): pass e.g. timeout=5"
        )
        raise TypeError(msg)
    if not (timeout > 0 and math.isfinite(timeout)):
        msg = f"timeout must be a finite number of seconds > 0 (per unit attempt) or None, got {timeout!r}"
        raise ValueError(msg)
    return float(timeout)


def check_retry(retry: object) -> RetryPolicy:
    if retry is None:
        return NO_RETRY
    if not isinstance(retry, RetryPolicy):
        msg = (
            f"retry must be a boundeddb.RetryPolicy or None, got {retry!r}: "
            "pass e.g. retry=RetryPolicy(attempts=3)"
        )
        raise TypeError(msg)
    return retry


def pool_capacity(pool: Pool) -> int | None:
    """How many connections ``pool`` can hand out at once, or ``None`` if it has no fixed cap."""
    if isinstance(pool, QueuePool):
        overflow: int = pool._max_overflow
        return None if overflow < 0 else pool.size() + overflow
    if isinstance(pool, (StaticPool, AssertionPool)):
        return 1  # one connection, shared: units must not overlap on it
    return None


def resolve_limit(name: str, limit: object, engine: Engine, runner: str) -> int:
    """Check ``limit`` against the engine's pool, or default it to the pool's capacity."""
    pool = engine.pool
    capacity = pool_capacity(pool)
    if limit is None:
        if capacity is None:
            msg = (
                f"{runner} needs an explicit {name}: the engine's pool ({type(pool).__name__}) has no fixed "
                f"capacity to default to. Pass {name}=N, at most what the database accepts "
                f"(for example {name}=10)."
            )
            raise ValueError(msg)
        return capacity
    value = check_positive_int(
        name, limit, hint=f"pass how many units may hold a connection at once, e.g. {name}=10"
    )
    if capacity is not None and value > capacity:
        size = pool.size() if isinstance(pool, QueuePool) else capacity
        overflow = capacity - size
        msg = (
            f"{name}={value} is more than the pool can hand out: its capacity is {capacity} "
            f"(pool_size={size} + max_overflow={overflow}), so units would queue for connections "
            f"and could hit the pool timeout. Pass {name}<={capacity}, or create the engine with "
            f"pool_size + max_overflow >= {value}."
        )
        raise ValueError(msg)
    return value


def bound_engine(sessions: Any) -> Engine:
    """The sync Engine behind a sessionmaker's ``bind`` (an AsyncEngine's ``sync_engine``)."""
    bind = sessions.kw.get("bind")
    if isinstance(bind, AsyncEngine):
        return bind.sync_engine
    if isinstance(bind, Engine):
        return bind
    msg = (
        f"sessions must be bound to one engine, got bind={bind!r}: "
        "create it as sessionmaker(engine) / async_sessionmaker(engine)"
    )
    raise ValueError(msg)


@dataclasses.dataclass
class RunState:
    """What one batch, stream or submit shares between its driver and its unit tasks."""

    stop_on_failure: bool
    recorder: StatsRecorder | None
    stop: bool = False
    misuse: TypeError | None = None
    input_error: BaseException | None = None
    measure_loop_lag: bool = True
    #: For ``run()``: store an outcome, synchronously and from any thread (lets threads deliver).
    collect: Callable[[Outcome[Any]], None] | None = None
    #: In-flight statements a cancellation must stop (ThreadOffloadRunner's DBAPI connections).
    handles: set[Any] = dataclasses.field(default_factory=set)


class Slot:
    """One unit's hold on the gate; releasing twice is harmless, so clean-up can be blunt."""

    __slots__ = ("gate", "held")

    def __init__(self, gate: anyio.Semaphore) -> None:
        self.gate = gate
        self.held = True

    def release(self) -> None:
        if self.held:
            self.held = False
            self.gate.release()

    async def reacquire(self) -> None:
        await self.gate.acquire()
        self.held = True


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

    _kind: str = "unit"

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
        if self._retry.should_retry(error, attempt):
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
        logger.warning(
            "unit %d attempt %d failed with %s; retrying in %.3f s",
            index,
            attempt,
            type(error).__qualname__,
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
            return None, _END, 0.0
        if window is not None:
            await window.acquire()
        waited = perf_counter()
        await gate.acquire()
        wait_s = perf_counter() - waited
        unit = _END
        try:
            if not state.stop:
                unit = await pull()
                if unit is not _END:
                    self._check_unit(unit, index)
        except UnitMisuse as misuse:
            state.misuse, state.stop, unit = misuse.error, True, _END
        except Exception as error:  # the caller's iterable failed: drain, then re-raise it
            state.input_error, state.stop, unit = error, True, _END
        finally:
            if unit is _END:
                gate.release()
                if window is not None:
                    window.release()
        if unit is _END:
            return None, _END, wait_s
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
        on_cancel = self._on_cancel_statements(state)
        async with anyio.create_task_group() as helpers:
            if state.recorder is not None and state.measure_loop_lag:
                lag = state.recorder.loop_lag = LoopLag()
                helpers.start_soon(lag.tick_forever)
            if on_cancel is not None:
                helpers.start_soon(_call_when_cancelled, on_cancel)
            try:
                await self._pace(pull, binding.gate, state, deliver, window)
            finally:
                helpers.cancel_scope.cancel()

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
        units = _checked_iterable(units, "units")
        if isinstance(units, (list, tuple)):  # known up front: refuse before any database work
            for index, unit in enumerate(units):
                self._check_unit_now(unit, index)
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
        units = _checked_iterable(units, "units")
        if isinstance(units, (list, tuple)):
            for index, unit in enumerate(units):
                self._check_unit_now(unit, index)
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
            # The unit runs in a child task, so that its shielded clean-up cannot be interrupted
            # by a native Task.cancel() aimed at the caller.
            on_cancel = self._on_cancel_statements(state)
            async with anyio.create_task_group() as helpers:
                if on_cancel is not None:
                    helpers.start_soon(_call_when_cancelled, on_cancel)
                try:
                    async with UnitTasks(self, state, deliver) as units:
                        units.start(unit, 0, slot, perf_counter() - waited)
                finally:
                    helpers.cancel_scope.cancel()
        if state.misuse is not None:
            raise state.misuse
        return result[0].unwrap()

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


async def _call_when_cancelled(callback: Callable[[], Awaitable[None]]) -> NoReturn:
    """Sleep until cancelled; then run ``callback`` (shielded) and let the cancellation go on."""
    try:
        await anyio.sleep_forever()
    finally:
        with anyio.CancelScope(shield=True):
            await callback()
    raise AssertionError("unreachable")  # pragma: no cover


def _checked_iterable(units: object, name: str) -> Iterable[Any] | AsyncIterable[Any]:
    if isinstance(units, (Iterable, AsyncIterable)) and not isinstance(units, (str, bytes)):
        return units
    msg = (
        f"{name} must be an iterable or async iterable of units, got {type(units).__name__}: "
        "pass e.g. a list or a generator of functions that take the session"
    )
    raise TypeError(msg)


class Puller:
    """Pulls units one at a time (``await pull()``); ``iterator`` is set for plain iterables."""

    def __init__(self, units: Iterable[Any] | AsyncIterable[Any]) -> None:
        self.iterator: Iterator[Any] | None = None
        self._async_iterator: AsyncIterator[Any] | None = None
        if isinstance(units, AsyncIterable):
            self._async_iterator = aiter(units)
        else:
            self.iterator = iter(units)

    async def __call__(self) -> Any:
        if self.iterator is not None:
            return next(self.iterator, _END)
        assert self._async_iterator is not None
        return await anext(self._async_iterator, _END)


class UnitTasks:
    """A task group for unit tasks that gives back the slots of tasks cancelled before they ran."""

    def __init__(
        self,
        runner: BaseRunner[Any],
        state: RunState,
        deliver: Callable[[Outcome[Any]], Awaitable[None]],
    ) -> None:
        self._runner = runner
        self._state = state
        self._deliver = deliver
        self._group = anyio.create_task_group()
        self._slots: set[Slot] = set()

    async def __aenter__(self) -> UnitTasks:
        await self._group.__aenter__()
        return self

    def start(self, unit: Any, index: int, slot: Slot, wait_s: float, *, attempt: int = 1) -> None:
        """Run ``unit`` holding ``slot``; ``attempt`` > 1 continues a unit already counted."""
        if self._state.recorder is not None and attempt == 1:
            self._state.recorder.unit_started()
        self._slots.add(slot)
        self._group.start_soon(self._run, unit, index, slot, wait_s, attempt)

    async def _run(self, unit: Any, index: int, slot: Slot, wait_s: float, attempt: int) -> None:
        try:
            await self._runner._unit_task(unit, index, slot, wait_s, self._state, self._deliver, attempt)
        finally:
            self._slots.discard(slot)

    async def __aexit__(self, *exc_info: Any) -> bool | None:
        try:
            return await self._group.__aexit__(*exc_info)
        finally:
            # A task cancelled before its first step never ran its ``finally``: reclaim its slot.
            for slot in self._slots:
                slot.release()
            self._slots.clear()


def _on_asyncio() -> bool:
    """Whether the running event loop is asyncio's (trio runs no asyncio loop)."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return False
    return True


class _background:
    """
    Run ``produce(binding)`` beside the consumer of a stream, and stop it when the consumer stops.

    On asyncio the producer is a separate task, so that the consumer's async generator never yields
    inside a task group: breaking out of ``async for`` early is safe there. On trio it is a task group
    around the generator's body; close the generator promptly (``contextlib.aclosing``) if you may
    break out early.
    """

    def __init__(self, produce: Callable[[_Binding], Awaitable[None]], binding: _Binding) -> None:
        self._produce = produce
        self._binding = binding
        self._task: asyncio.Task[None] | None = None
        self._group: Any = None

    async def __aenter__(self) -> None:
        if _on_asyncio():
            self._task = asyncio.ensure_future(self._produce(self._binding))
        else:
            self._group = anyio.create_task_group()
            await self._group.__aenter__()
            self._group.start_soon(self._produce, self._binding)

    async def __aexit__(self, *exc_info: Any) -> None:
        if self._task is not None:
            task = self._task
            if not task.done():
                task.cancel()
            with anyio.CancelScope(shield=True):
                await asyncio.wait({task})
            if not task.cancelled() and task.exception() is not None:
                raise task.exception()  # type: ignore[misc]
        elif exc_info[0] is None:
            await self._group.__aexit__(None, None, None)
        else:
            # The consumer left (GeneratorExit) or failed: stop the producer, then let the
            # consumer's exception go on as it was, not wrapped in the task group's own.
            self._group.cancel_scope.cancel()
            await self._group.__aexit__(None, None, None)


def ended_transaction_message(index: int) -> str:
    return (
        f"unit {index} ended the runner's transaction itself (it called session.commit(), "
        "rollback() or close()): whatever it committed stays committed and the rest was rolled "
        "back. The runner owns the transaction and commits when the unit returns: remove the call "
        "(use session.flush() to send changes early)"
    )


def units_of(fn: object, items: object, runner: str) -> Iterable[Any] | AsyncIterable[Any]:
    """Turn ``map(fn, items)`` into lazy units ``fn(session, item)``."""
    if not callable(fn):
        msg = f"fn must be callable as fn(session, item), got {fn!r}: pass the function to {runner}.map()"
        raise TypeError(msg)
    if isinstance(items, AsyncIterable):

        async def bind_async() -> AsyncIterator[Callable[[Any], Any]]:
            async for item in items:
                yield BoundItem(fn, item)

        return bind_async()
    if isinstance(items, Iterable) and not isinstance(items, (str, bytes)):
        return (BoundItem(fn, item) for item in items)
    msg = (
        f"items must be an iterable or async iterable, got {type(items).__name__}: "
        f"pass e.g. a list or a generator of the items to give fn, as {runner}.map(fn, items)"
    )
    raise TypeError(msg)


class BoundItem:
    """``fn(session, item)`` as a unit; keeps ``fn``'s kind visible to unit checks."""

    __slots__ = ("fn", "item")

    def __init__(self, fn: Callable[..., Any], item: Any) -> None:
        self.fn = fn
        self.item = item

    def __call__(self, session: Any) -> Any:
        return self.fn(session, self.item)
