"""The moving parts of a run: its state, slots, unit task groups, pulling, and the stream producer."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import AsyncIterable, AsyncIterator, Awaitable, Callable, Iterable, Iterator
from typing import TYPE_CHECKING, Any, NoReturn

import anyio
from sqlalchemy import exc as sa_exc

from .._errors import UnitMisuseError
from .._outcome import Outcome
from .._retry import is_connection_error
from .._stats import StatsRecorder

if TYPE_CHECKING:
    from .base import BaseRunner, _Binding

logger = logging.getLogger("boundeddb")

#: Stand-in for "the input is exhausted".
END: Any = object()


class CommitUnknown(Exception):
    """Carries a unit's error raised while the runner committed, when the commit may have happened."""

    def __init__(self, error: Exception) -> None:
        super().__init__(error)
        self.error = error


def commit_fate_unknown(error: Exception) -> bool:
    """Whether ``error``, raised by COMMIT, leaves open whether the transaction committed."""
    return is_connection_error(error) or isinstance(error, TimeoutError)


def note_lost_connection(error: BaseException, connection: Any) -> None:
    """
    Mark a driver error as a lost connection if the unit's own connection says it is closed.

    SQLAlchemy recognises disconnects by their messages, and misses some (psycopg's
    "sending query failed: ... another command is already in progress" after the backend was
    terminated). The DBAPI connection's own state is the better witness: if it is closed, set
    SQLAlchemy's ``connection_invalidated`` flag, so the error is retried as transient (or, during
    COMMIT, reported as ``commit_unknown``) and the connection is discarded, not reused.
    """
    if not isinstance(error, sa_exc.DBAPIError) or error.connection_invalidated or connection is None:
        return
    sync_connection = getattr(connection, "sync_connection", connection)  # AsyncConnection
    try:
        dbapi = sync_connection.connection.dbapi_connection
    except Exception:  # already invalidated or closed by SQLAlchemy
        return
    raw = getattr(dbapi, "driver_connection", dbapi)  # asyncpg's adapter wraps the driver's
    is_closed = getattr(raw, "is_closed", None)
    closed = is_closed() if callable(is_closed) else getattr(raw, "closed", False)
    if closed:
        error.connection_invalidated = True


class ConnectFailed(Exception):
    """Carries the error of opening a unit's connection: the unit never ran, nothing was sent."""

    def __init__(self, error: Exception) -> None:
        super().__init__(error)
        self.error = error


class UnitMisuse(Exception):
    """Carries the error about how a unit was written (not a database failure of the unit)."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.error = UnitMisuseError(message)


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


async def call_when_cancelled(callback: Callable[[], Awaitable[None]]) -> NoReturn:
    """Sleep until cancelled; then run ``callback`` (shielded) and let the cancellation go on."""
    try:
        await anyio.sleep_forever()
    finally:
        with anyio.CancelScope(shield=True):
            await callback()
    raise AssertionError("unreachable")  # pragma: no cover


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
            return next(self.iterator, END)
        assert self._async_iterator is not None
        return await anext(self._async_iterator, END)


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
