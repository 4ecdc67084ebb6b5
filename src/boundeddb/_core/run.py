"""
One call's run of units, whichever verb made it, and where its outcomes go.

A :class:`Run` owns what a call's workers share. It pulls the input one unit at a time, with one
index each, and checks each unit. It sends the outcomes to a :class:`Sink`, knows when to stop
starting units, and knows what to raise at the end.
"""

from __future__ import annotations

import enum
import math
import threading
from collections.abc import AsyncIterable, AsyncIterator, Callable, Coroutine, Iterable, Iterator, Sized
from typing import Any, Final, Generic, TypeVar

import anyio

from .._errors import RunFailed, UnitMisuseError
from .._outcome import Outcome, RunReport
from .._stats import RunStats
from .._telemetry import CallTelemetry
from .ahead import END_OF_INPUT, ReadAhead
from .feedback import OutcomeHook
from .recorder import NullRecorder
from .sinks import Sink

__all__ = [
    "END",
    "REFUSED",
    "Pulled",
    "Run",
    "SinkT",
    "failures_error",
]


class Pulled(enum.Enum):
    """What :meth:`Run.pull` returns when it has no unit to hand out."""

    #: The input ran out, or the run stopped starting units.
    END = "end"
    #: The unit failed its check and was settled on the spot: pull again.
    REFUSED = "refused"


# The per-unit path compares with these by identity, as module globals.
END: Final = Pulled.END
REFUSED: Final = Pulled.REFUSED


#: No unit withdrawn: shared by every run that is not a batch of ``submit()`` calls, never written.
_NONE_WITHDRAWN: Final[set[int]] = set()

#: Checks a unit before it runs: ``None`` if it is fine, else what is wrong and how to fix it.
UnitCheck = Callable[[object, int], "str | None"]


SinkT = TypeVar("SinkT", bound=Sink)


