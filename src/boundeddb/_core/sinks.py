"""
The sinks a run's outcomes go to, one for each way a call hands them back.

They go to a list by index, to one value, to a callback, or in a stream to the consumer.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Awaitable, Callable
from typing import Any, Protocol

import anyio
from anyio.streams.memory import MemoryObjectReceiveStream

from .._outcome import Outcome

__all__ = ["CallbackSink", "ListSink", "Sink", "StreamSink", "ValueSink", "next_outcome"]


class Sink(Protocol):
    """Where a run's outcomes go."""

    #: Whether :meth:`put` may be called from a worker thread.
    thread_safe: bool

    def put(self, outcome: Outcome[Any]) -> None: ...


class ListSink:
    """``run()``: every outcome, stored by index, from any thread."""

    thread_safe = True

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.outcomes: list[Outcome[Any]] = []

    def put(self, outcome: Outcome[Any]) -> None:
        index = outcome.index
        with self._lock:
            outcomes = self.outcomes
            if index >= len(outcomes):
                outcomes.extend([outcome] * (index + 1 - len(outcomes)))
            outcomes[index] = outcome

    def put_many(self, outcomes: list[Outcome[Any]]) -> None:
        """:meth:`put` for each of ``outcomes``, under the lock once."""
        with self._lock:
            stored = self.outcomes
            for outcome in outcomes:
                index = outcome.index
                if index >= len(stored):
                    stored.extend([outcome] * (index + 1 - len(stored)))
                stored[index] = outcome


class ValueSink:
    """``submit()``: the one outcome."""

    thread_safe = True

    def __init__(self) -> None:
        self.outcome: Outcome[Any] | None = None

    def put(self, outcome: Outcome[Any]) -> None:
        self.outcome = outcome


class CallbackSink:
    """
    A ProcessRunner worker's call: each outcome to a callback on the loop as it settles, none kept.

    Unlike ``stream()``, no window and no memory stream stand between the run and the consumer.
    The worker's feed of units holds back by itself, because each unit takes a place of the
    worker's gate.
    """

    thread_safe = False

    def __init__(self, put: Callable[[Outcome[Any]], None]) -> None:
        self.put = put


class StreamSink:
    """
    ``stream()``: outcomes to the consumer as they come, on the loop, and failures kept for the end.

    At most ``lookahead`` units are pulled and not yet consumed: the run takes a place of
    :attr:`window` before it pulls a unit, and :meth:`next` gives one back for each outcome.
    """

    thread_safe = False

    def __init__(self, lookahead: int) -> None:
        self._send, self._receive = anyio.create_memory_object_stream[Outcome[Any]](lookahead)
        self.window = anyio.Semaphore(lookahead, fast_acquire=True)  # no loop turn per unit
        self.failures: list[Outcome[Any]] = []

    async def produce(self, drive: Callable[[], Awaitable[None]]) -> None:
        """Run ``drive()``, the run's workers. The stream ends with it."""
        async with self._send:
            await drive()

    async def next(self) -> Outcome[Any] | None:
        """The next outcome, or None once the producer is done. See :func:`next_outcome`."""
        outcome = await next_outcome(self._receive)
        if outcome is not None:
            self.window.release()
        return outcome

    def close(self) -> None:
        """Close both ends: in case the producer was cancelled before it started, or the consumer left."""
        self._send.close()
        self._receive.close()

    def put(self, outcome: Outcome[Any]) -> None:
        if outcome.error is not None:
            self.failures.append(outcome)
        # The window keeps the buffer within its size. The consumer may have stopped listening.
        with contextlib.suppress(anyio.BrokenResourceError, anyio.ClosedResourceError):
            self._send.send_nowait(outcome)


async def next_outcome(receive: MemoryObjectReceiveStream[Outcome[Any]]) -> Outcome[Any] | None:
    """
    ``stream()``'s side of a StreamSink: the next outcome, or None once the producer is done.

    An outcome already waiting comes without a turn of the event loop, which ``receive()`` takes for
    every item: on a busy loop the consumer would otherwise get one outcome per turn while several
    settle, the lookahead window would fill, and workers would wait for it with slots free.
    """
    try:
        return receive.receive_nowait()
    except anyio.WouldBlock:
        pass
    except anyio.EndOfStream:
        return None
    try:
        return await receive.receive()
    except anyio.EndOfStream:
        return None
