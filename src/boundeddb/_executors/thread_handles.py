"""
A thread worker's handle: how a cancellation or a timeout reaches the unit its thread runs.

The event loop and the statement deadlines' thread call a handle while the worker thread runs its
attempts; a lock keeps the two sides consistent. See "Sync units: lanes and handles" in
``docs/explanation/architecture.md``.
"""

from __future__ import annotations

import math
import threading
from time import perf_counter
from typing import Any, Protocol

from .._core.limiter import Slot
from .._core.pacing import Worker
from .._dialects import Dialect
from .deadlines import StatementDeadlines
from .script import DeadlinePassed, Stopped

__all__ = ["CANCEL_AGAIN_S", "CallerSide", "Handle", "Stopped", "ThreadWorker"]

_IDLE, _CONNECTING, _RUNNING, _COMMITTING = range(4)

#: While a cancelled run's units still run statements, how often their cancellation is sent again.
CANCEL_AGAIN_S = 0.1


class Handle:
    """The guard of one worker's attempts in threads, and how a cancellation or a timeout reaches them."""

    __slots__ = (
        "__weakref__",
        "_dbapi",
        "_deadlines",
        "_dialect",
        "_lock",
        "_state",
        "_stopping_statement",
        "cancelled",
        "deadline",
        "timed_out",
    )

    def __init__(self, dialect: Dialect, deadlines: StatementDeadlines | None = None) -> None:
        self._dialect = dialect
        self._lock = threading.Lock()
        self._state = _IDLE
        self._dbapi: Any = None
        #: A cancellation was sent, or is on its way, to the statement of this attempt's connection.
        self._stopping_statement = False
        self.cancelled = False
        #: The ``perf_counter()`` when this attempt's statement is stopped; ``inf``: never.
        self.deadline = math.inf
        #: The attempt is past its deadline: it fails with UnitTimeout, never commits.
        self.timed_out = False
        self._deadlines = deadlines
        if deadlines is not None:
            deadlines.adopt(self)

    # -- the guard, in the worker thread ---------------------------------------------------------------

    def connecting(self) -> None:
        with self._lock:
            if self.cancelled:
                raise Stopped
            self._state, self.timed_out = _CONNECTING, False

    def running(self, dbapi_connection: Any) -> None:
        if self._state == _RUNNING and self._deadlines is None and not self.cancelled:
            return  # a batch's next unit, no deadline: nothing changes (a racing cancel stops the next step)
        with self._lock:
            if self.cancelled:
                raise Stopped
            self._state, self._dbapi = _RUNNING, dbapi_connection
        if (deadlines := self._deadlines) is not None:
            self.deadline = perf_counter() + deadlines.timeout
            deadlines.wake()

    def committing(self) -> None:
        with self._lock:
            if self.cancelled:  # cancelled while the unit ran: whatever it did after, roll back
                raise Stopped
            if self.timed_out:  # its statement was sent a KILL QUERY that may land on the COMMIT
                raise DeadlinePassed
            self._state, self._dbapi, self.deadline = (
                _COMMITTING,
                None,
                math.inf,
            )  # a COMMIT is not interrupted

    def closing(self) -> bool:
        """
        Whether the connection must be discarded: its statement's cancellation may still be on its way.

        Such a cancellation, psycopg's cancel request or MySQL's KILL QUERY from a side connection,
        would stop whatever statement the connection runs when it lands, another unit's if the
        connection went back to the pool.
        """
        with self._lock:
            self._state, self._dbapi, self.deadline = _IDLE, None, math.inf
            discard, self._stopping_statement = self._stopping_statement, False
            return discard

    def closed(self) -> None:
        pass

    # -- the run's cancellation, on the event loop, and the deadline, in the deadlines' thread -------

    def cancel(self) -> Any:
        """
        Mark the handle cancelled: the DBAPI connection whose statement must be stopped, if any.

        That connection is then discarded when the attempt ends. See :meth:`closing`.
        """
        with self._lock:
            self.cancelled = True
            if self._state != _RUNNING:
                return None
            self._stopping_statement = True
            return self._dbapi

    def time_out(self, now: float) -> Any:
        """
        If the attempt's statement is past its deadline: mark it timed out and return its DBAPI
        connection, whose statement is to be stopped, and again in :data:`CANCEL_AGAIN_S` if it still runs.
        """
        with self._lock:
            if self._state != _RUNNING or now < self.deadline:
                return None
            self.timed_out = self._stopping_statement = True
            self.deadline = now + CANCEL_AGAIN_S
            return self._dbapi


class CallerSide(Protocol):
    """The caller's task that runs a lone unit's attempts: ``thread_caller.CallerTeam``."""

    def hold(self, cancelled: BaseException) -> None:
        """Raise ``cancelled`` once the unit has settled; start nothing more."""


class ThreadWorker(Worker):
    __slots__ = ("handle", "in_caller")

    def __init__(self, slot: Slot, handle: Handle) -> None:
        super().__init__(slot)
        self.handle = handle
        #: Run in its caller's task, a lone unit's: its ``thread_caller.CallerTeam``; None in a team.
        self.in_caller: CallerSide | None = None
