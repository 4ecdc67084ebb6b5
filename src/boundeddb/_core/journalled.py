"""
A run of a journal's units: the input also holds items whose outcome is known without running them.

``_runners/journal_units.py`` makes such an input, and ``docs/explanation/architecture.md`` tells
how the journal works.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import AsyncIterable, AsyncIterator, Iterable, Iterator
from typing import Any, Final, TypeAlias

import anyio
import anyio.lowlevel
import anyio.to_thread

from .._outcome import Outcome
from .ahead import END_OF_INPUT
from .run import END, REFUSED, Pulled, Run, SinkT

__all__ = ["SKIPPED", "Foregone", "JournalChunks", "JournalledRun", "Units", "foregone_outcome"]


class Foregone:
    """
    An item of a journalled input whose outcome is known without running it: done already, or failed.

    :class:`JournalledRun` numbers it as it would a unit, and gives it its outcome on the spot.
    """

    __slots__ = ("error",)

    def __init__(self, error: Exception | None) -> None:
        #: Why the item failed before a unit was made for it, or None if it is done already.
        self.error = error


#: An item whose journal row says it is done: its outcome is :attr:`Outcome.skipped`.
SKIPPED: Final = Foregone(None)

#: Foregone items settled between two turns of the event loop while the next chunk is looked up.
_SETTLED_PER_TURN: Final = 1024


def foregone_outcome(foregone: Foregone, index: int) -> Outcome[Any]:
    """The outcome of a :class:`Foregone` item numbered ``index``."""
    if foregone.error is None:
        return Outcome(index, None, None, 0.0, 0.0, attempts=0, skipped=True)
    return Outcome(index, None, foregone.error, 0.0, 0.0, attempts=0)


class JournalChunks:
    """
    A journalled input over a plain iterable: lists of units and :class:`Foregone` items, one list
    per key lookup, in input order.

    ``in_threads``: the list comes from a plain iterator that looks keys up in the thread that asks,
    for workers that pull in their own threads; else from an async one. ``chunks`` may be set after
    the object is made, for an iterator that asks :meth:`stopped`.
    """

    __slots__ = ("chunks", "in_threads", "run")

    def __init__(
        self, chunks: Iterator[list[Any]] | AsyncIterator[list[Any]] | None, *, in_threads: bool
    ) -> None:
        self.chunks = chunks
        self.in_threads = in_threads
        #: The run that pulls the chunks, once it is made.
        self.run: Run[Any] | None = None

    def stopped(self) -> bool:
        """Whether the run that pulls the chunks stopped starting units: a lookup then backs off no more."""
        run = self.run
        return run is not None and run.stopping


#: What a run pulls: units, from a plain or an async iterable, or a journal's chunks of them.
Units: TypeAlias = "Iterable[Any] | AsyncIterable[Any] | JournalChunks"


class JournalledRun(Run[SinkT]):
    """
    A :class:`Run` whose input may hold :class:`Foregone` items: each settles where it is pulled.

    Over :class:`JournalChunks`, a chunk of only foregone items (as in a resume) is settled while the next
    chunk's keys are looked up, so that the two overlap.
    """

    def __init__(self, units: Units, sink: SinkT, **options: Any) -> None:
        self._chunks: JournalChunks | None = units if isinstance(units, JournalChunks) else None
        #: The chunk taken and not yet pulled.
        self._buffer: deque[Any] = deque()
        #: The chunk looked up next, maybe while the one before was settled: None if none, or at the end.
        self._fetched: list[Any] | None = None
        #: What the input or the lookup of the next chunk raised: the run stops when it is taken.
        self._fetch_error: Exception | None = None
        if isinstance(units, JournalChunks):
            units.run = self
            units = self._units_in_thread() if units.in_threads else self._units()
        super().__init__(units, sink, **options)
        self._admit_unit = self._admit  # the run's own, wrapped in telemetry or not
        self._admit = self._admit_journalled  # type: ignore[method-assign]
        #: Over a plain iterable: only the key lookups wait, for milliseconds, within the puller's slot.
        self.prompt = self._chunks is not None

    @property
    def pulls_sync(self) -> bool:
        """Never: a pull may wait for a key lookup, which must not block the event loop."""
        return False

    # -- pulling -----------------------------------------------------------------------------------

    async def pull(self) -> tuple[Any, int] | Pulled:
        """
        As :meth:`Run.pull`. The items done already settle under the lock, without a trip through
        the event loop each, which is what makes a resume fast. A plain iterator is pulled in a
        worker thread.
        """
        if self._iterator is not None:
            return await anyio.to_thread.run_sync(self._pull_in_thread)
        # The buffer is filled and emptied on the loop without an await in between: taking a unit from
        # it needs no lock, nor the loop turn that taking the lock costs.
        if self._buffer and not self.stopping and (handed := self._from_buffer()) is not None:
            return self._admit_unit(*handed)
        if self._async_pull_lock is None:
            self._async_pull_lock = anyio.Lock()
        async with self._async_pull_lock:
            while True:
                if self.stopping:
                    return END
                if self._chunks is None:
                    unit = await self.take()
                    if unit is END_OF_INPUT:
                        return END
                    index = self._next_index
                    self._next_index = index + 1
                    if unit.__class__ is not Foregone:
                        break
                    self._admit_journalled(unit, index)
                elif self._buffer:
                    if (handed := self._from_buffer()) is not None:
                        unit, index = handed
                        break
                elif (chunk := await self._next_chunk()) is None:
                    return END
                elif _all_foregone(chunk):
                    async with anyio.create_task_group() as group:
                        group.start_soon(self._fetch)
                        await self._settle_all(chunk)
                else:
                    self._buffer.extend(chunk)
        return self._admit_unit(unit, index)

    def pull_sync(self) -> tuple[Any, int] | Pulled:
        """As :meth:`Run.pull_sync`, in a worker thread: the items done already settle under the lock."""
        if self._chunks is None:
            return Run.pull_sync(self)
        with self._pull_lock:
            while True:
                if self.stopping:
                    return END
                if self._buffer:
                    if (handed := self._from_buffer()) is not None:
                        unit, index = handed
                        break
                elif (chunk := self._next_chunk_sync()) is None:
                    return END
                elif _all_foregone(chunk):
                    fetcher = threading.Thread(target=self._fetch_sync, name="boundeddb-journal-lookup")
                    fetcher.start()
                    try:  # the next chunk is looked up meanwhile, in a thread of its own
                        self._settle_foregone(chunk, 0, len(chunk))
                    finally:
                        fetcher.join()
                else:
                    self._buffer.extend(chunk)
        return self._admit_unit(unit, index)

    def _pull_in_thread(self) -> tuple[Any, int] | Pulled:
        """:meth:`pull_sync` until it hands out a unit or ends: a unit may fail its check."""
        while (pulled := self.pull_sync()) is REFUSED:
            pass
        return pulled

    # -- chunks --------------------------------------------------------------------------------------

    def _from_buffer(self) -> tuple[Any, int] | None:
        """Under the pull lock: the buffer's next unit and its index, its foregone items settled; or None."""
        buffer = self._buffer
        while buffer and not self.stopping:
            unit = buffer.popleft()
            index = self._next_index
            self._next_index = index + 1
            if unit.__class__ is not Foregone:
                return unit, index
            self._admit_journalled(unit, index)
        return None

    async def _next_chunk(self) -> list[Any] | None:
        """The next chunk, looked up ahead or now; None at the end, or if the input or a lookup failed."""
        if self._fetched is None and self._fetch_error is None:
            await self._fetch()
        return self._take_fetched()

    def _next_chunk_sync(self) -> list[Any] | None:
        """As :meth:`_next_chunk`, in the calling thread."""
        if self._fetched is None and self._fetch_error is None:
            self._fetch_sync()
        return self._take_fetched()

    def _take_fetched(self) -> list[Any] | None:
        """
        The chunk fetched; if fetching it raised, the run stops and keeps the error to raise, unless
        it had stopped already (a failed unit, a cancellation): what stopped it first is what it raises.
        """
        chunk, self._fetched = self._fetched, None
        if self._fetch_error is not None and not self.stopping:
            self.input_error, self.stopping = self._fetch_error, True
        return chunk

    async def _fetch(self) -> None:
        """Look the next chunk up, keeping it or what its input or lookup raised for :meth:`_next_chunk`."""
        assert self._chunks is not None
        try:
            self._fetched = await anext(self._chunks.chunks, None)  # type: ignore[arg-type]
        except Exception as error:
            self._fetch_error = error

    def _fetch_sync(self) -> None:
        """As :meth:`_fetch`, in the calling thread."""
        assert self._chunks is not None
        try:
            self._fetched = next(self._chunks.chunks, None)  # type: ignore[arg-type]
        except Exception as error:
            self._fetch_error = error

    async def _settle_all(self, chunk: list[Any]) -> None:
        """Settle a chunk of foregone items, giving the loop a turn now and then: a lookup waits for it."""
        await anyio.lowlevel.checkpoint()  # the next chunk's lookup starts
        for start in range(0, len(chunk), _SETTLED_PER_TURN):
            if not self._settle_foregone(chunk, start, start + _SETTLED_PER_TURN):
                return
            await anyio.lowlevel.checkpoint()

    def _settle_foregone(self, chunk: list[Any], start: int, stop: int) -> bool:
        """Settle ``chunk[start:stop]``, foregone items all; False if the run stopped first."""
        admit = self._admit_journalled
        for foregone in chunk[start:stop]:
            if self.stopping:
                return False
            index = self._next_index
            self._next_index = index + 1
            admit(foregone, index)
        return True

    async def _units(self) -> AsyncIterator[Any]:
        """The units of :class:`JournalChunks` one by one, for what pulls them so: through the buffer."""
        while True:
            if not self._buffer:
                if (chunk := await self._next_chunk()) is None:
                    return
                self._buffer.extend(chunk)
            yield self._buffer.popleft()

    def _units_in_thread(self) -> Iterator[Any]:
        """As :meth:`_units`, for a batch's lane (``Run.pull_many_sync``)."""
        while True:
            if not self._buffer:
                if (chunk := self._next_chunk_sync()) is None:
                    return
                self._buffer.extend(chunk)
            yield self._buffer.popleft()

    def _admit_journalled(self, unit: Any, index: int) -> tuple[Any, int] | Pulled:
        """As :meth:`Run._admit`. A :class:`Foregone` item settles on the spot."""
        if unit.__class__ is not Foregone:
            return self._admit_unit(unit, index)
        if unit.error is None:
            self.recorder.unit_skipped()
            self._put(foregone_outcome(unit, index))
        else:
            self.recorder.unit_started()
            self.finish(foregone_outcome(unit, index))
        return REFUSED


def _all_foregone(chunk: list[Any]) -> bool:
    """Whether no item of ``chunk`` is a unit to run."""
    return all(item.__class__ is Foregone for item in chunk)
