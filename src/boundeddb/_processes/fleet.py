"""A ProcessRunner's workers: one thread per seat starts a worker, reads it, and replaces it when it dies."""

from __future__ import annotations

import contextlib
import itertools
import logging
import pickle
import threading
import time
from collections import defaultdict
from concurrent.futures import Future
from typing import Protocol

from .._core.recorder import Totals
from .._errors import WorkerLostError, WorkerStartError
from . import protocol as p
from .backends import Backend, WorkerHandle
from .desk import LookupDesk
from .protocol import Kind, WorkerConfig, most_handed

__all__ = ["CallState", "Fleet", "Link", "Seat"]

logger = logging.getLogger("boundeddb.processes")

#: A seat whose workers end before they are ready this many times in a row breaks the runner.
START_ATTEMPTS = 3
#: How many seconds a worker told to exit may take before it is killed.
EXIT_GRACE_S = 10.0
#: How many seconds closing waits for the calls in progress before it ends their workers anyway.
CALLS_GRACE_S = 600.0


class CallState(Protocol):
    """What a seat's reader thread tells a call in progress, a ``ledger.Ledger``, under the fleet's lock."""

    id: int
    kind: Kind

    def on_message(self, link: Link, message: p.CallMessage) -> bool:
        """Take in what a worker said, and tell whether the call's loop has something to do now."""
        ...

    def on_lost(self, link: Link, why: str) -> tuple[bool, list[tuple[int, str]]]:
        """``link``'s worker died: whether the call held anything there, and the COMMITs to ask about."""
        ...

    def on_verified(self, index: int, status: str) -> None: ...

    @property
    def in_flight(self) -> int: ...

    def waiting(self) -> int:
        """Units of the call pulled and not started yet."""
        ...

    def wake(self) -> None:
        """Wake the call's loop, outside the lock."""
        ...


class Link:
    """One worker's life in a seat: its pipe, its marks, how many units it holds, whether it serves yet."""

    def __init__(self, seat: Seat, started: WorkerHandle) -> None:
        self.seat = seat
        self.started = started
        self._send_lock = threading.Lock()
        self.ready = False
        self.dead = False
        #: Units of any call handed to this worker and not yet settled or given back.
        self.handed = 0
        #: The worker's marks in shared memory, described in ``protocol``, or None: the worker sends them.
        self.marks = started.marks
        #: Places of the marks that no unit handed to this worker holds.
        self._free = list(range(most_handed(seat.units)))
        #: COMMITs of a dead predecessor this worker was asked about, as ``(call, index)``.
        self.verifying: list[tuple[int, int]] = []

    def send(self, data: bytes) -> bool:
        """Send a message from any thread. ``False`` if the worker is gone: its reader settles the rest."""
        with self._send_lock:
            try:
                self.started.connection.send_bytes(data)
            except (OSError, ValueError):
                return False
            return True

    def name(self) -> str:
        return f"worker {self.seat.number}"

    def hand(self, units: int) -> None:
        """``units`` more are handed to this worker. Under the fleet's lock."""
        self.handed += units

    def take_back(self, units: int = 1) -> None:
        """``units`` handed to this worker settled or came back. Under the fleet's lock."""
        self.handed -= units

    def take_place(self) -> int:
        """A place for a unit handed to this worker, its mark cleared. Under the fleet's lock."""
        place = self._free.pop()
        if self.marks is not None:
            self.marks[place] = p.MARK_HANDED
        return place

    def free_place(self, place: int) -> None:
        """The unit at ``place`` settled or came back. Under the fleet's lock."""
        self._free.append(place)

    def mark(self, place: int) -> int:
        """The shared mark at ``place``: a snapshot, and final once ``_tend`` saw the worker end."""
        return p.MARK_HANDED if self.marks is None else self.marks[place]


class Seat:
    """A place for one worker: its share of the limit, filled again when its worker dies."""

    def __init__(self, number: int, config: WorkerConfig) -> None:
        self.number = number
        self.config = config
        self.share = config.share
        #: The most units in flight on its worker: the share, or the share of batches.
        self.units = config.units
        self.link: Link | None = None
        #: Workers that ended before they were ready, in a row.
        self.failed_starts = 0
        #: COMMITs a dead worker had begun, to ask the next one about: ``kind -> [(call, index, xid)]``.
        self.to_verify: dict[Kind, list[tuple[int, int, str]]] = defaultdict(list)


