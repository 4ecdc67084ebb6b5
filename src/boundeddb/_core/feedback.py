"""
What a caller sees of a run while it lasts, served on the event loop: ``on_outcome`` and ``progress``.

:class:`OutcomeHook` calls the caller's function on the loop, in the order outcomes settled: at once
for an outcome settled on the loop, else through a queue that :class:`Feedback` drains every
:data:`DRAIN_INTERVAL_S`. A function that raises stops the run, which then raises its exception.
:class:`Feedback` also updates a :class:`Display` every :data:`DISPLAY_INTERVAL_S` from counters the
run keeps anyway. Nothing here runs, and nothing is added per unit, unless the caller asked for it.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
from collections import deque
from collections.abc import Callable
from typing import Any, Protocol

import anyio

from .._outcome import Outcome
from .limiter import Limiter
from .recorder import NullRecorder, Recorder

__all__ = [
    "DISPLAY_INTERVAL_S",
    "DRAIN_INTERVAL_S",
    "Display",
    "Feedback",
    "Figures",
    "OutcomeHook",
    "tell_cancelled",
]

logger = logging.getLogger("boundeddb.hooks")

#: How often outcomes settled in worker threads are handed to the hook, in seconds.
DRAIN_INTERVAL_S = 0.01
#: How often the display is updated, in seconds. rich's own default is 10 times a second.
DISPLAY_INTERVAL_S = 0.1


class OutcomeHook:
    """Calls ``fn(outcome)`` on the event loop, in completion order. See the module docstring."""

    __slots__ = ("_fn", "_loop_thread", "_queue", "_stop", "error")

    def __init__(self, fn: Callable[[Outcome[Any]], object], stop: Callable[[], None]) -> None:
        self._fn = fn
        self._stop = stop
        self._queue: deque[Outcome[Any]] = deque()
        #: Made on the loop's thread: outcomes settled on it are handed over at once.
        self._loop_thread = threading.get_ident()
        #: What ``fn`` raised, if it did: the run stops and raises it.
        self.error: Exception | None = None

    def put(self, outcome: Outcome[Any]) -> None:
        """An outcome settled. Any thread may call it."""
        if self._queue or threading.get_ident() != self._loop_thread:
            self._queue.append(outcome)  # deque.append is atomic: safe from worker threads
        else:
            self._call(outcome)

    def drain(self) -> None:
        """Hand every queued outcome to ``fn``, oldest first, on the loop."""
        queue = self._queue
        while queue:
            self._call(queue.popleft())

    def _call(self, outcome: Outcome[Any]) -> None:
        if self.error is not None:
            return
        try:
            self._fn(outcome)
        except Exception as error:
            name = type(error).__qualname__
            logger.debug("on_outcome raised %s at unit %d: stopping the run", name, outcome.index)
            self.error = error
            self._stop()


def tell_cancelled(fn: Callable[[Outcome[Any]], object], outcome: Outcome[Any]) -> None:
    """
    A cancelled ``submit()``'s own ``on_outcome``, told what became of its unit, which had settled.

    The cancellation goes on whatever ``fn`` does: what it raises is logged, not raised.
    """
    try:
        fn(outcome)
    except Exception:
        logger.warning(
            "on_outcome of a cancelled submit() raised: ignored, the cancellation goes on", exc_info=True
        )


@dataclasses.dataclass(frozen=True, slots=True)
class Figures:
    """What a display shows: the run so far."""

    #: Units settled: succeeded, failed, or skipped by a journal.
    done: int
    #: How many units the input holds if it has a ``len()``, else None.
    total: int | None
    failed: int
    #: Attempts that failed and were tried again, among settled units.
    retried: int
    #: The run's units holding a slot now, and the runner's limit now.
    in_flight: int
    limit: int


class Display(Protocol):
    """Shows a run's :class:`Figures`, on the event loop."""

    def show(self, figures: Figures, *, final: bool) -> None: ...

    def close(self) -> None:
        """The run is over, also when it failed or was cancelled."""
        ...


class Feedback:
    """Serves a run's hook and display beside its workers: ``tick_forever`` while it runs, then ``close``."""

    def __init__(
        self,
        hook: OutcomeHook | None,
        display: Display | None,
        recorder: NullRecorder,
        limiter: Limiter,
        total: float,
    ) -> None:
        self._hook = hook
        self._display = display
        self._recorder = recorder if isinstance(recorder, Recorder) else None
        self._limiter = limiter
        self._total = int(total) if total != float("inf") else None

    def figures(self) -> Figures:
        recorder, limiter = self._recorder, self._limiter
        if recorder is None:  # pragma: no cover - a run with feedback always records
            return Figures(0, self._total, 0, 0, limiter.in_flight, limiter.limit)
        return Figures(
            recorder.succeeded + recorder.failed + recorder.skipped,
            self._total,
            recorder.failed,
            recorder.retried,
            max(0, recorder.in_flight),
            limiter.limit,
        )

    async def tick_forever(self) -> None:
        """Drain the hook's queue and update the display, from the loop, until cancelled."""
        hook, display = self._hook, self._display
        interval = DRAIN_INTERVAL_S if hook is not None else DISPLAY_INTERVAL_S
        every = max(1, round(DISPLAY_INTERVAL_S / interval))
        ticks = 0
        while True:
            await anyio.sleep(interval)
            if hook is not None:
                hook.drain()
            ticks += 1
            if display is not None and ticks % every == 0:
                display.show(self.figures(), final=False)

    def close(self) -> None:
        """The run is over or cancelled: hand the hook what is left, show the last figures."""
        try:
            if self._hook is not None:
                self._hook.drain()
        finally:
            if self._display is not None:
                try:
                    self._display.show(self.figures(), final=True)
                finally:
                    self._display.close()
