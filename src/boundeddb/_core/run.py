"""
One call's run of units, whichever verb made it, and where its outcomes go.

A :class:`Run` owns what a call's workers share. It pulls the input one unit at a time, with one
index each, and checks each unit. What it does with their outcomes, it inherits from
:class:`~boundeddb._core.settling.Settling`.
"""

from __future__ import annotations

import enum
import math
import threading
from collections.abc import AsyncIterable, AsyncIterator, Callable, Coroutine, Iterable, Iterator, Sized
from typing import Any, Final

import anyio

from .._errors import UnitMisuseError
from .._outcome import Outcome
from .._telemetry import CallTelemetry
from .ahead import END_OF_INPUT, ReadAhead
from .recorder import NullRecorder
from .settling import Settling, SinkT, failures_error
from .withdrawals import NO_WITHDRAWALS, Withdrawals

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


#: Checks a unit before it runs: ``None`` if it is fine, else what is wrong and how to fix it.
UnitCheck = Callable[[object, int], "str | None"]


class Run(Settling[SinkT]):
    """What one call shares between its workers. See the module docstring."""

    #: Whether the input is only async for a journal's key lookups: see ``journalled.py``.
    prompt = False

    def __init__(
        self,
        units: Iterable[Any] | AsyncIterable[Any],
        sink: SinkT,
        *,
        check: UnitCheck | None,
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
        super().__init__(
            sink, stop_on_failure=stop_on_failure, recorder=recorder, observe=observe, on_outcome=on_outcome,
            telemetry=telemetry,
        )  # fmt: skip
        if telemetry is not None:
            self._wrap = telemetry.wrap
            if not batched:  # a batch wraps its units itself, in its own span
                self._admit = self._admit_wrapped  # type: ignore[method-assign]
        self.priority = priority
        #: For streams: units pulled but not yet consumed are at most its value, so memory is O(limit).
        self.window = window
        #: None where the caller checked every unit already (a list, a tuple, a submit()'s unit).
        self._check = check
        #: A batch of ``submit()`` calls': the units whose callers gave up, set by ``gather.py``.
        self.withdrawals: Withdrawals = NO_WITHDRAWALS
        self._next_index = 0
        self._iterator: Iterator[Any] | None = None
        self._async_iterator: AsyncIterator[Any] | None = None
        self._pull_lock = threading.Lock()
        self._async_pull_lock: anyio.Lock | None = None
        #: With batches of an async input: the units a task of its own pulled ahead.
        self._ahead: ReadAhead | None = None
        #: A list or tuple input: its iterator yields exactly its length, so the run knows when it is
        #: drained. Not for a stream, whose workers give back a window as they find the input ended.
        self._listed: list[Any] | tuple[Any, ...] | None = (
            units if units.__class__ in (list, tuple) and window is None else None
        )
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
    def drained(self) -> bool:
        """
        Whether every unit of a list or tuple input was pulled: a worker that settled the last
        one ends, rather than take a slot again only to find the input ended.
        """
        listed = self._listed
        return listed is not None and self._next_index >= len(listed)

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

        The units are counted as started in one step, and checked after the pull lock is let go.
        """
        if getattr(self._admit, "__func__", None) is not Run._admit:  # a journal's, or wrapped in telemetry
            return self._pull_many_admitting(size)
        pulled: list[tuple[Any, int]] = []
        iterator, ended = self._iterator, False
        with self._pull_lock:
            index = self._next_index
            try:
                while len(pulled) < size:
                    if self.stopping:
                        ended = True
                        break
                    unit = next(iterator, END_OF_INPUT)  # type: ignore[arg-type]
                    if unit is END_OF_INPUT:
                        ended = True
                        break
                    pulled.append((unit, index))
                    index += 1
            except Exception as error:  # as in pull_sync
                self.input_error, self.stopping, ended = error, True, True
            self._next_index = index
        ended = ended or self.drained
        self.recorder.units_started(len(pulled))
        check = self._check
        if check is None:
            return pulled, ended
        admitted: list[tuple[Any, int]] = []
        for unit, i in pulled:
            message = check(unit, i)
            if message is None:
                admitted.append((unit, i))
            else:
                self._refuse(i, message)
        return admitted, ended

    def _refuse(self, index: int, message: str) -> None:
        """Settle unit ``index``, counted as started, as failing its check with ``message``."""
        self.finish(Outcome(index, None, UnitMisuseError(message), 0.0, 0.0, attempts=0))

    def _pull_many_admitting(self, size: int) -> tuple[list[tuple[Any, int]], bool]:
        """:meth:`pull_many_sync`, each unit through :meth:`_admit` under the pull lock."""
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
        check = self._check
        if check is None or (message := check(unit, index)) is None:
            return unit, index
        self._refuse(index, message)
        return REFUSED

    def _admit_wrapped(self, unit: Any, index: int) -> tuple[Any, int] | Pulled:
        """As :meth:`_admit`, the unit wrapped in its telemetry span once it passed its check."""
        admitted = Run._admit(self, unit, index)
        if admitted.__class__ is tuple:
            return self._wrap(unit, index), index
        return admitted
