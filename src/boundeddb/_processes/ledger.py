"""
What the parent knows of each unit of one ``ProcessRunner.map()`` call, and when.

Each unit the call pulled from the input is, at every moment, in exactly one of these states
(all under the fleet's lock, changed by the call's loop or by a seat's reader thread):

- *pending*: pulled, not handed to a worker (or handed back: returned, or its worker died
  before it started it);
- *handed*: sent to a worker, with a place of its marks (``where[i] = (link, item, place, when)``);
- *started*: the worker marked it begun before the unit's first statement (in the shared marks,
  read when the worker died; or by a STARTED message, ``where[i] = (link, None, place, when)``);
- *committing*: the worker marked it committing before its COMMIT (by message with its value and,
  with ``verify_commits``, its transaction id: ``committing[i]``);
- *verifying*: its worker died while committing it, and the next worker in the seat asks the
  server what became of it (``verify_commits=True``);
- *settled*: it has an outcome.

A dead worker's handed units go back to pending (they run elsewhere: nothing is lost), its
started ones settle as failures (nothing runs twice), with ``commit_unknown`` for those committing.
"""

from __future__ import annotations

import contextlib
import pickle
import socket
from collections import deque
from time import perf_counter
from typing import Any

import anyio

from .._core.recorder import LoopLag, Totals
from .._core.run import failures_error
from .._errors import UnpicklableError, WorkerLostError
from .._outcome import Outcome, RunReport
from .._stats import RunStats, percentile
from .._telemetry import CallTelemetry
from . import protocol as p
from .fleet import Link
from .protocol import Kind

__all__ = ["Ledger"]


