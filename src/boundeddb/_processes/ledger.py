"""
What the parent knows of each unit of one ``ProcessRunner.map()`` call, and when.

Each unit the call pulled from the input is, at every moment, in exactly one of these states.
The call's loop and the seats' reader threads change them under the fleet's lock.

- *pending*: pulled and not handed to a worker, or handed back: returned, or its worker died
  before it started it.
- *handed*: sent to a worker, with a place of its marks: ``where[i] = (link, item, place, when)``.
- *started*: the worker marked it begun before the unit's first statement, in the shared marks that
  are read when the worker died, or by a Begun message: ``where[i] = (link, None, place, when)``.
- *committing*: the worker marked it committing before its COMMIT, by a message with its value and,
  with ``verify_commits``, its transaction id: ``committing[i]``.
- *verifying*: with ``verify_commits=True``, its worker died while committing it, and the next
  worker in the seat asks the server what became of it.
- *settled*: it has an outcome.

When a worker dies, its handed units go back to pending and run elsewhere: nothing is lost.
Its started units settle as failures, so nothing runs twice, with ``commit_unknown`` for those
committing.
"""

from __future__ import annotations

import contextlib
import pickle
import socket
from collections import deque
from time import perf_counter
from typing import Any

import anyio

from .._core.recorder import Totals
from .._errors import UnpicklableError, WorkerLostError
from .._outcome import Outcome
from .._telemetry import CallTelemetry
from . import protocol as p
from .fleet import Link
from .protocol import Kind

__all__ = ["Ledger"]