class Run(Generic[SinkT]):
    """What one call shares between its workers. See the module docstring."""

    #: Whether the input is only async for a journal's key lookups: see ``journalled.py``.
    prompt = False

    def __init__(
        self,
        units: Iterable[Any] | AsyncIterable[Any],
        sink: SinkT,
        *,
        check: UnitCheck,
        stop_on_failure: bool,
        recorder: NullRecorder,
        priority: int = 0,
        window: anyio.Semaphore | None = None,
        observe: Callable[[float], None] | None = None,
        on_outcome: Callable[[Outcome[Any]], object] | None = None,
        size: float | None = None,
        telemetry: CallTelemetry | None = None,
        batched: bool = False,
    ) -> None:
        self.sink = sink
        self._put: Callable[[Outcome[Any]], None] = sink.put
        #: The caller's ``on_outcome``, served on the loop. None if not asked, and then nothing per unit.
        self.hook: OutcomeHook | None = None
        if on_outcome is not None:
            self.hook = hook = OutcomeHook(on_outcome, self.stop)
            self._put = _also(self._put, hook.put)
        #: ``boundeddb.instrument()``'s view of this call, or None when not instrumented.
        self.telemetry = telemetry
        if telemetry is not None:  # boundeddb.instrument(): else nothing more per unit
            self._put = _also(self._put, telemetry.settled)
            self._wrap = telemetry.wrap
            if not batched:  # a batch wraps its units itself, in its own span
                self._admit = self._admit_wrapped  # type: ignore[method-assign]
        self.recorder = recorder
        #: With an auto limit: told the latency of each unit that succeeded, from any thread.
        self._observe = observe
        self.priority = priority
        #: For streams: units pulled but not yet consumed are at most its value, so memory is O(limit).
        self.window = window
        self._check = check
        self._stop_on_failure = stop_on_failure
        #: Start no more units: a failure with errors="raise", misuse, a failed input, or cancellation.
        self.stopping = False
        #: With ``batch=``: indexes of units whose ``submit()`` was cancelled, set by ``gather.py``.
        self.withdrawn: set[int] = _NONE_WITHDRAWN
        self.misuse: UnitMisuseError | None = None
        self.input_error: BaseException | None = None
        self._next_index = 0
        self._iterator: Iterator[Any] | None = None
        self._async_iterator: AsyncIterator[Any] | None = None
        self._pull_lock = threading.Lock()
        self._async_pull_lock: anyio.Lock | None = None
        #: With batches of an async input: the units a task of its own pulled ahead.
        self._ahead: ReadAhead | None = None
        if isinstance(units, AsyncIterable):
            self._async_iterator = aiter(units)
        else:
            self._iterator = iter(units)
        #: How many units the input holds if it has a ``len()``, else inf. ``map()`` passes its items'.
        self.size = size if size is not None else len(units) if isinstance(units, Sized) else math.inf

    @property
    def pulls_sync(self) -> bool:
        """Whether the input is a plain iterable, pulled without a trip through the event loop."""
        return self._iterator is not None

    @property
    def pulls_in_threads(self) -> bool:
        """Whether a worker thread may pull and settle units itself, as a lane."""
        return self._iterator is not None and self.window is None and self.sink.thread_safe

    # -- pulling ------------------------------------------------------------------------------------

    def pull_sync(self) -> tuple[Any, int] | Pulled:
        """The next ``(unit, index)`` of a plain iterable, or :class:`Pulled`. Any thread may call it."""
        with self._pull_lock:
            if self.stopping:
                return END
            try:
                unit = next(self._iterator, END_OF_INPUT)  # type: ignore[arg-type]
            except Exception as error:  # the caller's iterable failed: drain, then re-raise it
                self.input_error, self.stopping = error, True
                return END
            if unit is END_OF_INPUT:
                return END
            index = self._next_index
            self._next_index = index + 1
        return self._admit(unit, index)

    def pull_many_sync(self, size: int) -> tuple[list[tuple[Any, int]], bool]:
        """
        Up to ``size`` units of a plain iterable, pulled as :meth:`pull_sync` would one by one,
        and whether it returned ``END``. Any thread may call it: a batch's lane does.
        """
        pulled: list[tuple[Any, int]] = []
        iterator, admit = self._iterator, self._admit
        with self._pull_lock:
            while len(pulled) < size:
                if self.stopping:
                    return pulled, True
                try:
                    unit = next(iterator, END_OF_INPUT)  # type: ignore[arg-type]
                except Exception as error:  # as in pull_sync
                    self.input_error, self.stopping = error, True
                    return pulled, True
                if unit is END_OF_INPUT:
                    return pulled, True
                index = self._next_index
                self._next_index = index + 1
                admitted = admit(unit, index)
                if admitted is not REFUSED:
                    pulled.append(admitted)  # type: ignore[arg-type]
        return pulled, False

    async def pull(self) -> tuple[Any, int] | Pulled:
        """As :meth:`pull_sync`, for any input, on the loop."""
        if self._iterator is not None:
            return self.pull_sync()
        if self._async_pull_lock is None:
            self._async_pull_lock = anyio.Lock()
        async with self._async_pull_lock:
            if self.stopping:
                return END
            unit = await self.take()
            if unit is END_OF_INPUT:
                return END
            index = self._next_index
            self._next_index = index + 1
        return self._admit(unit, index)

    async def take(self) -> Any:
        """
        The next item of an async input, or ``END_OF_INPUT``, under the pull lock. If the input
        raises, the run stops and keeps its error to raise.
        """
        try:
            if self._ahead is not None:
                return await self._ahead.take()
            return await anext(self._async_iterator, END_OF_INPUT)  # type: ignore[arg-type]
        except Exception as error:
            self.input_error, self.stopping = error, True
            return END_OF_INPUT

    async def pull_before(self, deadline: float) -> tuple[Any, int] | Pulled | None:
        """
        As :meth:`pull`, or ``None`` if no unit came by ``deadline`` on ``anyio.current_time()``.

        For an async input, only once :meth:`read_ahead`'s task runs: an ``anext()`` is never
        interrupted, only the wait for what that task pulled.
        """
        if self.prompt:  # within the batch's slot, as a unit's pull is: never cut short mid-lookup
            return await self.pull()
        ahead = self._ahead
        if ahead is not None and ahead.ready:
            # Pulled ahead already: take it now, even at a deadline that has passed, as with linger=0. The
            # lock serializes only waits: taking a unit and numbering it never yield.
            if self.stopping:
                return END
            index = self._next_index
            self._next_index = index + 1
            return self._admit(ahead.take_nowait(), index)
        pulled: tuple[Any, int] | Pulled | None = None
        with anyio.CancelScope(deadline=deadline):
            pulled = await self.pull()
        return pulled

    def read_ahead(self, capacity: int) -> Callable[[], Coroutine[Any, Any, None]] | None:
        """
        Have an async input pulled ahead, at most ``capacity`` units, by a task running the returned
        function, so that :meth:`pull_before` can give up waiting. ``None`` for a plain iterable.
        """
        if self._async_iterator is None or self.prompt:
            return None
        self._ahead = ReadAhead(self._async_iterator, capacity)
        return self._ahead.fill

    def _admit(self, unit: Any, index: int) -> tuple[Any, int] | Pulled:
        """Count the unit as started, or settle it on the spot if it fails its check."""
        self.recorder.unit_started()
        message = self._check(unit, index)
        if message is None:
            return unit, index
        self.finish(Outcome(index, None, UnitMisuseError(message), 0.0, 0.0, attempts=0))
        return REFUSED

    def _admit_wrapped(self, unit: Any, index: int) -> tuple[Any, int] | Pulled:
        """As :meth:`_admit`, the unit wrapped in its telemetry span once it passed its check."""
        admitted = Run._admit(self, unit, index)
        if admitted.__class__ is tuple:
            return self._wrap(unit, index), index
        return admitted

    def stop(self) -> None:
        """Start no more units. Any thread may call it."""
        self.stopping = True

    # -- outcomes ----------------------------------------------------------------------------------

    def finish(self, outcome: Outcome[Any]) -> None:
        """Record and deliver a unit's outcome, and stop starting units if the run must. From any thread."""
        self.recorder.unit_finished(outcome)
        error = outcome.error
        if error is None:
            if self._observe is not None:
                self._observe(outcome.latency_s)
        elif self._stop_on_failure:
            if isinstance(error, UnitMisuseError) and self.misuse is None:
                self.misuse = error
            self.stopping = True
        self._put(outcome)

    def serve_hook(self) -> None:
        """On the loop, once the units are done: hand the hook what is left, and raise what it raised."""
        if self.hook is not None:
            self.hook.drain()
            if self.hook.error is not None:
                raise self.hook.error

    def raise_for(self, report: RunReport[Any]) -> None:
        """
        Raise what the run owes its caller: misuse, the input's own error, ``on_outcome``'s own
        error, or :class:`RunFailed`.
        """
        if self.misuse is not None:
            raise self.misuse
        if self.input_error is not None:
            raise self.input_error
        if self.hook is not None and self.hook.error is not None:
            raise self.hook.error
        if self._stop_on_failure and (failed := failures_error(report)) is not None:
            raise failed

    def report(self, outcomes: list[Outcome[Any]], stats: RunStats) -> RunReport[Any]:
        report = RunReport(outcomes, stats)
        self.raise_for(report)
        return report


def _also(
    put: Callable[[Outcome[Any]], None], then: Callable[[Outcome[Any]], object]
) -> Callable[[Outcome[Any]], None]:
    """``put``, then ``then``: one more thing done with each outcome."""

    def put_and_then(outcome: Outcome[Any]) -> None:
        put(outcome)
        then(outcome)

    return put_and_then


def failures_error(report: RunReport[Any]) -> RunFailed | None:
    """The :class:`RunFailed` that ``errors="raise"`` owes for ``report``'s failed units, if any failed."""
    failures = [o.error for o in report.outcomes if o.error is not None]
    if not failures:
        return None
    first = next(o for o in report.outcomes if o.error is not None)
    message = (
        f"{len(failures)} of {report.stats.submitted} units failed "
        f"(first: unit {first.index}: {type(first.error).__qualname__}); "
        "the rest committed or were never started"
    )
    return RunFailed(message, failures, report=report)