class Ledger:
    """The states of one call's units (see the module docstring), and the wake-up of the call's loop."""

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
        #: The runner's counters since it was made, and the call's metrics (``instrument()``).
        self._totals = totals
        self._telemetry = telemetry
        self.kind = kind
        self.stop_on_failure = stop_on_failure
        self.verify = verify
        self.pending: deque[tuple[int, bytes]] = deque()
        #: Units handed to a worker: (link, item or None once STARTED, place, when handed or STARTED).
        self.where: dict[int, tuple[Link, bytes | None, int, float]] = {}
        self.committing: dict[int, tuple[str | None, bytes]] = {}
        self.verifying: dict[int, float] = {}
        self.outcomes: list[Outcome[Any]] = []
        #: Workers this call is open on (CALL sent, CLOSED not yet received).
        self.open_on: set[Link] = set()
        self.stopping = False
        self.cancelled = False
        #: The input is exhausted: the loop wants to hear of every unit that settles (to end).
        self.draining = False
        self.error: BaseException | None = None
        #: What each worker said of the call when it closed it: peak connections, peak units in flight.
        self.peaks: dict[Link, tuple[int, int]] = {}
        self._wakeup, self._waker = socket.socketpair()
        self._wakeup.setblocking(False)
        self._waker.setblocking(False)

    # -- from a seat's reader thread, under the fleet's lock ------------------------------------------

    def wake(self) -> None:
        """Wake the call's loop (any thread)."""
        with contextlib.suppress(OSError):  # BlockingIOError: a wake-up is pending already
            self._waker.send(b"\0")

    def settle(self, outcome: Outcome[Any]) -> None:
        """Record a unit's outcome; with errors="raise", a failure stops the call (under the lock)."""
        self.outcomes.append(outcome)
        self._totals.add(outcome)
        if self._telemetry is not None:
            self._telemetry.settled(outcome)
        if outcome.error is not None and self.stop_on_failure:
            self.stopping = True

    @property
    def in_flight(self) -> int:
        """Units started and not settled, as far as the parent can tell now (for statistics)."""
        return sum(1 for link, item, place, _ in self.where.values() if _begun(link, item, place))

    def on_message(self, link: Link, message: tuple[Any, ...]) -> bool:
        """Take in what a worker said of this call; whether the call's loop has something to do now."""
        tag = message[0]
        if tag == p.OUTCOME:
            _, _, index, latency, wait, attempts, unknown, verified, failed, data, text = message
            link.free_place(self.where.pop(index)[2])
            link.handed -= 1
            committed = self.committing.pop(index, None)
            value, error = None, None
            if failed:
                error = p.load_error(data, text, index)
            else:
                value, error = _load_value(data if committed is None else committed[1], index)
            self.settle(Outcome(index, value, error, latency, wait, attempts, unknown, verified))
            # The loop refills a worker once only its share is left handed to it (call.py).
            return self.draining or self.stopping or link.handed <= link.seat.units
        if tag == p.STARTED:
            index = message[2]
            self.where[index] = (link, None, self.where[index][2], perf_counter())
            return False
        if tag == p.COMMITTING:
            self.committing[message[2]] = (message[3], message[4])
            return False
        if tag == p.RETURNED:
            for index in message[2]:
                _, item, place, _ = self.where.pop(index)
                link.free_place(place)
                link.handed -= 1
                if item is not None and not self.stopping:
                    self.pending.appendleft((index, item))
        elif tag == p.CLOSED:
            self.open_on.discard(link)
            self.peaks[link] = (message[2], message[3])
        elif tag == p.CALL_FAILED:
            if self.error is None:
                self.error = p.load_error(message[2], message[3], -1)
            self.stopping = True
        elif tag == p.VERIFIED:
            if (self.id, message[2]) in link.verifying:
                link.verifying.remove((self.id, message[2]))
            self.on_verified(message[2], message[3])
        return True

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
        """What the server said of a COMMIT whose worker died (``"unknown"`` if nobody could ask)."""
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

    def waiting(self) -> int:
        """Units pulled and not started yet: pending, or handed to a worker that has not started them."""
        begun = sum(1 for link, item, place, _ in self.where.values() if _begun(link, item, place))
        return len(self.pending) + len(self.where) - begun

    # -- the call's loop's side -----------------------------------------------------------------------

    async def wait(self) -> None:
        """Until a reader thread calls :meth:`wake` (at once if it did since the last wait)."""
        await anyio.wait_readable(self._wakeup)
        with contextlib.suppress(BlockingIOError):
            while self._wakeup.recv(4096):
                pass

    def close(self) -> None:
        self._wakeup.close()
        self._waker.close()

    def report(
        self, started: float, limit: int, loop_lag: LoopLag | None, input_error: BaseException | None
    ) -> RunReport[Any]:
        """The call's report, or what it owes its caller: the input's error, a worker's, or RunFailed."""
        elapsed = perf_counter() - started
        outcomes = sorted(self.outcomes, key=lambda outcome: outcome.index)
        latencies = sorted(outcome.latency_s for outcome in outcomes)
        succeeded = sum(1 for outcome in outcomes if outcome.error is None)
        lag_p99, lag_max = loop_lag.summary() if loop_lag is not None else (None, None)
        stats = RunStats(
            submitted=len(outcomes),
            succeeded=succeeded,
            failed=len(outcomes) - succeeded,
            elapsed_s=elapsed,
            throughput=len(outcomes) / elapsed if elapsed > 0 else 0.0,
            latency_p50_s=percentile(latencies, 0.50),
            latency_p95_s=percentile(latencies, 0.95),
            latency_p99_s=percentile(latencies, 0.99),
            latency_max_s=latencies[-1] if latencies else 0.0,
            peak_in_flight=sum(units for _, units in self.peaks.values()),
            peak_connections=sum(connections for connections, _ in self.peaks.values()),
            loop_lag_p99_s=lag_p99,
            loop_lag_max_s=lag_max,
            retried=sum(max(0, outcome.attempts - 1) for outcome in outcomes),
            limit_min=limit,
            limit_max=limit,
            limit_final=limit,
            limit_trace=((0.0, limit),),
            commits_verified=sum(1 for outcome in outcomes if outcome.commit_verified),
        )
        report = RunReport(outcomes, stats)
        if input_error is not None:
            raise input_error
        if self.error is not None:
            raise self.error
        if self.stop_on_failure and (failed := failures_error(report)) is not None:
            raise failed
        return report


def _begun(link: Link, item: bytes | None, place: int) -> bool:
    """Whether a handed unit has begun: its worker said so, or marked it so (read live: a snapshot)."""
    return item is None or link.mark(place) != p.MARK_HANDED


def _load_value(payload: bytes | None, index: int) -> tuple[Any, Exception | None]:
    """A committed unit's value, unpickled here; or the error that says it could not be."""
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
