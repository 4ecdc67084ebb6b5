"""One of the parent's calls on a worker: the units it was handed, and what it reports of each."""

from __future__ import annotations

import asyncio
import contextlib
import pickle
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from typing import Any, Protocol

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncSession
from sqlalchemy.orm import Session

from .._core.attempts import CommitUnknown
from .._errors import UnpicklableError
from .._outcome import Outcome
from .._runners.journal_rows import JournalRows
from . import protocol as p
from .protocol import Kind

__all__ = ["Gate", "Outbox", "WorkerCall"]


class Outbox(Protocol):
    """What a call needs of its worker: the pipe to the parent, its marks, the gate, and the id's SQL."""

    gate: Gate
    #: The marks the worker shares with the parent, described in ``protocol``, or None: it sends them.
    marks: memoryview | None
    #: With ``verify_commits``, the SQL that reads a transaction's id, else None.
    xid_sql: str | None

    def send(self, message: tuple[Any, ...]) -> None:
        """Send ``message`` after those posted, from any thread: in the pipe when this returns."""

    def post(self, message: tuple[Any, ...]) -> None:
        """Send ``message`` soon, with the next one sent."""

    def flush(self) -> None:
        """Send what was posted now, from any thread."""


class Gate:
    """A worker's units in flight over all its calls: at most its share, and of one kind at a time."""

    def __init__(self, share: int, dispose: Callable[[Kind], Awaitable[None]]) -> None:
        self._share = share
        self._free = share
        self._kind: Kind | None = None
        self._switching = False
        self._changed = asyncio.Event()
        self._dispose = dispose

    def _blocked(self, kind: Kind) -> bool:
        other_in_flight = kind is not self._kind and self._free < self._share
        return self._switching or self._free == 0 or other_in_flight

    async def acquire(self, kind: Kind) -> None:
        """Take a place. Before the first unit of another kind, close the other engine's connections."""
        while self._blocked(kind):
            self._changed.clear()
            await self._changed.wait()
        if kind is not self._kind:
            old, self._kind = self._kind, kind
            if old is not None:
                self._switching = True
                try:
                    await self._dispose(old)
                finally:
                    self._switching = False
                    self._changed.set()
        self._free -= 1

    def release(self, places: int = 1) -> None:
        self._free += places
        self._changed.set()


def _load_item(data: bytes, index: int) -> Any:
    try:
        return pickle.loads(data)
    except Exception as error:
        msg = (
            f"unit {index}'s item could not be unpickled in the worker process "
            f"({type(error).__qualname__}: {error}): its class must be importable there"
        )
        raise UnpicklableError(msg) from None


class _AsyncUnit:
    """``fn(session, item)`` on an AsyncSession, marked begun before and committing after it."""

    __slots__ = ("_call", "_index", "_item", "_place")

    def __init__(self, call: WorkerCall, index: int, item: bytes, place: int) -> None:
        self._call, self._index, self._item, self._place = call, index, item, place

    async def __call__(self, session: AsyncSession) -> None:
        call = self._call
        call.begin(self._place)
        await self._finish(session, await call.fn(session, _load_item(self._item, self._index)))

    async def _finish(self, session: AsyncSession, value: Any) -> None:
        """Mark the unit committing, with its value, once ``fn`` returned it."""
        call, index = self._call, self._index
        payload = p.dump_value(value, index)
        xid = None
        if call.xid_sql is not None:
            await session.flush()  # what COMMIT would send first: the id covers it
            xid = (await session.execute(text(call.xid_sql))).scalar()
        call.committing(index, self._place, xid, payload)


class _SyncUnit:
    """``fn(session, item)`` on a Session, in a worker thread, as :class:`_AsyncUnit` does it."""

    __slots__ = ("_call", "_index", "_item", "_place")

    def __init__(self, call: WorkerCall, index: int, item: bytes, place: int) -> None:
        self._call, self._index, self._item, self._place = call, index, item, place

    def __call__(self, session: Session) -> None:
        call = self._call
        call.begin(self._place)
        self._finish(session, call.fn(session, _load_item(self._item, self._index)))

    def _finish(self, session: Session, value: Any) -> None:
        """As :meth:`_AsyncUnit._finish`."""
        call, index = self._call, self._index
        payload = p.dump_value(value, index)
        xid = None
        if call.xid_sql is not None:
            session.flush()
            xid = session.execute(text(call.xid_sql)).scalar()
        call.committing(index, self._place, xid, payload)


class _JournalledAsyncUnit(_AsyncUnit):
    """An :class:`_AsyncUnit` whose item comes with its journal key: it writes the key's row first."""

    __slots__ = ("_key",)

    async def __call__(self, session: AsyncSession) -> None:
        call, index = self._call, self._index
        call.begin(self._place)
        item, self._key = _load_item(self._item, index)
        rows = call.rows
        assert rows is not None
        await rows.write_async(session, self._key)
        await self._finish(session, await call.fn(session, item))

    async def probe_async(self, unknown: CommitUnknown) -> Exception:
        """What became of this unit's lost COMMIT, by its key: see ``JournalRows.probe_async``."""
        assert self._call.rows is not None
        return await self._call.rows.probe_async(self._key, unknown)