class Ledger:
    """The states of one call's units, listed in the module docstring, and the wake-up of the call's loop."""

    def __init__(
        self,
        kind: Kind,
        *,
        stop_on_failure: bool,
        verify: bool,
        totals: Totals,
        telemetry: CallTelemetry | None = None,
    ) -> None:
        self.id = 0  # set when the fleet registers it
        #: The runner's counters since it was made, and the call's metrics under ``instrument()``.
        self._totals = totals
        self._telemetry = telemetry
        self.kind = kind
        self.stop_on_failure = stop_on_failure
        self.verify = verify
        self.pending: deque[tuple[int, bytes]] = deque()
        #: Units handed to a worker: ``(link, item or None once Begun, place, when handed or Begun)``.
        self.where: dict[int, tuple[Link, bytes | None, int, float]] = {}
        self.committing: dict[int, tuple[str | None, bytes]] = {}
        self.verifying: dict[int, float] = {}
        self.outcomes: list[Outcome[Any]] = []
        #: Workers this call is open on: CallBegins sent, Closed not yet received.
        self.open_on: set[Link] = set()
        self.stopping = False
        self.cancelled = False
        #: The input is exhausted: the loop wants to hear of every unit that settles, to end.
        self.draining = False
        self.error: BaseException | None = None
        #: What each worker said of the call when it closed it: peak connections, peak units in flight.
        self.peaks: dict[Link, tuple[int, int]] = {}
        #: And, with ``batch=``, its batches committed and units run again.
        self.batches: dict[Link, tuple[int, int]] = {}
        self._wakeup, self._waker = socket.socketpair()
        self._wakeup.setblocking(False)
        self._waker.setblocking(False)

    # -- from a seat's reader thread, under the fleet's lock ------------------------------------------

    def wake(self) -> None:
        """Wake the call's loop, from any thread."""
        with contextlib.suppress(OSError):  # BlockingIOError: a wake-up is pending already
            self._waker.send(b"\0")

    def settle(self, outcome: Outcome[Any]) -> None:
        """Record a unit's outcome, under the lock. With errors="raise", a failure stops the call."""
        self.outcomes.append(outcome)
        self._totals.add(outcome)
        if self._telemetry is not None:
            self._telemetry.settled(outcome)
        if outcome.error is not None and self.stop_on_failure:
            self.stopping = True

    @property
    def in_flight(self) -> int:
        """Units started and not settled, as far as the parent can tell now, for statistics."""
        return sum(1 for link, item, place, _ in self.where.values() if _begun(link, item, place))

    def on_message(self, link: Link, message: p.CallMessage) -> bool:
        """Take in what a worker said of this call: whether the call's loop has something to do now."""
        if isinstance(message, p.Settled):
            return self._on_settled(link, message)
        if isinstance(message, p.Begun):
            index = message.unit
            self.where[index] = (link, None, self.where[index][2], perf_counter())
            return False
        if isinstance(message, p.Committing):
            self.committing[message.unit] = (message.xid, message.value)
            return False
        if isinstance(message, p.Returned):
            for index in message.indexes:
                _, item, place, _ = self.where.pop(index)
                link.free_place(place)
                link.take_back()
                if item is not None and not self.stopping:
                    self.pending.appendleft((index, item))
        elif isinstance(message, p.Closed):
            self.open_on.discard(link)
            self.peaks[link] = (message.peak_connections, message.peak_units)
            self.batches[link] = (message.batches_committed, message.units_rerun)
            self._totals.add_batches(message.batches_committed, message.units_rerun)
        elif isinstance(message, p.CallFailed):
            if self.error is None:
                self.error = p.load_error(message.error, message.text, -1)
            self.stopping = True
        elif isinstance(message, p.Verified):
            if (self.id, message.unit) in link.verifying:
                link.verifying.remove((self.id, message.unit))
            self.on_verified(message.unit, message.status)
        return True

    def _on_settled(self, link: Link, message: p.Settled) -> bool:
        index = message.unit
        link.free_place(self.where.pop(index)[2])
        link.take_back()
        committed = self.committing.pop(index, None)
        value, error = None, None
        if message.failed:
            error = p.load_error(message.data, message.text, index)
        else:
            value, error = _load_value(message.data if committed is None else committed[1], index)
        self.settle(
            Outcome(
                index,
                value,
                error,
                message.latency_s,
                message.wait_s,
                message.attempts,
                message.commit_unknown,
                message.commit_verified,
            )
        )
        # The call's loop in call.py refills a worker once only its units in flight are left handed to it.
        return self.draining or self.stopping or link.handed <= link.seat.units

    def on_lost(self, link: Link, why: str) -> tuple[bool, list[tuple[int, str]]]:
        """``link``'s worker died: whether this call held anything there, and the COMMITs to ask about."""
        touched = link in self.open_on
        self.open_on.discard(link)
        to_verify: list[tuple[int, str]] = []
        now = perf_counter()
        for index, (held_by, item, place, since) in list(self.where.items()):
            if held_by is not link:
                continue
            touched = True
            del self.where[index]
            if item is not None and link.mark(place) == p.MARK_HANDED:  # never begun: it runs elsewhere
                if not self.stopping:
                    self.pending.appendleft((index, item))
                continue
            error = WorkerLostError(f"unit {index} was running when its {link.name()} died: {why}")
            committing = self.committing.get(index)
            if committing is None and link.mark(place) != p.MARK_COMMITTING:
                # No COMMIT sent: its transaction died with the connection.
                self.settle(Outcome(index, None, error, now - since, 0.0))
            elif committing is not None and self.verify and committing[0] is not None and not self.cancelled:
                self.verifying[index] = since
                to_verify.append((index, committing[0]))
            else:  # with verify_commits and no id, it wrote nothing: nothing of it was committed
                self.committing.pop(index, None)
                nothing = self.verify and committing is not None and committing[0] is None
                self.settle(
                    Outcome(
                        index,
                        None,
                        error,
                        now - since,
                        0.0,
                        commit_unknown=not nothing,
                        commit_verified=nothing,
                    )
                )
        return touched, to_verify

    def on_verified(self, index: int, status: str) -> None:
        """What the server said of a COMMIT whose worker died, or ``"unknown"`` if nobody could ask."""
        started = self.verifying.pop(index, None)
        if started is None:
            return
        _, payload = self.committing.pop(index)
        latency = perf_counter() - started
        error = WorkerLostError(f"unit {index}'s worker died while it committed the unit")
        if status == "committed":
            value, failure = _load_value(payload, index)
            self.settle(Outcome(index, value, failure, latency, 0.0, commit_verified=failure is None))
        elif status == "aborted":
            self.settle(Outcome(index, None, error, latency, 0.0, commit_verified=True))
        else:
            self.settle(Outcome(index, None, error, latency, 0.0, commit_unknown=True))

    def queue(self, new: list[tuple[int, bytes]]) -> None:
        """Pulled units, numbered and pickled, to hand out. Nothing is queued once the call stops."""
        if self.stopping:
            self.pending.clear()
        else:
            self.pending.extend(new)

    def open(self, link: Link) -> bool:
        """The call is open on ``link``'s worker from now on. True if it was not: send CallBegins first."""
        if link in self.open_on:
            return False
        self.open_on.add(link)
        return True

    def hand(self, link: Link, room: int, now: float) -> list[tuple[int, bytes, int]]:
        """Up to ``room`` pending units handed to ``link``'s worker now: ``(index, item, place)`` each."""
        handed = [(*self.pending.popleft(), link.take_place()) for _ in range(min(room, len(self.pending)))]
        for index, item, place in handed:
            self.where[index] = (link, item, place, now)
        link.hand(len(handed))
        return handed

    def stop(self, *, draining: bool = False) -> None:
        """Start no more units after a failure or the input's, and hear of every unit that settles."""
        self.stopping = True
        self.draining = self.draining or draining

    def drain(self) -> None:
        """The input is exhausted: the loop wants to hear of every unit that settles, to end."""
        self.draining = True

    def fail(self, error: BaseException) -> None:
        """The fleet broke and the call cannot go on: ``error`` is what it raises."""
        if self.error is None:
            self.error, self.stopping = error, True
            for index in list(self.verifying):
                self.on_verified(index, "unknown")

    def cancel(self) -> None:
        """The caller cancelled the call: nothing more runs, nothing pending is handed out."""
        self.cancelled = self.stopping = True
        self.pending.clear()

    def waiting(self) -> int:
        """Units pulled and not started yet: pending, or handed to a worker that has not started them."""
        begun = sum(1 for link, item, place, _ in self.where.values() if _begun(link, item, place))
        return len(self.pending) + len(self.where) - begun

    # -- the call's loop's side -----------------------------------------------------------------------

    async def wait(self) -> None:
        """Until a reader thread calls :meth:`wake`, at once if it did since the last wait."""
        await anyio.wait_readable(self._wakeup)
        with contextlib.suppress(BlockingIOError):
            while self._wakeup.recv(4096):
                pass

    def close(self) -> None:
        self._wakeup.close()
        self._waker.close()


def _begun(link: Link, item: bytes | None, place: int) -> bool:
    """Whether a handed unit has begun: its worker said so, or its mark, read live as a snapshot, says so."""
    return item is None or link.mark(place) != p.MARK_HANDED


def _load_value(payload: bytes | None, index: int) -> tuple[Any, Exception | None]:
    """A committed unit's value, unpickled here, or the error that says it could not be."""
    if payload is None:
        return None, None
    try:
        return pickle.loads(payload), None
    except Exception as error:
        msg = (
            f"unit {index} committed, but its value could not be unpickled here "
            f"({type(error).__qualname__}: {error}): its class must be importable in this process"
        )
        return None, UnpicklableError(msg)