class Fleet:
    """The workers of one runner, the threads that tend them, and the calls in progress."""

    def __init__(self, backend: Backend, configs: list[WorkerConfig]) -> None:
        self.backend = backend
        self.lock = threading.Lock()
        self.seats = [Seat(number, config) for number, config in enumerate(configs)]
        self.calls: dict[int, CallState] = {}
        self.closing = False
        #: Set when workers cannot be started: every call raises it.
        self.broken: BaseException | None = None
        self._threads: list[threading.Thread] = []
        self._call_ids = itertools.count(1)
        #: The calls' journal lookups in flight.
        self._desk = LookupDesk(self.ready_links)  # type: ignore[arg-type]
        #: The runner's counters since it was made, for its ``statistics()``.
        self.totals = Totals()
        self._idle = threading.Condition(self.lock)

    # -- life -----------------------------------------------------------------------------------------

    def start(self) -> None:
        """Start a thread per seat, once. Each starts its worker and keeps one there."""
        with self.lock:
            if self._threads or self.closing:
                return
            self._threads = [
                threading.Thread(
                    target=self._tend, args=(seat,), name=f"boundeddb-seat-{seat.number}", daemon=True
                )
                for seat in self.seats
            ]
        for thread in self._threads:
            thread.start()

    def figures(self) -> tuple[int, int]:
        """Units started and not settled, and units pulled and not started, over the calls in progress."""
        with self.lock:
            in_flight = sum(call.in_flight for call in self.calls.values())
            waiting = sum(call.waiting() for call in self.calls.values())
        return in_flight, waiting

    def ready_links(self) -> list[Link]:
        """The workers that serve now. Under the lock."""
        return [
            link for seat in self.seats if (link := seat.link) is not None and link.ready and not link.dead
        ]

    def register(self, call: CallState) -> None:
        """Give ``call`` its id and tell it what the workers say of it from now on."""
        with self.lock:
            call.id = next(self._call_ids)
            self.calls[call.id] = call

    def unregister(self, call: CallState) -> None:
        with self.lock:
            self.calls.pop(call.id, None)
            self._idle.notify_all()

    def look_up(self, kind: Kind, journal: tuple[str, str, bool], keys: list[str]) -> Future[set[str]]:
        """
        Which of ``keys`` have a row in ``journal``, ``(job, table, create_table)``, asked of a worker
        on its engine of ``kind``: within its share of the limit, as the parent has no connection.
        """
        with self.lock:
            if self._done():
                failed: Future[set[str]] = Future()
                failed.set_exception(self._why_done())
                return failed
            return self._desk.open(kind, journal, keys)

    def _why_done(self) -> BaseException:
        """What a lookup raises once no worker will answer it. Under the lock."""
        if self.broken is not None:
            return self.broken
        return WorkerLostError("the runner closed before a worker answered the journal's lookup")

    def close(self, timeout: float = EXIT_GRACE_S) -> None:
        """Wait for the calls in progress, tell every worker to exit, and wait for it or kill it."""
        deadline = time.monotonic() + CALLS_GRACE_S
        with self.lock:
            while self.calls and time.monotonic() < deadline:
                self._idle.wait(max(0.0, deadline - time.monotonic()))
            self.closing = True
            links = [seat.link for seat in self.seats if seat.link is not None]
        exit_message = pickle.dumps(p.Exit())
        for link in links:
            link.send(exit_message)
        # Only a seat's own thread waits for its worker to end, because waiting on a process from two
        # threads races. So wait for the threads, and kill the workers of those that do not end.
        deadline = time.monotonic() + timeout
        for seat, thread in zip(self.seats, self._threads, strict=False):  # no threads if never started
            thread.join(max(0.0, deadline - time.monotonic()))
            hung = seat.link
            if thread.is_alive() and hung is not None:
                logger.warning("%s did not exit within %s s: killing it", hung.name(), timeout)
                hung.started.kill()
                thread.join(timeout)
        self.backend.close()

    # -- a seat's thread ------------------------------------------------------------------------------

    def _done(self) -> bool:
        """Whether no worker is to be started any more: the runner closes, or is broken. Under the lock."""
        return self.closing or self.broken is not None

    def _tend(self, seat: Seat) -> None:
        while True:
            with self.lock:
                if self._done():
                    return
            try:
                started = self.backend.start(seat.number, seat.config)
            except Exception as error:
                if self._start_failed(
                    seat, f"it could not be started ({type(error).__name__}: {error})", error
                ):
                    return
                time.sleep(0.5)
                continue
            link = Link(seat, started)
            with self.lock:
                seat.link = link
                if self.closing:
                    link.send(pickle.dumps(p.Exit()))
            self._read(link)
            if not started.wait(EXIT_GRACE_S if self.closing else 1.0) and link.marks is not None:
                started.kill()  # its pipe ended but it did not: end it, so that its marks hold still
                started.wait(EXIT_GRACE_S)
            why = started.describe_end()
            with contextlib.suppress(OSError):
                started.connection.close()
            for call in self._lost(link, why):
                call.wake()
            if not link.ready and self._start_failed(seat, why, None):
                return

    def _start_failed(self, seat: Seat, why: str, error: BaseException | None) -> bool:
        """Count a worker that never became ready. ``True`` if the runner is broken now."""
        with self.lock:
            if self.closing:
                return True
            seat.failed_starts += 1
            if seat.failed_starts < START_ATTEMPTS:
                logger.warning(
                    "%s %d ended before it was ready (%s): starting another",
                    self.backend.noun,
                    seat.number,
                    why,
                )
                return False
            msg = (
                f"{self.backend.noun} {seat.number} ended before it was ready {START_ATTEMPTS} times; last: "
                f"{why}. Workers are started with 'spawn': they import the module of fn and the main "
                'module again, which must be importable and guarded by `if __name__ == "__main__":`. '
                "Its standard error says more."
            )
            broken = WorkerStartError(msg)
            broken.__cause__ = error
            self.broken = broken
            self._desk.fail(broken)
            calls = list(self.calls.values())
        for call in calls:
            call.wake()
        return True

    def _read(self, link: Link) -> None:
        """
        Handle the worker's messages until its pipe ends, every one the worker wrote before it ended.

        Those read together are handled together, also when the pipe ends among them: a dead worker's
        pipe polls readable, and its last messages (a unit settled, a unit committing) must count.
        """
        connection = link.started.connection
        ended = False
        while not ended:
            messages: list[p.Ready | p.LookedUp | p.CallMessage] = []
            try:
                messages += pickle.loads(connection.recv_bytes())
                while connection.poll():
                    messages += pickle.loads(connection.recv_bytes())
            except (EOFError, OSError):
                ended = True
            if messages:
                for call in self._handle(link, messages):
                    call.wake()

    def _handle(self, link: Link, messages: list[p.Ready | p.LookedUp | p.CallMessage]) -> set[CallState]:
        woken: set[CallState] = set()
        with self.lock:
            for message in messages:
                if isinstance(message, p.Ready):
                    self._ready(link)
                    woken.update(self.calls.values())
                    continue
                if isinstance(message, p.LookedUp):
                    self._desk.answered(message)
                    continue
                call = self.calls.get(message.call)
                if call is not None and call.on_message(link, message):
                    woken.add(call)
        return woken

    def _ready(self, link: Link) -> None:
        """A worker serves: ask it first about the COMMITs its seat's previous worker had begun."""
        link.ready = True
        seat = link.seat
        seat.failed_starts = 0
        for kind, requests in seat.to_verify.items():
            if requests:
                link.verifying.extend((call, index) for call, index, _ in requests)
                link.send(pickle.dumps(p.Verify(kind.value, list(requests))))
        seat.to_verify.clear()
        self._desk.ready()

    def _lost(self, link: Link, why: str) -> set[CallState]:
        """The worker is gone: settle or hand back what it held, in every call."""
        with self.lock:
            link.dead = True
            seat = link.seat
            if seat.link is link:
                seat.link = None
            woken: set[CallState] = set()
            for call in self.calls.values():
                touched, requests = call.on_lost(link, why)
                if touched:
                    woken.add(call)
                seat.to_verify[call.kind].extend((call.id, index, xid) for index, xid in requests)
            unanswered = [(call_id, index) for call_id, index in link.verifying]  # died before it answered
            link.verifying.clear()
            if self._done():  # no next worker to ask
                for asked in seat.to_verify.values():
                    unanswered.extend((call_id, index) for call_id, index, _ in asked)
                seat.to_verify.clear()
            for call_id, index in unanswered:
                if (waiting := self.calls.get(call_id)) is not None:
                    waiting.on_verified(index, "unknown")
                    woken.add(waiting)
            if self._done():
                self._desk.fail(self._why_done())
            else:
                self._desk.lost(link)
            return woken