class _JournalledSyncUnit(_SyncUnit):
    """As :class:`_JournalledAsyncUnit`, on a Session in a worker thread."""

    __slots__ = ("_key",)

    def __call__(self, session: Session) -> None:
        call, index = self._call, self._index
        call.begin(self._place)
        item, self._key = _load_item(self._item, index)
        rows = call.rows
        assert rows is not None
        rows.write_sync(session, self._key)
        self._finish(session, call.fn(session, item))

    def probe_sync(self, unknown: CommitUnknown) -> Exception:
        """As :meth:`_JournalledAsyncUnit.probe_async`, in the unit's worker thread."""
        assert self._call.rows is not None
        return self._call.rows.probe_sync(self._key, unknown)


class WorkerCall:
    """One of the parent's calls, on this worker: the units it was handed and those it started."""

    def __init__(
        self,
        worker: Outbox,
        call: int,
        kind: Kind,
        fn: bytes,
        carrier: dict[str, str] | None = None,
        journal: tuple[str, str] | None = None,
    ) -> None:
        self.worker = worker
        #: With ``journal=``: ``(job, table)``, and the rows once the worker's engine is known.
        self.journal = journal
        self.rows: JournalRows | None = None
        self.id = call
        self.kind = kind
        self.fn_bytes = fn
        self.fn: Any = None
        #: The caller's trace context, when ``boundeddb.instrument()`` instruments it.
        self.carrier = carrier
        self.xid_sql = worker.xid_sql
        self.marks = worker.marks
        #: Values of units that committed, to send with their outcomes unless a Committing carried them.
        self.values: dict[int, bytes] = {}
        self.queue: deque[tuple[int, bytes, int]] = deque()
        #: The in-process runner's index of each started unit, in pull order, to the parent's index.
        self.order: dict[int, int] = {}
        self._pulled = 0
        #: Gate places held by this call's units, and the most at once.
        self.held = 0
        self.peak_held = 0
        self.closing = False
        self.stopping = False
        self.running = False
        self.task: asyncio.Task[None] | None = None
        self._wakeup = asyncio.Event()

    # -- what the parent says ---------------------------------------------------------------------

    def add(self, units: Iterable[tuple[int, bytes, int]]) -> None:
        if self.stopping:
            self.worker.send(p.Returned(self.id, [unit[0] for unit in units]))
            return
        self.queue.extend(units)
        self._wakeup.set()

    def close(self) -> None:
        self.closing = True
        self._wakeup.set()

    def stop(self) -> None:
        self.stopping = True
        self.return_queued()
        self._wakeup.set()

    def cancel(self) -> None:
        self.stop()
        if self.running and self.task is not None:
            self.task.cancel()

    def return_queued(self) -> None:
        """Give the units not started back to the parent, if it is still there to take them."""
        if self.queue:
            with contextlib.suppress(OSError):  # the parent died: a worker ending must not crash on it
                self.worker.send(p.Returned(self.id, [unit[0] for unit in self.queue]))
            self.queue.clear()

    # -- the in-process runner's side --------------------------------------------------------------

    async def units(self) -> AsyncIterator[Callable[[Any], Any]]:
        """The units as the runner pulls them, each holding a place of the gate."""
        gate, is_async = self.worker.gate, self.kind is Kind.ASYNC
        unit: type[_AsyncUnit | _SyncUnit]
        if self.rows is not None:
            unit = _JournalledAsyncUnit if is_async else _JournalledSyncUnit
        else:
            unit = _AsyncUnit if is_async else _SyncUnit
        while True:
            while not self.queue:
                if self.closing or self.stopping:
                    return
                self._wakeup.clear()
                await self._wakeup.wait()
            await gate.acquire(self.kind)
            if not self.queue:  # stopped meanwhile
                gate.release()
                continue
            index, item, place = self.queue.popleft()
            self.held += 1
            self.peak_held = max(self.peak_held, self.held)
            self.order[self._pulled] = index
            self._pulled += 1
            if self.marks is None:
                self.worker.post(p.Begun(self.id, index))  # in the pipe before fn runs: see begin()
            yield unit(self, index, item, place)

    def begin(self, place: int) -> None:
        """
        Mark a unit begun, before its first statement: a dead worker's begun units do not run again.

        What was posted goes first, with message marks this unit's Begun too: the outcomes of the
        units that settled before it took their place, so that if the worker dies, no more than its
        share of units is ever in doubt.
        """
        self.worker.flush()
        if self.marks is not None:
            self.marks[place] = p.MARK_BEGUN

    def committing(self, index: int, place: int, xid: Any, payload: bytes) -> None:
        """Mark a unit committing before its COMMIT, with its value where the parent may need it then."""
        if self.marks is None or self.xid_sql is not None:
            self.worker.send(p.Committing(self.id, index, None if xid is None else str(xid), payload))
        else:
            self.values[index] = payload
        if self.marks is not None:
            self.marks[place] = p.MARK_COMMITTING

    def settled(self, outcome: Outcome[Any]) -> None:
        self.held -= 1
        self.worker.gate.release()
        index = self.order.pop(outcome.index)
        error = outcome.error
        value = self.values.pop(index, None)
        data, text_ = (value, "") if error is None else p.dump_error(error, index)
        self.worker.post(
            p.Settled(
                self.id,
                index,
                outcome.latency_s,
                outcome.wait_s,
                outcome.attempts,
                outcome.commit_unknown,
                outcome.commit_verified,
                error is not None,
                data,
                text_,
            )
        )
